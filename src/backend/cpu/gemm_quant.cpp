// Quantised projection weights (q8_0, q5_0, q4_0, q4_k): quantisation of weights and activations, and the
// integer dot-product kernels — AMX-INT8 tiles (from 4 activation rows), AVX-512 VNNI (vpdpbusd),
// AVX2 (vpmaddubsw) and scalar. quant.hpp
// states the formats and the arithmetic every kernel shares (so all give bit-identical results).
//
// Why integer dot products on quantised activations, not dequantise-and-FMA: a q4 weight
// dequantised to float costs a shift, a mask, a widening and a conversion before its FMA, about
// 3.5 cycles per 32 weights and 16 rows, which at batch 1 is already the memory's pace on this
// class of machine (the kernel would be compute-bound); vpdpbusd multiplies 4 × 16 bytes and sums
// in one instruction, so it costs far less than the weight stream at batch 1 and keeps batched
// decode and prefill ahead of the bf16 FMA kernel (one vpdpbusd does 64 multiply-adds, an FMA 16).
// q8_0 takes both activation parts (two vpdpbusd per weight chunk; AVX2 their int16 combination,
// one vpmaddwd per pair of weights), the 4-bit formats only the high one (quant.hpp says why):
// the second vpdpbusd bounded 4-bit prefill and batched decode on a 2-core machine (512-token
// prefill of the 0.8B shape 1.4–1.6× faster without it).
//
// vpdpbusd multiplies unsigned by signed bytes: the activation parts are the signed operand, the
// weights the unsigned one — q4_0 nibbles are stored as q + 8 ∈ [0, 15], q5_0's q + 16 ∈ [0, 31]
// as a nibble and a fifth bit (set into the byte by one masked add), q8 values are flipped to
// q + 128 by one xor per 64 bytes — and the offset times the block's sum of activation parts is
// subtracted from the int32 sum (exact); q4_k's nibbles are q ∈ [0, 15] already, its offset m a
// float term of its own. AVX2's vpmaddubsw saturates its 16-bit pair sums, which
// 255 · 127 · 2 would: q4's nibbles fit as they are (q5_0's too: 31 · 127 · 2 < 2¹⁵); q8 widens
// its weights to int16 and multiplies them with a = 254·h + l (vpmaddwd: 2 · 127 · 32385 fits an
// int32 lane), which gives q8_0's sum S in about half the instructions of taking h and l through
// vpmaddubsw with |q| and sign(x, q) apart (what bounded q8_0 prefill on AVX2: 4–8% slower than
// bf16 with the two parts apart).

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "quant.hpp"
#include "gdn/core/error.hpp"

#include "gemm_internal.hpp"

#if GDN_X86
#include <cpuid.h>
#include <immintrin.h>
#define GDN_T_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only: clang has no such warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace gdn::cpu {
namespace {

constexpr float low_part_weight = 1.0f / 254.0f;  // t = S · (1/254) ≈ H + L / 254 (quant.hpp)

constexpr std::int64_t round_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b * b; }
// Bytes of a tile's integers (its 32 half scales follow): q5_0's are its nibbles, then its fifth bits.
constexpr std::int64_t int_bytes(QuantFormat f) { return f == QuantFormat::q8_0 ? 1024 : f == QuantFormat::q5_0 ? 640 : 512; }
constexpr std::int64_t q5_bits = 512;  // offset of q5_0's fifth bits in a tile
// What the unsigned operand of vpdpbusd holds above q, taken off as zero_point · Σh: q8_0's values
// flipped by an xor, q4_0's and q5_0's stored so; q4_k's nibbles are q itself.
constexpr int zero_point(QuantFormat f) {
  return f == QuantFormat::q8_0 ? 128 : f == QuantFormat::q4_0 ? 8 : f == QuantFormat::q5_0 ? 16 : 0;
}

using detail::round_even;

// float → IEEE half, round to nearest even (the scales: finite, ≥ 0 or ≤ 0; overflow saturates to
// the largest half, since a scale is never meant to be infinite).
std::uint16_t to_half(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (!(a == a)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 65504.0f) return static_cast<std::uint16_t>(sign | 0x7bffu);
  if (a < 6.103515625e-05f) {  // subnormal half: multiples of 2⁻²⁴
    const auto m = static_cast<std::uint32_t>(round_even(a * 16777216.0f));
    return static_cast<std::uint16_t>(sign | m);
  }
  const std::uint32_t au = std::bit_cast<std::uint32_t>(a);
  std::uint32_t exp = (au >> 23) - 112u, man = au & 0x7fffffu;
  std::uint32_t h = (exp << 10) | (man >> 13);
  const std::uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: still right
  return static_cast<std::uint16_t>(sign | std::min<std::uint32_t>(h, 0x7bffu));
}

float weight_at(const TensorView& W, std::int64_t n, std::int64_t k) {
  const std::int64_t in = W.dim(1);
  switch (W.dtype) {
    case DType::bf16: return to_float(W.as<bf16>()[n * in + k]);
    case DType::f16: return to_float(W.as<f16>()[n * in + k]);
    case DType::f32: return W.as<float>()[n * in + k];
    default: return 0.0f;
  }
}

// Where (row n of a group, column j of a block) lives in a tile: byte, and for q4 the nibble.
inline std::int64_t tile_byte(QuantFormat f, std::int64_t n, std::int64_t j) {
  const std::int64_t p = n / 16, r = n % 16;
  const std::int64_t g = f == QuantFormat::q8_0 ? j / 4 : (j % 16) / 4;
  return g * 128 + p * 64 + r * 4 + j % 4;
}
inline bool high_nibble(std::int64_t j) { return j >= 16; }
// q5_0: the offset in a tile of the fifth bits' masks of its chunk (g, p), 16 bytes: the low
// nibbles' 8, then the high nibbles'; bit 4r + j % 4 of a mask is byte 4r + j % 4 of the chunk
// (r = n % 16).
inline std::int64_t q5_masks(std::int64_t g, std::int64_t p) { return q5_bits + (2 * g + p) * 16; }
// The byte of those masks that holds (row n, column j), and the bit in it.
inline std::int64_t q5_bit_byte(std::int64_t n, std::int64_t j) {
  const std::int64_t bit = 4 * (n % 16) + j % 4;
  return q5_masks((j % 16) / 4, n / 16) + (high_nibble(j) ? 8 : 0) + bit / 8;
}
inline int q5_bit_shift(std::int64_t n, std::int64_t j) { return static_cast<int>((4 * (n % 16) + j % 4) % 8); }

inline int tile_q(QuantFormat f, const std::uint8_t* t, std::int64_t n, std::int64_t j) {
  const std::uint8_t b = t[tile_byte(f, n, j)];
  if (f == QuantFormat::q8_0) return static_cast<std::int8_t>(b);
  const int nibble = high_nibble(j) ? b >> 4 : b & 0xF;
  const int fifth = f == QuantFormat::q5_0 ? (t[q5_bit_byte(n, j)] >> q5_bit_shift(n, j)) & 1 : 0;
  return nibble + 16 * fifth - zero_point(f);
}
inline float half_at(const std::uint8_t* p, std::int64_t i) {
  std::uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return to_float(f16{h});
}
inline float tile_scale(QuantFormat f, const std::uint8_t* t, std::int64_t n) { return half_at(t + int_bytes(f), n); }

// q4_k: a group's super-block scales follow its tiles, per super-block 32 half D then 32 half M;
// a tile's sc bytes follow its nibbles, then its mn bytes.
constexpr std::int64_t q4k_tile_bytes = 576, q4k_super_bytes = 128, q4k_super_blocks = 8;
constexpr std::int64_t q4k_sc = 512, q4k_mn = 544;  // offsets in a tile
inline std::int64_t q4k_super_offset(std::int64_t kb, std::int64_t b) {
  return kb * q4k_tile_bytes + b / q4k_super_blocks * q4k_super_bytes;
}
inline const std::uint8_t* q4k_super(const std::uint8_t* group, std::int64_t kb, std::int64_t b) {
  return group + q4k_super_offset(kb, b);
}
// Block b's d and m for row n of a group (exact products: see quant.hpp).
inline void q4k_block_dm(const std::uint8_t* group, std::int64_t kb, std::int64_t b, std::int64_t n, float& d, float& m) {
  const std::uint8_t* t = group + b * q4k_tile_bytes;
  const std::uint8_t* sup = q4k_super(group, kb, b);
  d = half_at(sup, n) * static_cast<float>(t[q4k_sc + n]);
  m = half_at(sup + 64, n) * static_cast<float>(t[q4k_mn + n]);
}
// A q4_k group's super-block scales, after its kb tiles.
inline std::int64_t q4k_scale_bytes(std::int64_t kb) { return (kb + q4k_super_blocks - 1) / q4k_super_blocks * q4k_super_bytes; }
inline std::int64_t group_bytes(QuantFormat f, std::int64_t kb) {
  return kb * (int_bytes(f) + 64) + (f == QuantFormat::q4_k ? q4k_scale_bytes(kb) : 0);
}
// q4_k's super-block scales sit after the group's tiles, away from the stream the kernels read, so
// the hardware prefetchers never fetch them: each was a miss the block's epilogue waited for, four
// per group of a 1024-column weight (the q4_k kernel streamed 0.78× a plain read from memory at
// one row, two threads; q4_0 0.95×). The kernels ask for the next group's scales as they start a
// group (a prefetch never faults, past the image's end too).
inline void prefetch_next_q4k_scales(const std::uint8_t* group, std::int64_t kb) {
  const std::uint8_t* next = q4k_super(group + group_bytes(QuantFormat::q4_k, kb), kb, 0);
  for (std::int64_t o = 0; o < q4k_scale_bytes(kb); o += 64) __builtin_prefetch(next + o);
}

// One row's parts of the quantised activations.
struct ActRow {
  const std::int8_t* hi;
  const std::int8_t* lo;
  const float* scale;
  const std::int32_t* sums;   // [block][2]: Σh, Σl
  const std::int16_t* wide;   // a = 254·h + l
};
// Offset of a row's int16 combinations (quant.hpp's layout).
constexpr std::int64_t wide_offset(std::int64_t kp) { return round_up(2 * kp + kp / 32 * 12, 64); }
inline ActRow act_row(const QuantActivations& x, std::int64_t r) {
  const std::byte* p = x.data + r * x.stride;
  return ActRow{reinterpret_cast<const std::int8_t*>(p), reinterpret_cast<const std::int8_t*>(p + x.kp),
                reinterpret_cast<const float*>(p + 2 * x.kp),
                reinterpret_cast<const std::int32_t*>(p + 2 * x.kp + x.kp / 32 * 4),
                reinterpret_cast<const std::int16_t*>(p + wide_offset(x.kp))};
}

// The shared epilogue of a block for one lane: see quant.hpp. q8_0 from its sum S = 254·H + L, and
// the high part alone (the 4-bit formats).
inline std::int32_t combined_sum(std::int32_t H, std::int32_t L) { return 254 * H + L; }
inline float block_step(std::int32_t S, float s, float d, float acc) {
  const float t = static_cast<float>(S) * low_part_weight;
  return std::fma(d, t * s, acc);
}
inline float block_step_high(std::int32_t H, float s, float d, float acc) {
  return std::fma(d, static_cast<float>(H) * s, acc);
}
// q4_k's offset term's activation factor for one row and block, Σh · s (quant.hpp); every kernel
// computes it with these scalar operations, then acc = fma(−m, Σh · s, acc) per lane.
inline float offset_factor(const ActRow& a, std::int64_t b) { return static_cast<float>(a.sums[2 * b]) * a.scale[b]; }

// How far ahead of the weight stream a kernel prefetches (0: not at all), and into which cache.
// Measured at batch-1 decode of the 0.8B shape on two cores: on an Intel AMX host 2 KiB ahead into
// L1 took q8_0 from 75% to 83% of the roofline and q4_0 from 64% to 68% (8 KiB and more were
// slower than none). On an AMD Zen 4 host the hardware prefetchers keep up with the VNNI q8_0 and
// q4_0 kernels on their own, and software prefetches only took L1 miss buffers from the demand
// loads: without them 46.7 against 35.1 tok/s at q8_0 and 58.4 against 51.4 at q4_0 (medians of
// four alternating rounds). There, two threads at one row over a 113 MB image stream 0.95–1.1× a
// plain read of it with the VNNI q4_0 and q8_0 kernels, where VNNI q4_k — its epilogue about a
// third more instructions per block — streamed 0.71–0.76×, and 0.83–0.85× with the stream
// prefetched 18 KiB ahead into L2 (T0 at 1–9 KiB, T1 or T2 at 4–72 KiB were no better; for q8_0
// and q4_0 it cost 5–20%); the AVX2 kernels (GDN_CPU_KERNEL=avx2) q4_k 0.49–0.57× → 0.77×, q8_0
// 0.91× → 0.95× with it, q4_0 0.98× without. Other vendors are treated as AMD's; the AVX2 kernels
// on Intel CPUs were not measured and do not prefetch. A property of the machine, read once.
struct StreamPrefetch {
  std::int64_t ahead = 0;  // bytes
  bool to_l2 = false;      // _MM_HINT_T2, else _MM_HINT_T0
};
[[maybe_unused]] StreamPrefetch stream_prefetch(QuantKernel k, QuantFormat f) {
  static const bool intel = [] {
#if GDN_X86
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
    return ebx == 0x756e6547u && edx == 0x49656e69u && ecx == 0x6c65746eu;  // "GenuineIntel"
#else
    return false;
#endif
  }();
  constexpr StreamPrefetch l2_far{18432, true};
  if (k == QuantKernel::avx2)
    return !intel && (f == QuantFormat::q4_k || f == QuantFormat::q8_0) ? l2_far : StreamPrefetch{};
  if (intel) return {2048, false};
  return f == QuantFormat::q4_k ? l2_far : StreamPrefetch{};
}
// Prefetches the tile `pf.ahead` bytes past tile t (tb bytes), line by line (locality 1 is T2, 3 T0).
inline void prefetch_tile(const std::uint8_t* t, std::int64_t tb, StreamPrefetch pf) {
  for (std::int64_t o = 0; o < tb; o += 64) {
    const std::uint8_t* p = t + pf.ahead + o;
    if (pf.to_l2) __builtin_prefetch(p, 0, 1);
    else __builtin_prefetch(p, 0, 3);
  }
}

// ------------------------------------------------------------------------------------------------
// Scalar.

void scalar_range(QuantFormat f, const std::uint8_t* image, std::int64_t kb, std::int64_t out, std::int64_t n0,
                  std::int64_t n1, const QuantActivations& x, std::int64_t rows, float* y, std::int64_t ldy) {
  const std::int64_t tb = quant_tile_bytes(f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const ActRow a = act_row(x, r);
    for (std::int64_t n = n0; n < std::min(n1, out); ++n) {
      const std::uint8_t* group = image + (n / 32) * group_bytes(f, kb);
      float acc = 0.0f;
      for (std::int64_t b = 0; b < kb; ++b) {
        const std::uint8_t* t = group + b * tb;
        // The parts apart, as the byte dot-product kernels take them: AVX2's sum from the int16
        // combinations is checked against this one bit for bit (test_quant).
        std::int32_t H = 0, L = 0;
        for (std::int64_t j = 0; j < 32; ++j) {
          const int q = tile_q(f, t, n % 32, j);
          H += q * a.hi[32 * b + j];
          if (uses_low_part(f)) L += q * a.lo[32 * b + j];
        }
        if (f == QuantFormat::q4_k) {
          float d, m;
          q4k_block_dm(group, kb, b, n % 32, d, m);
          acc = std::fma(-m, offset_factor(a, b), block_step_high(H, a.scale[b], d, acc));
        } else if (uses_low_part(f)) {
          acc = block_step(combined_sum(H, L), a.scale[b], tile_scale(f, t, n % 32), acc);
        } else {
          acc = block_step_high(H, a.scale[b], tile_scale(f, t, n % 32), acc);
        }
      }
      y[r * ldy + n] = acc;
    }
  }
}

#if GDN_X86
// ------------------------------------------------------------------------------------------------
// AVX2: one activation row at a time over a group's tile, 8 rows of the group per ymm.

#define GDN_T_AVX2Q __attribute__((target("avx2,fma,f16c")))

// q5_0: 32 fifth bits (a little-endian word of a mask, quant.hpp) as bytes of 16 or 0, byte k
// from bit k: each byte picks its word byte, then tests its bit.
GDN_T_AVX2Q inline __m256i fifth_bits_avx2(const std::uint8_t* p) {
  std::int32_t w;
  std::memcpy(&w, p, 4);
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<std::int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(w), pick), bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// 8 bytes (q4_k's sc or mn of 8 rows) as floats.
GDN_T_AVX2Q inline __m256 u8_to_ps_avx2(const std::uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <QuantFormat F>
GDN_T_AVX2Q void avx2_range(const std::uint8_t* image, std::int64_t kb, std::int64_t out, std::int64_t n0, std::int64_t n1,
                            const QuantActivations& x, std::int64_t rows, float* y, std::int64_t ldy) {
  const std::int64_t tb = quant_tile_bytes(F);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const StreamPrefetch prefetch = stream_prefetch(QuantKernel::avx2, F);
  for (std::int64_t n = n0; n < n1; n += 32) {
    const std::uint8_t* group = image + (n / 32) * group_bytes(F, kb);
    const std::int64_t valid = std::min<std::int64_t>(32, out - n);
    if constexpr (F == QuantFormat::q4_k) prefetch_next_q4k_scales(group, kb);
    for (std::int64_t r = 0; r < rows; ++r) {
      const ActRow a = act_row(x, r);
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      [[maybe_unused]] __m256 D[4], M[4];  // q4_k: the current super-block's D and M, 32 rows
      for (std::int64_t b = 0; b < kb; ++b) {
        const std::uint8_t* t = group + b * tb;
        if (prefetch.ahead > 0 && r == 0) prefetch_tile(t, tb, prefetch);  // the first row's sweep reads from memory
        if constexpr (F == QuantFormat::q4_k)
          if (b % q4k_super_blocks == 0) {
            const std::uint8_t* sup = q4k_super(group, kb, b);
            for (int i = 0; i < 4; ++i) {
              D[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + 16 * i)));
              M[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + 64 + 16 * i)));
            }
          }
        __m256i H[4];  // per row of the group: q8_0's S, the 4-bit formats' H (quant.hpp)
        for (int i = 0; i < 4; ++i) H[i] = _mm256_setzero_si256();
        const std::int8_t* xh = a.hi + 32 * b;
        if constexpr (F == QuantFormat::q8_0) {
          // A slice of 32 bytes (rows 8i .. 8i + 7, columns 4g .. 4g + 3) widens to two int16
          // vectors of 4 rows each; vpmaddwd against the 4 columns' a leaves two int32 lanes per
          // row (columns 4g, 4g + 1 and 4g + 2, 4g + 3), summed over the block in A (rows 8i ..
          // 8i + 3) and B (8i + 4 .. 8i + 7), then pairwise by one vphaddd.
          __m256i A[4], B[4];
          for (int i = 0; i < 4; ++i) A[i] = B[i] = _mm256_setzero_si256();
          const std::int16_t* xa = a.wide + 32 * b;
          for (int g = 0; g < 8; ++g) {
            std::int64_t a4;
            std::memcpy(&a4, xa + 4 * g, 8);
            const __m256i va = _mm256_set1_epi64x(a4);
            for (int i = 0; i < 4; ++i) {
              const std::uint8_t* w = t + g * 128 + i * 32;
              const __m256i w03 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
              const __m256i w47 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
              A[i] = _mm256_add_epi32(A[i], _mm256_madd_epi16(w03, va));
              B[i] = _mm256_add_epi32(B[i], _mm256_madd_epi16(w47, va));
            }
          }
          // vphaddd works in 128-bit halves: rows 0, 1, 4, 5 | 2, 3, 6, 7; the permute restores the order.
          for (int i = 0; i < 4; ++i) H[i] = _mm256_permute4x64_epi64(_mm256_hadd_epi32(A[i], B[i]), 0xD8);
        } else {
          // vpmaddubsw's pair sums are added as int16 over several chunks before one vpmaddwd
          // widens them: |pair| ≤ 2 · 15 · 127 = 3810 for 4-bit values, so all 8 of a block fit
          // (30480 < 2¹⁵); q5_0's ≤ 2 · 31 · 127 = 7874, so 4 (31496). Exact, 2 of 9 instructions
          // per 64 weights fewer: what bounds the sweeps of prefill and batched decode (batch 1
          // streams at about a plain read's pace either way).
          constexpr int chunks_per_widen = F == QuantFormat::q5_0 ? 2 : 4;  // g steps, two pair sums each
          __m256i P[4];
          for (int i = 0; i < 4; ++i) P[i] = _mm256_setzero_si256();
          for (int g = 0; g < 4; ++g) {  // the high part only (quant.hpp)
            std::int32_t ha, hb;
            std::memcpy(&ha, xh + 4 * g, 4);
            std::memcpy(&hb, xh + 16 + 4 * g, 4);
            const __m256i vha = _mm256_set1_epi32(ha), vhb = _mm256_set1_epi32(hb);
            for (int i = 0; i < 4; ++i) {
              const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + g * 128 + i * 32));
              __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
              if constexpr (F == QuantFormat::q5_0) {  // this slice's half of chunk (g, i / 2)'s masks
                const std::uint8_t* m = t + q5_masks(g, i / 2) + 4 * (i % 2);
                lo = _mm256_or_si256(lo, fifth_bits_avx2(m));
                hi = _mm256_or_si256(hi, fifth_bits_avx2(m + 8));
              }
              P[i] = _mm256_add_epi16(P[i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, vha), _mm256_maddubs_epi16(hi, vhb)));
              if ((g + 1) % chunks_per_widen == 0) {
                H[i] = _mm256_add_epi32(H[i], _mm256_madd_epi16(P[i], _mm256_set1_epi16(1)));
                P[i] = _mm256_setzero_si256();
              }
            }
          }
          if constexpr (F == QuantFormat::q4_0 || F == QuantFormat::q5_0) {
            const __m256i zh = _mm256_set1_epi32(zero_point(F) * a.sums[2 * b]);
            for (int i = 0; i < 4; ++i) H[i] = _mm256_sub_epi32(H[i], zh);
          }
        }
        const __m256 s = _mm256_set1_ps(a.scale[b]), c = _mm256_set1_ps(low_part_weight);
        [[maybe_unused]] __m256 z;  // q4_k: the block's offset factor, one per row and block
        if constexpr (F == QuantFormat::q4_k) z = _mm256_set1_ps(offset_factor(a, b));
        for (int i = 0; i < 4; ++i) {
          const __m256 tt = uses_low_part(F) ? _mm256_mul_ps(_mm256_cvtepi32_ps(H[i]), c) : _mm256_cvtepi32_ps(H[i]);
          if constexpr (F == QuantFormat::q4_k) {
            const __m256 d = _mm256_mul_ps(D[i], u8_to_ps_avx2(t + q4k_sc + 8 * i));
            const __m256 m = _mm256_mul_ps(M[i], u8_to_ps_avx2(t + q4k_mn + 8 * i));
            acc[i] = _mm256_fmadd_ps(d, _mm256_mul_ps(tt, s), acc[i]);
            acc[i] = _mm256_fnmadd_ps(m, z, acc[i]);
          } else {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + int_bytes(F) + 16 * i)));
            acc[i] = _mm256_fmadd_ps(d, _mm256_mul_ps(tt, s), acc[i]);
          }
        }
      }
      alignas(32) float o[32];
      for (int i = 0; i < 4; ++i) _mm256_store_ps(o + 8 * i, acc[i]);
      std::memcpy(y + r * ldy + n, o, static_cast<std::size_t>(valid) * sizeof(float));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// AVX-512 VNNI: R activation rows at a time over a group's tiles, 16 rows of the group per zmm.

// The shared epilogue of one block (quant.hpp) for 16 output lanes: exact sums H and L (the zero
// point already taken off), combined into S = 254·H + L, the activation scale s and the weight
// scales d. Every AVX-512 path (VNNI, AMX-INT8) calls this, so their results are the same bits by
// construction.
GDN_T_VNNI inline __m512 block_step16(__m512i H, __m512i L, __m512 s, __m512 d, __m512 acc) {
  const __m512i S = _mm512_add_epi32(_mm512_mullo_epi32(H, _mm512_set1_epi32(254)), L);
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(S), _mm512_set1_ps(low_part_weight));
  return _mm512_fmadd_ps(d, _mm512_mul_ps(t, s), acc);
}
// The same for the high part alone (the 4-bit formats; block_step_high).
GDN_T_VNNI inline __m512 block_step16_high(__m512i H, __m512 s, __m512 d, __m512 acc) {
  return _mm512_fmadd_ps(d, _mm512_mul_ps(_mm512_cvtepi32_ps(H), s), acc);
}

// 8 bytes of q5_0's fifth bits as a byte mask.
GDN_T_VNNI inline __mmask64 load_mask64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return _cvtu64_mask64(v);
}

// 16 bytes (q4_k's sc or mn of 16 rows) as floats.
GDN_T_VNNI inline __m512 u8_to_ps16(const std::uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <QuantFormat F, int R>
GDN_T_VNNI void vnni_tile(const std::uint8_t* group, std::int64_t kb, const ActRow* a, float* y, std::int64_t ldy,
                          std::int64_t valid, StreamPrefetch prefetch) {
  constexpr std::int64_t ib = int_bytes(F), tb = ib + 64;
  constexpr int zp = zero_point(F);
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), nib = _mm512_set1_epi8(0x0F);
  [[maybe_unused]] __m512 D0, D1, M0, M1;  // q4_k: the current super-block's D and M, 32 rows
  if constexpr (F == QuantFormat::q4_k) prefetch_next_q4k_scales(group, kb);
  // The weight stream is prefetched where that measured faster (stream_prefetch; a range is
  // one sequential stream, so this runs on into the next group; a prefetch never faults).
  for (std::int64_t b = 0; b < kb; ++b) {
    const std::uint8_t* t = group + b * tb;
    if (prefetch.ahead > 0) prefetch_tile(t, tb, prefetch);
    [[maybe_unused]] __m512i H0[R], H1[R], L0[R], L1[R];  // L: q8_0 only
    for (int r = 0; r < R; ++r) H0[r] = H1[r] = L0[r] = L1[r] = _mm512_setzero_si512();
    // q4 at one or two rows: the high nibbles' products in chains of their own, so the two
    // dependent vpdpbusd chains of a block become four of half the length, and the high nibbles
    // stay in place (16·q, still a byte: one mask and no shift per 64 bytes), their chains' sums
    // shifted down once per block — exact int32 sums, so the same result. At one or two rows the
    // nibbles' unpacking, not the products, is most of the instructions. More rows have
    // independent chains already and share each unpacking. q5_0's fifth bit would take 16·q past
    // a byte: it unpacks as the rows below do.
    constexpr bool split = (F == QuantFormat::q4_0 || F == QuantFormat::q4_k) && R <= 2;
    [[maybe_unused]] __m512i H0b[R], H1b[R];
    if constexpr (split)
      for (int r = 0; r < R; ++r) H0b[r] = H1b[r] = _mm512_setzero_si512();
    if constexpr (F == QuantFormat::q8_0) {
      for (int g = 0; g < 8; ++g) {
        const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(t + g * 128), flip);
        const __m512i w1 = _mm512_xor_si512(_mm512_loadu_si512(t + g * 128 + 64), flip);
        for (int r = 0; r < R; ++r) {
          std::int32_t h4, l4;
          std::memcpy(&h4, a[r].hi + 32 * b + 4 * g, 4);
          std::memcpy(&l4, a[r].lo + 32 * b + 4 * g, 4);
          const __m512i vh = _mm512_set1_epi32(h4), vl = _mm512_set1_epi32(l4);
          H0[r] = _mm512_dpbusd_epi32(H0[r], w0, vh);
          H1[r] = _mm512_dpbusd_epi32(H1[r], w1, vh);
          L0[r] = _mm512_dpbusd_epi32(L0[r], w0, vl);
          L1[r] = _mm512_dpbusd_epi32(L1[r], w1, vl);
        }
      }
    } else {
      for (int g = 0; g < 4; ++g) {  // the high part only (quant.hpp)
        const __m512i v0 = _mm512_loadu_si512(t + g * 128), v1 = _mm512_loadu_si512(t + g * 128 + 64);
        __m512i lo0 = _mm512_and_si512(v0, nib), lo1 = _mm512_and_si512(v1, nib);
        __m512i hi0, hi1;
        if constexpr (split) {
          hi0 = _mm512_andnot_si512(nib, v0);
          hi1 = _mm512_andnot_si512(nib, v1);
        } else {
          hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), nib);
          hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), nib);
        }
        if constexpr (F == QuantFormat::q5_0) {  // + 16 where the fifth bit is set
          const std::uint8_t *m0 = t + q5_masks(g, 0), *m1 = t + q5_masks(g, 1);
          const __m512i sixteen = _mm512_set1_epi8(16);
          lo0 = _mm512_mask_add_epi8(lo0, load_mask64(m0), lo0, sixteen);
          hi0 = _mm512_mask_add_epi8(hi0, load_mask64(m0 + 8), hi0, sixteen);
          lo1 = _mm512_mask_add_epi8(lo1, load_mask64(m1), lo1, sixteen);
          hi1 = _mm512_mask_add_epi8(hi1, load_mask64(m1 + 8), hi1, sixteen);
        }
        for (int r = 0; r < R; ++r) {
          std::int32_t ha, hb;
          std::memcpy(&ha, a[r].hi + 32 * b + 4 * g, 4);
          std::memcpy(&hb, a[r].hi + 32 * b + 16 + 4 * g, 4);
          const __m512i vha = _mm512_set1_epi32(ha), vhb = _mm512_set1_epi32(hb);
          if constexpr (split) {
            H0[r] = _mm512_dpbusd_epi32(H0[r], lo0, vha);
            H1[r] = _mm512_dpbusd_epi32(H1[r], lo1, vha);
            H0b[r] = _mm512_dpbusd_epi32(H0b[r], hi0, vhb);
            H1b[r] = _mm512_dpbusd_epi32(H1b[r], hi1, vhb);
          } else {
            H0[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(H0[r], lo0, vha), hi0, vhb);
            H1[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(H1[r], lo1, vha), hi1, vhb);
          }
        }
      }
      if constexpr (split)
        for (int r = 0; r < R; ++r) {  // Σ (16·q)·h is a multiple of 16: the shift is exact
          H0[r] = _mm512_add_epi32(H0[r], _mm512_srai_epi32(H0b[r], 4));
          H1[r] = _mm512_add_epi32(H1[r], _mm512_srai_epi32(H1b[r], 4));
        }
    }
    if constexpr (F == QuantFormat::q4_k) {
      if (b % q4k_super_blocks == 0) {
        const std::uint8_t* sup = q4k_super(group, kb, b);
        D0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup)));
        D1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 32)));
        M0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 64)));
        M1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 96)));
      }
      const __m512 d0 = _mm512_mul_ps(D0, u8_to_ps16(t + q4k_sc)), d1 = _mm512_mul_ps(D1, u8_to_ps16(t + q4k_sc + 16));
      const __m512 m0 = _mm512_mul_ps(M0, u8_to_ps16(t + q4k_mn)), m1 = _mm512_mul_ps(M1, u8_to_ps16(t + q4k_mn + 16));
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_set1_ps(a[r].scale[b]), z = _mm512_set1_ps(offset_factor(a[r], b));
        acc0[r] = _mm512_fnmadd_ps(m0, z, block_step16_high(H0[r], s, d0, acc0[r]));
        acc1[r] = _mm512_fnmadd_ps(m1, z, block_step16_high(H1[r], s, d1, acc1[r]));
      }
    } else {
      const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + ib)));
      const __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + ib + 32)));
      for (int r = 0; r < R; ++r) {
        const __m512i zh = _mm512_set1_epi32(zp * a[r].sums[2 * b]);
        const __m512 s = _mm512_set1_ps(a[r].scale[b]);
        if constexpr (F == QuantFormat::q8_0) {
          const __m512i zl = _mm512_set1_epi32(zp * a[r].sums[2 * b + 1]);
          acc0[r] = block_step16(_mm512_sub_epi32(H0[r], zh), _mm512_sub_epi32(L0[r], zl), s, d0, acc0[r]);
          acc1[r] = block_step16(_mm512_sub_epi32(H1[r], zh), _mm512_sub_epi32(L1[r], zl), s, d1, acc1[r]);
        } else {
          acc0[r] = block_step16_high(_mm512_sub_epi32(H0[r], zh), s, d0, acc0[r]);
          acc1[r] = block_step16_high(_mm512_sub_epi32(H1[r], zh), s, d1, acc1[r]);
        }
      }
    }
  }
  const std::int64_t v0 = std::clamp<std::int64_t>(valid, 0, 16), v1 = std::clamp<std::int64_t>(valid - 16, 0, 16);
  const auto m0 = static_cast<__mmask16>((1u << v0) - 1u), m1 = static_cast<__mmask16>((1u << v1) - 1u);
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, acc0[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, acc1[r]);
  }
}

template <QuantFormat F>
void vnni_range(const std::uint8_t* image, std::int64_t kb, std::int64_t out, std::int64_t n0, std::int64_t n1,
                const QuantActivations& x, std::int64_t rows, float* y, std::int64_t ldy) {
  constexpr int max_rows = 4;
  using Tile = void (*)(const std::uint8_t*, std::int64_t, const ActRow*, float*, std::int64_t, std::int64_t, StreamPrefetch);
  static constexpr Tile tiles[max_rows + 1] = {nullptr, vnni_tile<F, 1>, vnni_tile<F, 2>, vnni_tile<F, 3>, vnni_tile<F, 4>};
  const StreamPrefetch prefetch = stream_prefetch(QuantKernel::avx512vnni, F);
  for (std::int64_t n = n0; n < n1; n += 32) {
    const std::uint8_t* group = image + (n / 32) * group_bytes(F, kb);
    const std::int64_t valid = std::min<std::int64_t>(32, out - n);
    for (std::int64_t r = 0; r < rows; r += max_rows) {
      const int R = static_cast<int>(std::min<std::int64_t>(max_rows, rows - r));
      ActRow a[max_rows];
      for (int i = 0; i < R; ++i) a[i] = act_row(x, r + i);
      // Only the first sweep of a group reads it from memory; later ones find it in L1/L2.
      tiles[R](group, kb, a, y + r * ldy + n, ldy, valid, r == 0 ? prefetch : StreamPrefetch{});
    }
  }
}
#endif

#if GDN_X86
// ------------------------------------------------------------------------------------------------
// AMX-INT8, for calls of several activation rows (batched decode, MTP verification, prefill): up
// to 16 rows' parts are the A tiles (rows × 32 bytes of k: one block), a 16-row panel's block of
// weights a B tile (8 rows of k quads × 16 rows × 4 bytes: exactly the image's 64-byte chunks, at
// a stride of 128), and one tile product per (part, panel) gives the int32 sums H and L of 16 rows
// × 16 outputs. q8 is signed × signed (tdpbssd: no zero point); q4's nibbles are spread into bytes
// (q + 8) first and go through tdpbsud (signed activations × unsigned weights), less 8 · Σh.
// The sums are exact, so they are the VNNI kernel's, and the float epilogue below is its epilogue
// operation for operation: the result is bit-identical to VNNI's (and scalar's) whichever path a
// call's row count takes, and batch invariance holds across the switch. One tile product replaces
// 16 rows × 8 vpdpbusd (q8) and the epilogue is then what costs: it runs once per block per row. q4
// takes the high part alone (tiles 1, 6 and 7 unused), as every kernel does.
// On the 0.8B shape (2 cores) it took 512-token prefill from 163 / 173 tok/s (q8_0 / q4_0, VNNI)
// to 249 / 227, and batch-16 decode from 105 / 126 to 149 / 178 tok/s.

#define GDN_T_AMXQ __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,amx-tile,amx-int8")))

constexpr std::int64_t amx_min_rows = 4;  // below this the VNNI kernel (no tile set-up) is faster

// Tiles: 0, 1 the activations' high and low parts; 2, 3 the weights of panels 0 and 1; 4, 5 H and
// 6, 7 L (q8_0) of panels 0 and 1.
GDN_T_AMXQ void amx_int8_configure(int m) {
  detail::TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<std::uint8_t>(t == 2 || t == 3 ? 8 : m);
    c.colsb[t] = static_cast<std::uint16_t>(t < 2 ? 32 : 64);
  }
  _tile_loadconfig(&c);
}

// q4: block t's nibbles spread into bytes, per panel: row g < 4 holds k quad g (the low nibbles of
// chunk g), row 4 + g the quad 16 + 4g (the high nibbles).
GDN_T_AMXQ inline void spread_q4(const std::uint8_t* t, std::uint8_t (*out)[8][64]) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int g = 0; g < 4; ++g)
    for (int p = 0; p < 2; ++p) {
      const __m512i v = _mm512_loadu_si512(t + g * 128 + p * 64);
      _mm512_store_si512(out[p][g], _mm512_and_si512(v, nib));
      _mm512_store_si512(out[p][4 + g], _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
    }
}

// The shared epilogue (quant.hpp) of block b (tile t) for a chunk's m rows, from its stored sums.
template <QuantFormat F>
GDN_T_AMXQ inline void amx_int8_epilogue(const std::uint8_t* t, const std::int32_t (*sb)[16][16], const ActRow* a, int m,
                                         std::int64_t b, float (*acc)[32]) {
  constexpr std::int64_t ib = F == QuantFormat::q8_0 ? 1024 : 512;
  const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + ib)));
  const __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + ib + 32)));
  for (int r = 0; r < m; ++r) {
    __m512i H0 = _mm512_load_si512(sb[0][r]), H1 = _mm512_load_si512(sb[1][r]);
    const __m512 s = _mm512_set1_ps(a[r].scale[b]);
    if constexpr (F == QuantFormat::q8_0) {
      const __m512i L0 = _mm512_load_si512(sb[2][r]), L1 = _mm512_load_si512(sb[3][r]);
      _mm512_store_ps(acc[r], block_step16(H0, L0, s, d0, _mm512_load_ps(acc[r])));
      _mm512_store_ps(acc[r] + 16, block_step16(H1, L1, s, d1, _mm512_load_ps(acc[r] + 16)));
    } else {  // q4_0: the high part only, less the zero point
      const __m512i zh = _mm512_set1_epi32(zero_point(F) * a[r].sums[2 * b]);
      H0 = _mm512_sub_epi32(H0, zh);
      H1 = _mm512_sub_epi32(H1, zh);
      _mm512_store_ps(acc[r], block_step16_high(H0, s, d0, _mm512_load_ps(acc[r])));
      _mm512_store_ps(acc[r] + 16, block_step16_high(H1, s, d1, _mm512_load_ps(acc[r] + 16)));
    }
  }
}

template <QuantFormat F>
GDN_T_AMXQ void amx_int8_range(const std::uint8_t* image, std::int64_t kb, std::int64_t out, std::int64_t n0,
                               std::int64_t n1, const QuantActivations& x, std::int64_t rows, float* y, std::int64_t ldy) {
  constexpr std::int64_t tb = F == QuantFormat::q8_0 ? 1088 : 576;
  // The caller's tile configuration (the bf16 AMX kernel's, or none) is put back at the end.
  detail::TileConfig saved;
  _tile_storeconfig(&saved);
  // Software-pipelined by one block: the tile sums of block b are stored while the epilogue reads
  // those of block b − 1, and q4's spread bytes of block b + 1 are written while block b's are
  // loaded, so no load waits on a store just made (tile loads and stores do not forward).
  alignas(64) std::int32_t sums[2][4][16][16];  // [block parity] H p0, H p1, L p0, L p1: [row][output]
  alignas(64) std::uint8_t spread[2][2][8][64];  // q4: [block parity][panel]
  alignas(64) float acc[16][32];
  int configured = 0;
  // Chunks of 16 activation rows outside, groups of 32 weight rows inside: a chunk's parts stay in
  // L1 while the range's weights stream past (from memory for the first chunk, from L2 after);
  // the other order re-read every row's parts from L2 for each group, 16 rows apart, and the tile
  // loads of the activations stalled on them.
  for (std::int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int m = static_cast<int>(std::min<std::int64_t>(16, rows - r0));
    if (m != configured) {
      amx_int8_configure(m);
      configured = m;
    }
    ActRow a[16];
    for (int r = 0; r < m; ++r) a[r] = act_row(x, r0 + r);
    for (std::int64_t n = n0; n < n1; n += 32) {
      const std::uint8_t* group = image + (n / 32) * kb * tb;
      const std::int64_t valid = std::min<std::int64_t>(32, out - n);
      for (int r = 0; r < m; ++r) _mm512_store_ps(acc[r], _mm512_setzero_ps()), _mm512_store_ps(acc[r] + 16, _mm512_setzero_ps());
      if constexpr (F == QuantFormat::q4_0) spread_q4(group, spread[0]);
      for (std::int64_t b = 0; b < kb; ++b) {
        const std::uint8_t* t = group + b * tb;
        if constexpr (F == QuantFormat::q4_0)
          if (b + 1 < kb) spread_q4(t + tb, spread[(b + 1) & 1]);
        _tile_loadd(0, a[0].hi + 32 * b, x.stride);
        _tile_zero(4);
        _tile_zero(5);
        if constexpr (F == QuantFormat::q8_0) {  // both activation parts
          _tile_loadd(1, a[0].lo + 32 * b, x.stride);
          _tile_loadd(2, t, 128);
          _tile_loadd(3, t + 64, 128);
          _tile_zero(6);
          _tile_zero(7);
          _tile_dpbssd(4, 0, 2);
          _tile_dpbssd(5, 0, 3);
          _tile_dpbssd(6, 1, 2);
          _tile_dpbssd(7, 1, 3);
          _tile_stored(6, sums[b & 1][2], 64);
          _tile_stored(7, sums[b & 1][3], 64);
        } else {  // q4_0: the high part only (quant.hpp)
          _tile_loadd(2, spread[b & 1][0], 64);
          _tile_loadd(3, spread[b & 1][1], 64);
          _tile_dpbsud(4, 0, 2);
          _tile_dpbsud(5, 0, 3);
        }
        _tile_stored(4, sums[b & 1][0], 64);
        _tile_stored(5, sums[b & 1][1], 64);
        if (b > 0) amx_int8_epilogue<F>(group + (b - 1) * tb, sums[(b - 1) & 1], a, m, b - 1, acc);
      }
      amx_int8_epilogue<F>(group + (kb - 1) * tb, sums[(kb - 1) & 1], a, m, kb - 1, acc);
      const std::int64_t v0 = std::clamp<std::int64_t>(valid, 0, 16), v1 = std::clamp<std::int64_t>(valid - 16, 0, 16);
      const auto m0 = static_cast<__mmask16>((1u << v0) - 1u), m1 = static_cast<__mmask16>((1u << v1) - 1u);
      for (int r = 0; r < m; ++r) {
        _mm512_mask_storeu_ps(y + (r0 + r) * ldy + n, m0, _mm512_load_ps(acc[r]));
        _mm512_mask_storeu_ps(y + (r0 + r) * ldy + n + 16, m1, _mm512_load_ps(acc[r] + 16));
      }
    }
  }
  _tile_loadconfig(&saved);
}

// CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8 (asked directly, like the bf16 kernel's).
bool cpu_has_amx_int8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx & (1u << 24)) != 0 && (edx & (1u << 25)) != 0;
}
#endif

#if GDN_X86
// AVX2 + FMA + F16C (the half scales). F16C is CPUID leaf 1, ECX bit 29, asked directly because
// older compilers (clang 14) do not know "f16c" in __builtin_cpu_supports.
bool cpu_has_avx2_fma_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 29)) == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

QuantKernel detect_quant_kernel() {
  QuantKernel best = QuantKernel::scalar;
  for (QuantKernel k : {QuantKernel::amx_int8, QuantKernel::avx512vnni, QuantKernel::avx2})
    if (quant_kernel_supported(k)) {
      best = k;
      break;
    }
  // GDN_CPU_KERNEL lowers the choice as it lowers the bf16 kernel's: below amx, no tiles.
  if (const char* env = std::getenv("GDN_CPU_KERNEL")) {
    const std::string_view e = env;
    if (e == "scalar") best = QuantKernel::scalar;
    else if (e == "avx2" && best > QuantKernel::avx2) best = QuantKernel::avx2;
    else if ((e == "avx512" || e == "avx512bf16") && best > QuantKernel::avx512vnni) best = QuantKernel::avx512vnni;
  }
  return best;
}

}  // namespace

QuantKernel quant_kernel() noexcept {
  static const QuantKernel k = detect_quant_kernel();
  return k;
}

const char* quant_kernel_name(QuantKernel k) noexcept {
  switch (k) {
    case QuantKernel::amx_int8: return "amx-int8";
    case QuantKernel::avx512vnni: return "avx512vnni";
    case QuantKernel::avx2: return "avx2";
    default: return "scalar";
  }
}

bool quant_kernel_supported(QuantKernel k) noexcept {
  if (k == QuantKernel::scalar) return true;
#if GDN_X86
  __builtin_cpu_init();
  const bool avx2 = cpu_has_avx2_fma_f16c();
  if (k == QuantKernel::avx2) return avx2;
  const bool vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512vnni");
  if (k == QuantKernel::avx512vnni) return vnni;
  return vnni && cpu_has_amx_int8() && detail::amx_permitted();
#else
  return false;
#endif
}

std::int64_t quant_tile_bytes(QuantFormat f) noexcept { return int_bytes(f) + 64; }
std::int64_t quant_group_bytes(QuantFormat f, std::int64_t in) noexcept { return group_bytes(f, round_up(in, 32) / 32); }

std::size_t quant_image_bytes(QuantFormat f, std::int64_t out, std::int64_t in) noexcept {
  return static_cast<std::size_t>(round_up(out, 32) / 32 * quant_group_bytes(f, in));
}

namespace {

// One row's super-block (blocks b0 .. b1 - 1 of row `row`) of a q4_k group: its D and M, its
// blocks' sc, mn and nibbles (quant.hpp). A super-block with a NaN or infinite weight gets NaN D
// and M and zero integers, so the outputs it touches are NaN (as q4_0 does per block).
void quantize_q4k_super(const TensorView& W, std::int64_t row, std::int64_t n, std::int64_t b0, std::int64_t b1,
                        std::uint8_t* group, std::int64_t kb) {
  const std::int64_t out = W.dim(0), in = W.dim(1);
  float v[q4k_super_blocks][32] = {}, d[q4k_super_blocks] = {}, m[q4k_super_blocks] = {};
  int valid[q4k_super_blocks] = {};
  bool finite = true;
  for (std::int64_t b = b0; b < b1; ++b) {
    valid[b - b0] = row < out ? static_cast<int>(std::min<std::int64_t>(32, in - 32 * b)) : 0;
    for (int j = 0; j < valid[b - b0]; ++j) {
      v[b - b0][j] = weight_at(W, row, 32 * b + j);
      finite = finite && std::isfinite(v[b - b0][j]);
    }
  }
  // Padding rows (valid 0) keep d = m = 0; a block of fewer values is fitted to those alone.
  if (finite && row < out) fit_q4k_blocks(quant_kernel(), v, valid, static_cast<int>(b1 - b0), d, m);
  float dmax = 0.0f, mmax = 0.0f;
  for (std::int64_t b = b0; b < b1; ++b) {
    dmax = std::max(dmax, d[b - b0]);
    mmax = std::max(mmax, m[b - b0]);
  }
  std::uint8_t* sup = group + q4k_super_offset(kb, b0);
  const std::uint16_t Dh = finite ? to_half(dmax / 255.0f) : std::uint16_t{0x7e00};
  const std::uint16_t Mh = finite ? to_half(mmax / 255.0f) : std::uint16_t{0x7e00};
  std::memcpy(sup + 2 * n, &Dh, 2);
  std::memcpy(sup + 64 + 2 * n, &Mh, 2);
  if (!finite) return;  // the tiles stay zero
  const float D = to_float(f16{Dh}), M = to_float(f16{Mh});
  for (std::int64_t b = b0; b < b1; ++b) {
    std::uint8_t* t = group + b * q4k_tile_bytes;
    const float sc = D > 0.0f ? std::clamp(round_even(d[b - b0] / D), 0.0f, 255.0f) : 0.0f;
    const float mn = M > 0.0f ? std::clamp(round_even(m[b - b0] / M), 0.0f, 255.0f) : 0.0f;
    t[q4k_sc + n] = static_cast<std::uint8_t>(sc);
    t[q4k_mn + n] = static_cast<std::uint8_t>(mn);
    const float de = D * sc, me = M * mn;  // exact (quant.hpp)
    for (std::int64_t j = 0; j < 32; ++j) {
      const float q = de > 0.0f ? std::clamp(round_even((v[b - b0][j] + me) / de), 0.0f, 15.0f) : 0.0f;
      const auto u = static_cast<std::uint8_t>(q);
      std::uint8_t& byte = t[tile_byte(QuantFormat::q4_k, n, j)];
      byte = high_nibble(j) ? static_cast<std::uint8_t>((byte & 0x0F) | (u << 4)) : static_cast<std::uint8_t>((byte & 0xF0) | u);
    }
  }
}

}  // namespace

void quantize_weight_image(QuantFormat f, const TensorView& W, std::int64_t row0, std::int64_t row1, std::byte* image) {
  if (W.rank != 2 || (W.dtype != DType::bf16 && W.dtype != DType::f16 && W.dtype != DType::f32))
    throw Error(Status::internal, "quantize_weight_image: a rank-2 bf16, f16 or f32 weight expected");
  const std::int64_t out = W.dim(0), in = W.dim(1), kb = round_up(in, 32) / 32, tb = quant_tile_bytes(f);
  if (row0 % 32 != 0 || (row1 % 32 != 0 && row1 != out) || row0 > row1 || row1 > out)
    throw Error(Status::internal, "quantize_weight_image: rows must be whole groups of 32");
  auto* img = reinterpret_cast<std::uint8_t*>(image);
  const std::int64_t g1 = row1 >= out ? round_up(out, 32) / 32 : row1 / 32;
  if (f == QuantFormat::q4_k) {
    for (std::int64_t g = row0 / 32; g < g1; ++g) {
      std::uint8_t* group = img + g * group_bytes(f, kb);
      std::memset(group, 0, static_cast<std::size_t>(group_bytes(f, kb)));  // q = 0, sc = mn = 0, D = M = 0
      for (std::int64_t n = 0; n < 32; ++n)
        for (std::int64_t b0 = 0; b0 < kb; b0 += q4k_super_blocks)
          quantize_q4k_super(W, g * 32 + n, n, b0, std::min(kb, b0 + q4k_super_blocks), group, kb);
    }
    return;
  }
  for (std::int64_t g = row0 / 32; g < g1; ++g)
    for (std::int64_t b = 0; b < kb; ++b) {
      std::uint8_t* t = img + (g * kb + b) * tb;
      // q = 0 everywhere: q4_0's nibbles 8, q5_0's 0 with the fifth bit set (16)
      std::memset(t, f == QuantFormat::q8_0 || f == QuantFormat::q5_0 ? 0 : 0x88, static_cast<std::size_t>(tb));
      if (f == QuantFormat::q5_0) std::memset(t + q5_masks(0, 0), 0xFF, 128);
      for (std::int64_t n = 0; n < 32; ++n) {
        const std::int64_t row = g * 32 + n;
        float v[32] = {};
        if (row < out)
          for (std::int64_t j = 0; j < 32 && 32 * b + j < in; ++j) v[j] = weight_at(W, row, 32 * b + j);
        float d = 0.0f;
        if (f == QuantFormat::q8_0) {
          float amax = 0.0f;
          for (float w : v) amax = std::max(amax, std::fabs(w));
          d = amax / 127.0f;
        } else {
          float m = 0.0f;
          for (float w : v)
            if (std::fabs(w) > std::fabs(m)) m = w;
          d = m / (f == QuantFormat::q5_0 ? -16.0f : -8.0f);
        }
        // A block with a NaN or infinite weight has no integer form: its scale is NaN and its
        // integers 0, so the outputs it touches are NaN (as the float kernels' would be).
        bool finite = true;
        for (float w : v) finite = finite && std::isfinite(w);
        const std::uint16_t dh = finite ? to_half(d) : std::uint16_t{0x7e00};
        std::memcpy(t + int_bytes(f) + 2 * n, &dh, 2);
        // q = round(w / d) with the quotient correctly rounded (not w · (1/d), whose rounding
        // moves exact ties, frequent at q4_0 where d = -m/8 is exact).
        const float ds = finite ? to_float(f16{dh}) : 0.0f;
        for (std::int64_t j = 0; j < 32; ++j) {
          std::uint8_t& byte = t[tile_byte(f, n, j)];
          if (f == QuantFormat::q8_0) {
            const float q = ds != 0.0f ? std::clamp(round_even(v[j] / ds), -127.0f, 127.0f) : 0.0f;
            byte = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
          } else {
            const auto z = static_cast<float>(zero_point(f));  // q + z ≥ 0
            const float q = ds != 0.0f ? std::clamp(round_even(v[j] / ds), -z, z - 1.0f) : 0.0f;
            const auto u = static_cast<std::uint8_t>(q + z);
            byte = high_nibble(j) ? static_cast<std::uint8_t>((byte & 0x0F) | ((u & 0xF) << 4))
                                  : static_cast<std::uint8_t>((byte & 0xF0) | (u & 0xF));
            if (f == QuantFormat::q5_0) {
              std::uint8_t& bits = t[q5_bit_byte(n, j)];
              const auto mask = static_cast<std::uint8_t>(1u << q5_bit_shift(n, j));
              bits = static_cast<std::uint8_t>(u >= 16 ? bits | mask : bits & ~mask);
            }
          }
        }
      }
    }
}

float quant_image_value(QuantFormat f, const std::byte* image, std::int64_t out, std::int64_t in, std::int64_t n,
                        std::int64_t k) noexcept {
  (void)out;
  const std::int64_t kb = round_up(in, 32) / 32;
  const auto* group = reinterpret_cast<const std::uint8_t*>(image) + (n / 32) * group_bytes(f, kb);
  const std::uint8_t* t = group + (k / 32) * quant_tile_bytes(f);
  const float q = static_cast<float>(tile_q(f, t, n % 32, k % 32));
  if (f != QuantFormat::q4_k) return tile_scale(f, t, n % 32) * q;
  float d, m;
  q4k_block_dm(group, kb, k / 32, n % 32, d, m);
  return d * q - m;
}

std::int64_t quant_activation_stride(std::int64_t in) noexcept {
  const std::int64_t kp = round_up(std::max<std::int64_t>(in, 1), 32);
  return wide_offset(kp) + 2 * kp;
}

namespace {

// One block of 32 activations (zero-padded past the row's end) into its parts: see quant.hpp.
void quantize_block_scalar(const float* v, std::int8_t* hi, std::int8_t* lo, float* scale, std::int32_t* sums) {
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < 32; ++j) {
    finite = finite && std::isfinite(v[j]);
    amax = std::max(amax, std::fabs(v[j]));
  }
  // A non-finite activation has no int8 form: its block's parts are zero and its scale NaN, so
  // the row's outputs are NaN (as the float kernels' would be), never garbage integers. A block
  // so small that 127 / amax overflows (amax < 3.7e-37) is scaled by division instead.
  const bool usable = finite && amax > 0.0f;
  const float inv = usable ? 127.0f / amax : 0.0f;
  const bool by_division = usable && std::isinf(inv);
  std::int32_t sh = 0, sl = 0;
  for (int j = 0; j < 32; ++j) {
    const float u = !usable ? 0.0f : by_division ? v[j] / amax * 127.0f : v[j] * inv;
    const float h = std::clamp(round_even(u), -127.0f, 127.0f);
    const float l = std::clamp(round_even((u - h) * 254.0f), -127.0f, 127.0f);
    hi[j] = static_cast<std::int8_t>(h);
    lo[j] = static_cast<std::int8_t>(l);
    sh += static_cast<std::int32_t>(h);
    sl += static_cast<std::int32_t>(l);
  }
  *scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
  sums[0] = sh;
  sums[1] = sl;
}

#if GDN_X86
// 32 int32 in [-127, 127] (4 ymm) → 32 int8 in order: the packs interleave 128-bit halves, which
// the permute undoes.
GDN_T_AVX2Q inline __m256i pack_int8_avx2(const __m256i* q) {
  const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
GDN_T_AVX2Q inline std::int32_t sum_int32_avx2(const __m256i* q) {
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
  return _mm_cvtsi128_si32(t);
}

// The same operations on 32 lanes (4 ymm), for full blocks of finite values whose 127 / amax is
// finite; any other block goes to the scalar code. Each lane's float operations are those of the
// scalar loop (a multiply, a round to nearest even, a subtract, a multiply, a round, clamps), so
// the parts are bit-identical. Without it, quantising a 1024-wide batch-1 row took 6 µs on the
// calling thread while the workers waited: about 5% of a q4_0 decode step of the 0.8B shape.
GDN_T_AVX2Q bool quantize_block_avx2(const float* v, std::int8_t* hi, std::int8_t* lo, float* scale, std::int32_t* sums) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  __m256 x[4], m = _mm256_setzero_ps();
  __m256i nonfinite = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(x[i]), exp_mask);
    nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpeq_epi32(bits, exp_mask));
    m = _mm256_max_ps(m, _mm256_and_ps(x[i], abs_mask));
  }
  if (!_mm256_testz_si256(nonfinite, nonfinite)) return false;
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
  const float inv = 127.0f / amax;
  if (!(amax > 0.0f) || std::isinf(inv)) return false;
  constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 vinv = _mm256_set1_ps(inv), k254 = _mm256_set1_ps(254.0f);
  const __m256 lo_clamp = _mm256_set1_ps(-127.0f), hi_clamp = _mm256_set1_ps(127.0f);
  __m256i h32[4], l32[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 u = _mm256_mul_ps(x[i], vinv);
    const __m256 h = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(u, nearest), lo_clamp), hi_clamp);
    const __m256 l = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(u, h), k254), nearest),
                                                 lo_clamp), hi_clamp);
    h32[i] = _mm256_cvtps_epi32(h);  // integers already: the conversion is exact
    l32[i] = _mm256_cvtps_epi32(l);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), pack_int8_avx2(h32));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), pack_int8_avx2(l32));
  *scale = amax / 127.0f;
  sums[0] = sum_int32_avx2(h32);
  sums[1] = sum_int32_avx2(l32);
  return true;
}
#endif

}  // namespace

void quantize_activations(const float* x, std::int64_t ldx, std::int64_t r0, std::int64_t r1, std::int64_t in,
                          std::byte* buf) noexcept {
  const std::int64_t kp = round_up(std::max<std::int64_t>(in, 1), 32), stride = quant_activation_stride(in);
#if GDN_X86
  static const bool simd = quant_kernel() != QuantKernel::scalar;
#endif
  for (std::int64_t r = r0; r < r1; ++r) {
    std::byte* p = buf + r * stride;
    auto* hi = reinterpret_cast<std::int8_t*>(p);
    auto* lo = reinterpret_cast<std::int8_t*>(p + kp);
    auto* scale = reinterpret_cast<float*>(p + 2 * kp);
    auto* sums = reinterpret_cast<std::int32_t*>(p + 2 * kp + kp / 32 * 4);
    const float* xr = x + r * ldx;
    for (std::int64_t b = 0; b < kp / 32; ++b) {
      const std::int64_t n = std::min<std::int64_t>(32, in - 32 * b);
#if GDN_X86
      if (simd && n == 32 && quantize_block_avx2(xr + 32 * b, hi + 32 * b, lo + 32 * b, scale + b, sums + 2 * b)) continue;
#endif
      float v[32] = {};
      for (std::int64_t j = 0; j < n; ++j) v[j] = xr[32 * b + j];
      quantize_block_scalar(v, hi + 32 * b, lo + 32 * b, scale + b, sums + 2 * b);
    }
    auto* wide = reinterpret_cast<std::int16_t*>(p + wide_offset(kp));
    for (std::int64_t j = 0; j < kp; ++j) wide[j] = static_cast<std::int16_t>(254 * hi[j] + lo[j]);
  }
}

void quant_range(QuantKernel k, QuantFormat f, const std::byte* image, std::int64_t in, std::int64_t out,
                 std::int64_t n0, std::int64_t n1, const QuantActivations& x, std::int64_t rows, float* y,
                 std::int64_t ldy) {
  const std::int64_t kb = round_up(in, 32) / 32;
  n1 = std::min(n1, out);
  const auto* img = reinterpret_cast<const std::uint8_t*>(image);
#if GDN_X86
  // q4_k has no tile path (its per-block offsets would double the tile epilogue), nor has q5_0 (a
  // fallback for a few odd-sized rows): VNNI runs them.
  if (k == QuantKernel::amx_int8 && rows >= amx_min_rows && (f == QuantFormat::q8_0 || f == QuantFormat::q4_0)) {
    if (f == QuantFormat::q8_0) amx_int8_range<QuantFormat::q8_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    else amx_int8_range<QuantFormat::q4_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    return;
  }
  if (k == QuantKernel::avx512vnni || k == QuantKernel::amx_int8) {
    if (f == QuantFormat::q8_0) vnni_range<QuantFormat::q8_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    else if (f == QuantFormat::q4_0) vnni_range<QuantFormat::q4_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    else if (f == QuantFormat::q5_0) vnni_range<QuantFormat::q5_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    else vnni_range<QuantFormat::q4_k>(img, kb, out, n0, n1, x, rows, y, ldy);
    return;
  }
  if (k == QuantKernel::avx2) {
    if (f == QuantFormat::q8_0) avx2_range<QuantFormat::q8_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    else if (f == QuantFormat::q4_0) avx2_range<QuantFormat::q4_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    else if (f == QuantFormat::q5_0) avx2_range<QuantFormat::q5_0>(img, kb, out, n0, n1, x, rows, y, ldy);
    else avx2_range<QuantFormat::q4_k>(img, kb, out, n0, n1, x, rows, y, ldy);
    return;
  }
#endif
  (void)k;
  scalar_range(f, img, kb, out, n0, n1, x, rows, y, ldy);
}

}  // namespace gdn::cpu
