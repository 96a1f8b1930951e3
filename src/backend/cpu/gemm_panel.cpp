// The AVX-512 kernel for bf16 weights (CPUs without AMX): float32 FMA on weights widened from
// bf16, over a "panel image" of the weights.
//
// Layout. Output rows are grouped in blocks of 32 (two 16-row panels, one zmm of outputs each);
// within a block, for each pair of input columns k = 2q, 2q + 1, the 32 rows' two bf16 values are
// 128 contiguous bytes: element 2n + j of pair q is W[32b + n][2q + j]. A zmm load of one panel's
// 64 bytes thus holds 16 rows × (k, k + 1): shifting each 32-bit lane left by 16 gives the 16 rows'
// weights at k as floats, masking off the low half gives them at k + 1. Outputs live in lanes, so
// an activation enters as a broadcast scalar and no horizontal sum is ever needed, and a block is
// one sequential stream of 128 bytes per pair: decode reads the weights at the rate of a plain
// memory sweep.
//
// Arithmetic. Each output lane accumulates its even k and its odd k in two float32 FMA chains
// (k in increasing order), and the result is even + odd. The products are exact (bf16 × float fits
// float's FMA), so this is a float32 dot product of the float activations. The chains are split by
// parity so that a batch-1 step has four independent chains per block (FMA latency would bind a
// single chain), and the split is the same for every number of rows: a row's output is the same
// sequence of operations in every call (batch invariance), and the same whether the weights come
// from the packed image or are transposed from the checkpoint on the fly.
//
// Why FMA and not vdpbf16ps: a bf16 dot product of float activations needs each activation split
// into three bf16 parts, i.e. three vdpbf16ps (32 multiply-adds each) per 32 weights and row,
// against two FMAs (16 each) here; both instructions issue once per cycle on the CPUs measured
// (Zen 4: 0.28 ns each at 3.5 GHz), so FMA does a third more work per cycle when a step is
// compute-bound (prefill, batched decode), and the same weight stream when it is memory-bound.
//
// bf16 inputs (MatmulInput::bf16). When the activations are rounded to bf16 anyway, one vdpbf16ps
// per panel, pair and row takes the same 64 bytes of weights as they are (16 rows × two bf16) with
// the row's two activations broadcast: 32 multiply-adds an instruction, twice the FMA path's.
//
// In place (no image), each block is transposed into the same order 256 columns at a time, so the
// arithmetic, and every bit of the result, is the same as with the image.

#include <algorithm>
#include <cstring>

#include "gemm_internal.hpp"

#if GDN_X86
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only: clang has no such warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace gdn::cpu::detail {
namespace {

constexpr std::int64_t block_u16 = 64;     // uint16 per pair of a block (32 rows × 2)
constexpr std::int64_t chunk_pairs = 128;  // pairs per on-the-fly transposed chunk (16 KiB)
constexpr std::int64_t pass_rows = 96;     // activation rows per pass when accumulators wait in memory

std::int64_t pairs_of(std::int64_t in) { return (in + 1) / 2; }

#if GDN_X86
// Transposes a 16 × 16 matrix of 32-bit elements held as 16 row vectors (an element is a pair of
// bf16 columns): two rounds of in-lane unpacks, then a 4 × 4 transpose of 128-bit lanes.
GDN_T_AVX512 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);      // per lane: a0 b0 a1 b1
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);  //           a2 b2 a3 b3
  }
  // v[4g + j], lane L: rows 4g .. 4g + 3 of column 4L + j.
  __m512i v[16];
  for (int g = 0; g < 4; ++g) {
    const __m512i lo01 = t[4 * g], hi01 = t[4 * g + 1], lo23 = t[4 * g + 2], hi23 = t[4 * g + 3];
    v[4 * g + 0] = _mm512_unpacklo_epi64(lo01, lo23);
    v[4 * g + 1] = _mm512_unpackhi_epi64(lo01, lo23);
    v[4 * g + 2] = _mm512_unpacklo_epi64(hi01, hi23);
    v[4 * g + 3] = _mm512_unpackhi_epi64(hi01, hi23);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_shuffle_i32x4(v[j], v[4 + j], 0x44), b = _mm512_shuffle_i32x4(v[j], v[4 + j], 0xEE);
    const __m512i c = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0x44), d = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0xEE);
    r[j] = _mm512_shuffle_i32x4(a, c, 0x88);       // column j
    r[4 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);   // column 4 + j
    r[8 + j] = _mm512_shuffle_i32x4(b, d, 0x88);   // column 8 + j
    r[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);  // column 12 + j
  }
}

// Transposes W rows [n0, n0 + 32) (rows past `out` as zeros), pairs [q0, q1), into block order:
// 16 rows × 16 pairs at a time through registers, the pairs past the last 16 (and a last pair
// that is half padding) one by one.
GDN_T_AVX512 void transpose_block(const bf16* w, std::int64_t out, std::int64_t in, std::int64_t n0, std::int64_t q0,
                                  std::int64_t q1, std::uint16_t* dst) {
  const std::int64_t whole = std::min(q1, in / 2);  // pairs with both columns inside the row
  for (int panel = 0; panel < 2; ++panel) {
    const std::int64_t p0 = n0 + 16 * panel, nr = std::clamp<std::int64_t>(out - p0, 0, 16);
    std::int64_t q = q0;
    for (; q + 16 <= whole; q += 16) {
      __m512i r[16];
      for (int n = 0; n < 16; ++n)
        r[n] = n < nr ? _mm512_loadu_si512(w + (p0 + n) * in + 2 * q) : _mm512_setzero_si512();
      transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(dst + (q - q0 + c) * block_u16 + 32 * panel, r[c]);
    }
    for (; q < q1; ++q) {
      std::uint16_t* d = dst + (q - q0) * block_u16 + 32 * panel;
      for (std::int64_t n = 0; n < 16; ++n) {
        const std::uint16_t* row = reinterpret_cast<const std::uint16_t*>(w + (p0 + n) * in);
        d[2 * n] = n < nr ? row[2 * q] : std::uint16_t{0};
        d[2 * n + 1] = n < nr && 2 * q + 1 < in ? row[2 * q + 1] : std::uint16_t{0};
      }
    }
  }
}
#endif

#if GDN_X86
// Of 32 elements in two zmm halves (a block's two panels, or 32 columns) of which the first
// `valid` count, the lanes of half `half` (0 or 1) that do.
inline __mmask16 valid_lanes(std::int64_t valid, int half) {
  const std::int64_t n = std::clamp<std::int64_t>(valid - 16 * half, 0, 16);
  return static_cast<__mmask16>((1u << n) - 1u);
}

// R activation rows against one block's pairs [q0, q1) (wb points at pair q0), prefetching 64
// bytes a pair from `prefetch` when set. Accumulators start
// at zero or from `acc` (resume), and end in `acc` (y == nullptr) or as y = even + odd for the
// block's first `valid` output rows. `odd_tail`: the last pair's second column is past `in`, so
// its activation (beyond the row) is never read.
template <int R>
GDN_T_AVX512 void tile(const std::uint16_t* wb, std::int64_t q0, std::int64_t q1, bool odd_tail, const float* x,
                       std::int64_t ldx, float* acc, bool resume, float* y, std::int64_t ldy, std::int64_t valid,
                       const char* prefetch) {
  __m512 e0[R], e1[R], o0[R], o1[R];
  for (int r = 0; r < R; ++r) {
    if (resume) {
      e0[r] = _mm512_load_ps(acc + (4 * r + 0) * 16);
      e1[r] = _mm512_load_ps(acc + (4 * r + 1) * 16);
      o0[r] = _mm512_load_ps(acc + (4 * r + 2) * 16);
      o1[r] = _mm512_load_ps(acc + (4 * r + 3) * 16);
    } else {
      e0[r] = e1[r] = o0[r] = o1[r] = _mm512_setzero_ps();
    }
  }
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const std::int64_t qf = odd_tail ? q1 - 1 : q1;
  for (std::int64_t q = q0; q < qf; ++q, wb += block_u16) {
    if (prefetch != nullptr) _mm_prefetch(prefetch + (q - q0) * 64, _MM_HINT_T1);
    const __m512i w0 = _mm512_loadu_si512(wb), w1 = _mm512_loadu_si512(wb + 32);
    const __m512 we0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), wo0 = _mm512_castsi512_ps(_mm512_and_si512(w0, high));
    const __m512 we1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), wo1 = _mm512_castsi512_ps(_mm512_and_si512(w1, high));
    for (int r = 0; r < R; ++r) {
      const __m512 xe = _mm512_set1_ps(x[r * ldx + 2 * q]), xo = _mm512_set1_ps(x[r * ldx + 2 * q + 1]);
      e0[r] = _mm512_fmadd_ps(we0, xe, e0[r]);
      e1[r] = _mm512_fmadd_ps(we1, xe, e1[r]);
      o0[r] = _mm512_fmadd_ps(wo0, xo, o0[r]);
      o1[r] = _mm512_fmadd_ps(wo1, xo, o1[r]);
    }
  }
  if (odd_tail) {  // k = 2q only; the odd chain is left as it is (its weight is the zero padding)
    const std::int64_t q = q1 - 1;
    const __m512i w0 = _mm512_loadu_si512(wb), w1 = _mm512_loadu_si512(wb + 32);
    const __m512 we0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), we1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
    for (int r = 0; r < R; ++r) {
      const __m512 xe = _mm512_set1_ps(x[r * ldx + 2 * q]);
      e0[r] = _mm512_fmadd_ps(we0, xe, e0[r]);
      e1[r] = _mm512_fmadd_ps(we1, xe, e1[r]);
    }
  }
  if (y == nullptr) {
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(acc + (4 * r + 0) * 16, e0[r]);
      _mm512_store_ps(acc + (4 * r + 1) * 16, e1[r]);
      _mm512_store_ps(acc + (4 * r + 2) * 16, o0[r]);
      _mm512_store_ps(acc + (4 * r + 3) * 16, o1[r]);
    }
    return;
  }
  const __mmask16 m0 = valid_lanes(valid, 0), m1 = valid_lanes(valid, 1);
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, _mm512_add_ps(e0[r], o0[r]));
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, _mm512_add_ps(e1[r], o1[r]));
  }
}

// The same with bf16 activations (MatmulInput::bf16): one vdpbf16ps per panel, pair and row
// multiplies the 16 rows' two weights by the row's two activations (exact products, float32
// accumulation), with the pair broadcast from `xp` (uint32 = two bf16, zero past `in`). Two
// accumulators per row; 8 rows (16 accumulators) measured 98% of the vdpbf16ps peak, 12 rows 93%.
template <int R>
GDN_T_BF16 void tile_dot(const std::uint16_t* wb, std::int64_t q0, std::int64_t q1, bool /*odd_tail*/,
                         const std::uint32_t* xp, std::int64_t ldxp, float* acc, bool resume, float* y, std::int64_t ldy,
                         std::int64_t valid, const char* prefetch) {
  __m512 a0[R], a1[R];
  for (int r = 0; r < R; ++r) {
    a0[r] = resume ? _mm512_load_ps(acc + (2 * r + 0) * 16) : _mm512_setzero_ps();
    a1[r] = resume ? _mm512_load_ps(acc + (2 * r + 1) * 16) : _mm512_setzero_ps();
  }
  for (std::int64_t q = q0; q < q1; ++q, wb += block_u16) {
    if (prefetch != nullptr) _mm_prefetch(prefetch + (q - q0) * 64, _MM_HINT_T1);
    const __m512i w0 = _mm512_loadu_si512(wb), w1 = _mm512_loadu_si512(wb + 32);
    for (int r = 0; r < R; ++r) {
      const __m512i xb = _mm512_set1_epi32(static_cast<int>(xp[r * ldxp + q]));
      a0[r] = _mm512_dpbf16_ps(a0[r], reinterpret_cast<const __m512bh&>(w0), reinterpret_cast<const __m512bh&>(xb));
      a1[r] = _mm512_dpbf16_ps(a1[r], reinterpret_cast<const __m512bh&>(w1), reinterpret_cast<const __m512bh&>(xb));
    }
  }
  if (y == nullptr) {
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(acc + (2 * r + 0) * 16, a0[r]);
      _mm512_store_ps(acc + (2 * r + 1) * 16, a1[r]);
    }
    return;
  }
  const __mmask16 m0 = valid_lanes(valid, 0), m1 = valid_lanes(valid, 1);
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, a0[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, a1[r]);
  }
}

template <typename X>
using TileFn = void (*)(const std::uint16_t*, std::int64_t, std::int64_t, bool, const X*, std::int64_t, float*, bool,
                        float*, std::int64_t, std::int64_t, const char*);

// A kernel's tiles by row count, and how many accumulator registers (zmm) each row holds.
struct FmaTiles {
  using X = float;
  static constexpr int max_rows = 6, acc_zmm = 4;
  static constexpr TileFn<float> table[max_rows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};
};
struct DotTiles {
  using X = std::uint32_t;
  static constexpr int max_rows = 8, acc_zmm = 2;
  static constexpr TileFn<std::uint32_t> table[max_rows + 1] = {nullptr,     tile_dot<1>, tile_dot<2>, tile_dot<3>, tile_dot<4>,
                                                                 tile_dot<5>, tile_dot<6>, tile_dot<7>, tile_dot<8>};
};

template <typename K>
void run_range(const bf16* w, const std::uint16_t* image, std::int64_t in, std::int64_t out, std::int64_t n0, std::int64_t n1,
               const typename K::X* x, std::int64_t ldx, std::int64_t rows, float* y, std::int64_t ldy) {
  const std::int64_t pairs = pairs_of(in);
  const bool odd = in % 2 != 0;
  if (image != nullptr) {
    // The whole k range in registers: one call per block and group of rows, the block re-read from
    // L1/L2 by every group after the first. Only the first group's sweep of a block reads memory, so
    // with several groups the memory would idle while the others run from L2: the first two sweeps
    // prefetch the next block into L2, half each. (In-process A/B at batch 16: +10% with float32
    // inputs, +8% with bf16 inputs over no prefetch / the whole block in the second sweep.)
    const std::int64_t sweeps = (rows + K::max_rows - 1) / K::max_rows;
    for (std::int64_t n = n0; n < n1; n += panel_block_rows) {
      const std::uint16_t* wb = image + (n / panel_block_rows) * pairs * block_u16;
      const char* next = n + panel_block_rows < n1 ? reinterpret_cast<const char*>(wb + pairs * block_u16) : nullptr;
      const std::int64_t valid = std::min(panel_block_rows, out - n);
      for (std::int64_t sweep = 0; sweep < sweeps; ++sweep) {
        const std::int64_t r = sweep * K::max_rows;
        const auto R = static_cast<int>(std::min<std::int64_t>(K::max_rows, rows - r));
        K::table[R](wb, 0, pairs, odd, x + r * ldx, ldx, nullptr, false, y + r * ldy + n, ldy, valid,
                    next != nullptr && sweeps > 1 && sweep < 2 ? next + sweep * pairs * 64 : nullptr);
      }
    }
    return;
  }
  // In place: each block is transposed a chunk of pairs at a time; partial sums of a pass of rows
  // wait in `acc` between chunks (stored and reloaded exactly, so the arithmetic is unchanged).
  alignas(64) thread_local std::uint16_t chunk[chunk_pairs * block_u16];
  alignas(64) thread_local float acc[pass_rows * 4 * 16];
  for (std::int64_t n = n0; n < n1; n += panel_block_rows) {
    const std::int64_t valid = std::min(panel_block_rows, out - n);
    for (std::int64_t p0 = 0; p0 < rows; p0 += pass_rows) {
      const std::int64_t p1 = std::min(rows, p0 + pass_rows);
      for (std::int64_t q0 = 0; q0 < pairs; q0 += chunk_pairs) {
        const std::int64_t q1 = std::min(pairs, q0 + chunk_pairs);
        const bool last = q1 == pairs;
        transpose_block(w, out, in, n, q0, q1, chunk);
        for (std::int64_t r = p0; r < p1; r += K::max_rows) {
          const auto R = static_cast<int>(std::min<std::int64_t>(K::max_rows, p1 - r));
          float* a = acc + (r - p0) * K::acc_zmm * 16;
          K::table[R](chunk, q0, q1, odd && last, x + r * ldx, ldx, a, q0 > 0, last ? y + r * ldy + n : nullptr, ldy,
                      valid, nullptr);
        }
      }
    }
  }
}

// Rows [r0, r1) of x rounded to bf16 (to nearest even), as pairs: xp[r · pairs + q] holds columns
// 2q (low half) and 2q + 1, zero past `in`.
GDN_T_BF16 void pack_pairs(const float* x, std::int64_t ldx, std::int64_t r0, std::int64_t r1, std::int64_t in,
                           std::uint32_t* xp) {
  const std::int64_t pairs = pairs_of(in);
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * ldx;
    auto* out = reinterpret_cast<std::uint16_t*>(xp + r * pairs);
    for (std::int64_t k = 0; k < 2 * pairs; k += 32) {
      const std::int64_t left = in - k;
      const __mmask16 m0 = valid_lanes(left, 0), m1 = valid_lanes(left, 1);
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, xr + k + 16), _mm512_maskz_loadu_ps(m0, xr + k));
      const std::int64_t n = std::min<std::int64_t>(32, 2 * pairs - k);
      _mm512_mask_storeu_epi16(out + k, static_cast<__mmask32>(n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1u),
                               reinterpret_cast<const __m512i&>(h));
    }
  }
}
#endif

}  // namespace

std::int64_t panel_image_elements(std::int64_t out, std::int64_t in) noexcept {
  return (out + panel_block_rows - 1) / panel_block_rows * pairs_of(in) * block_u16;
}

void pack_panel_image(const bf16* w, std::int64_t out, std::int64_t in, std::int64_t row0, std::int64_t row1,
                      std::uint16_t* image) {
#if GDN_X86
  const std::int64_t pairs = pairs_of(in);
  for (std::int64_t n0 = row0; n0 < row1; n0 += panel_block_rows)
    transpose_block(w, out, in, n0, 0, pairs, image + (n0 / panel_block_rows) * pairs * block_u16);
#else
  (void)w, (void)out, (void)in, (void)row0, (void)row1, (void)image;
#endif
}

void pack_bf16_pairs(const float* x, std::int64_t ldx, std::int64_t r0, std::int64_t r1, std::int64_t in,
                     std::uint32_t* xp) {
#if GDN_X86
  pack_pairs(x, ldx, r0, r1, in, xp);
#else
  (void)x, (void)ldx, (void)r0, (void)r1, (void)in, (void)xp;
#endif
}

std::int64_t bf16_pairs_per_row(std::int64_t in) noexcept { return pairs_of(in); }

void panel_range(const bf16* w, const std::uint16_t* image, std::int64_t in, std::int64_t out, std::int64_t n0,
                 std::int64_t n1, const PanelInput& x, std::int64_t rows, float* y, std::int64_t ldy) {
#if GDN_X86
  if (x.pairs != nullptr) run_range<DotTiles>(w, image, in, out, n0, n1, x.pairs, pairs_of(in), rows, y, ldy);
  else run_range<FmaTiles>(w, image, in, out, n0, n1, x.x, x.ldx, rows, y, ldy);
#else
  (void)w, (void)image, (void)in, (void)out, (void)n0, (void)n1, (void)x, (void)rows, (void)y, (void)ldy;
#endif
}

}  // namespace gdn::cpu::detail
