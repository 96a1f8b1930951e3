// CPU projection kernels (see linear.hpp): run-time dispatch between AMX, AVX-512, AVX2 and scalar
// code compiled with per-function target attributes (the AVX-512 bf16 kernel in
// cpu_gemm_panel.cpp), so the library needs no -march flag to use the vector units of the machine
// it runs on.

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include "linear.hpp"
#include "gdn/core/error.hpp"

#include "gemm_internal.hpp"
#include "quant.hpp"

#if GDN_X86
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as uninitialised
// (a known false positive); nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only: clang has no such warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace gdn::cpu {
namespace {

// The quantised format a quantised image layout holds.
QuantFormat quant_format(WeightImage layout) noexcept {
  switch (layout) {
    case WeightImage::q8_0: return QuantFormat::q8_0;
    case WeightImage::q5_0: return QuantFormat::q5_0;
    case WeightImage::q4_0: return QuantFormat::q4_0;
    default: return QuantFormat::q4_k;
  }
}

constexpr std::int64_t tile_u16 = 512;  // one AMX tile, 16 rows × 64 bytes, in uint16
constexpr int group_rows = 4;  // activation rows per AMX B tile: 3 parts each, 12 of 16 columns
std::int64_t amx_groups(std::int64_t rows) { return (rows + group_rows - 1) / group_rows; }

// Copies 16 rows × 32 columns of W (rows n0.., columns k0..) into a zero-padded tile image.
inline void weight_tile_copy(const bf16* w, std::int64_t in, std::int64_t out_rows, std::int64_t n0, std::int64_t k0,
                             std::uint16_t* t) {
  std::memset(t, 0, tile_u16 * sizeof(std::uint16_t));
  const std::int64_t nr = std::min<std::int64_t>(16, out_rows - n0), nk = std::min<std::int64_t>(32, in - k0);
  for (std::int64_t n = 0; n < nr; ++n) std::memcpy(t + n * 32, w + (n0 + n) * in + k0, static_cast<std::size_t>(nk) * 2);
}

// Index of tile (row block rb of 16 rows, k step s) in a tile image: the two row blocks of each
// block of 32 rows alternate step by step, so the kernel's pair of weight tiles at each step is
// 2 KiB of contiguous memory and a block of 32 rows is one sequential stream.
inline std::int64_t image_tile(std::int64_t rb, std::int64_t s, std::int64_t steps) {
  return ((rb >> 1) * steps + s) * 2 + (rb & 1);
}


// Activations enter the AMX kernel as this many bf16 parts (see split32).
constexpr int split_parts = 3;

// ------------------------------------------------------------------------------------------------
// Kernel selection: CPU features (and the OS's permission for AMX tile data), optionally lowered
// by GDN_CPU_KERNEL. Never the shape of a call.

#if GDN_X86
// CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE. Asked directly because older compilers
// (clang 14) do not know these names in __builtin_cpu_supports.
bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx & (1u << 22)) != 0 && (edx & (1u << 24)) != 0;
}
#endif

LinearKernel detect_kernel() {
  LinearKernel best = LinearKernel::scalar;
#if GDN_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = LinearKernel::avx2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    best = LinearKernel::avx512;
  if (best == LinearKernel::avx512 && __builtin_cpu_supports("avx512bf16")) best = LinearKernel::avx512bf16;
  if (best == LinearKernel::avx512bf16 && cpu_has_amx_bf16() && detail::amx_permitted())
    best = LinearKernel::amx;
#endif
  if (const char* env = std::getenv("GDN_CPU_KERNEL")) {
    const std::string_view e = env;
    LinearKernel want = best;
    if (e == "scalar") want = LinearKernel::scalar;
    else if (e == "avx2") want = LinearKernel::avx2;
    else if (e == "avx512") want = LinearKernel::avx512;
    else if (e == "avx512bf16") want = LinearKernel::avx512bf16;
    else if (e == "amx") want = LinearKernel::amx;
    if (want < best) best = want;  // only ever lower: the CPU must support what runs
  }
  return best;
}

// ------------------------------------------------------------------------------------------------
// Scalar: 16 partial sums (k ≡ lane mod 16), then a fixed-order sum.

template <typename W>
void dot_rows_scalar(const W* w, std::int64_t in, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
                     std::int64_t ldy, std::int64_t n0, std::int64_t n1) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t n = n0; n < n1; ++n) {
      float lanes[16] = {};
      const W* wr = w + n * in;
      const float* xr = x + r * ldx;
      for (std::int64_t k = 0; k < in; ++k) lanes[k % 16] += to_float(wr[k]) * xr[k];
      float s = 0.0f;
      for (float l : lanes) s += l;
      y[r * ldy + n] = s;
    }
}

#if GDN_X86
// ------------------------------------------------------------------------------------------------
// AVX2: weights widened to float, 8 lanes accumulate k ≡ lane mod 8; the tail goes through a
// zero-padded copy; one horizontal sum in a fixed order.

template <typename W>
GDN_T_AVX2 inline __m256 load8(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<W, bf16>) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

GDN_T_AVX2 inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

template <typename W, int R, int N>
GDN_T_AVX2 void tile_avx2(const W* w, std::int64_t in, const float* x, std::int64_t ldx, float* y, std::int64_t ldy,
                          std::int64_t n0) {
  __m256 acc[R][N];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < N; ++j) acc[r][j] = _mm256_setzero_ps();
  std::int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    __m256 wv[N];
    for (int j = 0; j < N; ++j) wv[j] = load8(w + (n0 + j) * in + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
      for (int j = 0; j < N; ++j) acc[r][j] = _mm256_fmadd_ps(wv[j], xv, acc[r][j]);
    }
  }
  if (k < in) {
    const std::int64_t t = in - k;
    W wt[N][8] = {};
    for (int j = 0; j < N; ++j)
      for (std::int64_t i = 0; i < t; ++i) wt[j][i] = w[(n0 + j) * in + k + i];
    __m256 wv[N];
    for (int j = 0; j < N; ++j) wv[j] = load8(wt[j]);
    for (int r = 0; r < R; ++r) {
      float xt[8] = {};
      for (std::int64_t i = 0; i < t; ++i) xt[i] = x[r * ldx + k + i];
      const __m256 xv = _mm256_loadu_ps(xt);
      for (int j = 0; j < N; ++j) acc[r][j] = _mm256_fmadd_ps(wv[j], xv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < N; ++j) y[r * ldy + n0 + j] = hsum8(acc[r][j]);
}

template <typename W, int N>
GDN_T_AVX2 void rows_avx2(const W* w, std::int64_t in, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
                          std::int64_t ldy, std::int64_t n0) {
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4) tile_avx2<W, 4, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
  for (; r < rows; ++r) tile_avx2<W, 1, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
}

template <typename W>
GDN_T_AVX2 void block_avx2(const W* w, std::int64_t in, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
                           std::int64_t ldy, std::int64_t n0, std::int64_t n1) {
  std::int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows_avx2<W, 4>(w, in, x, ldx, rows, y, ldy, n);
  for (; n < n1; ++n) rows_avx2<W, 1>(w, in, x, ldx, rows, y, ldy, n);
}

// ------------------------------------------------------------------------------------------------
// AVX-512: weights widened to float, 16 lanes accumulate k ≡ lane mod 16, the tail through masked
// loads, then one horizontal sum.

template <typename W>
GDN_T_AVX512 inline __m512 load16(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<W, bf16>) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

template <typename W>
GDN_T_AVX512 inline __m512 load16_masked(const W* p, __mmask16 m) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (std::is_same_v<W, bf16>) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
}

template <typename W, int R, int N>
GDN_T_AVX512 void tile_avx512(const W* w, std::int64_t in, const float* x, std::int64_t ldx, float* y, std::int64_t ldy,
                              std::int64_t n0) {
  __m512 acc[R][N];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < N; ++j) acc[r][j] = _mm512_setzero_ps();
  std::int64_t k = 0;
  for (; k + 16 <= in; k += 16) {
    __m512 wv[N];
    for (int j = 0; j < N; ++j) wv[j] = load16(w + (n0 + j) * in + k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * ldx + k);
      for (int j = 0; j < N; ++j) acc[r][j] = _mm512_fmadd_ps(wv[j], xv, acc[r][j]);
    }
  }
  if (k < in) {
    const __mmask16 m = static_cast<__mmask16>((1u << (in - k)) - 1u);
    __m512 wv[N];
    for (int j = 0; j < N; ++j) wv[j] = load16_masked(w + (n0 + j) * in + k, m);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * ldx + k);
      for (int j = 0; j < N; ++j) acc[r][j] = _mm512_fmadd_ps(wv[j], xv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < N; ++j) y[r * ldy + n0 + j] = _mm512_reduce_add_ps(acc[r][j]);
}

template <typename W, int N>
GDN_T_AVX512 void rows_avx512(const W* w, std::int64_t in, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
                              std::int64_t ldy, std::int64_t n0) {
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4) tile_avx512<W, 4, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
  for (; r + 2 <= rows; r += 2) tile_avx512<W, 2, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
  for (; r < rows; ++r) tile_avx512<W, 1, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
}

template <typename W>
GDN_T_AVX512 void block_avx512(const W* w, std::int64_t in, const float* x, std::int64_t ldx, std::int64_t rows,
                               float* y, std::int64_t ldy, std::int64_t n0, std::int64_t n1) {
  std::int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows_avx512<W, 4>(w, in, x, ldx, rows, y, ldy, n);
  for (; n < n1; ++n) rows_avx512<W, 1>(w, in, x, ldx, rows, y, ldy, n);
}

// ------------------------------------------------------------------------------------------------
// bf16 split of activations into three parts, x = hi + mid + lo exactly (each remainder is exact
// in float and the three 8-bit significands cover float's 24), so the AMX kernel multiplies the
// float activations themselves, not a rounded copy.

GDN_T_BF16 inline __m512i widen_lo16(__m512i b) {
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(b)), 16);
}
GDN_T_BF16 inline __m512i widen_hi16(__m512i b) {
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(b, 1)), 16);
}

GDN_T_BF16 inline void split32(const float* x, std::int64_t valid, __m512i out[split_parts]) {
  const __mmask16 m0 = static_cast<__mmask16>(valid >= 16 ? 0xffff : (1u << std::max<std::int64_t>(valid, 0)) - 1u);
  const __mmask16 m1 =
      static_cast<__mmask16>(valid >= 32 ? 0xffff : (valid <= 16 ? 0u : (1u << (valid - 16)) - 1u));
  __m512 x0 = _mm512_maskz_loadu_ps(m0, x), x1 = _mm512_maskz_loadu_ps(m1, x + 16);
  for (int p = 0; p < split_parts; ++p) {
    const __m512bh h = _mm512_cvtne2ps_pbh(x1, x0);  // elements 0..15 from x0, 16..31 from x1
    const __m512i hb = reinterpret_cast<const __m512i&>(h);
    out[p] = hb;
    x0 = _mm512_sub_ps(x0, _mm512_castsi512_ps(widen_lo16(hb)));
    x1 = _mm512_sub_ps(x1, _mm512_castsi512_ps(widen_hi16(hb)));
  }
}

// ------------------------------------------------------------------------------------------------
// AMX. C = W·Xᵀ on float tiles: 16 weight rows (the A operand, 16 rows × 32 bf16 of k, from the
// tile image or read in place with the row stride) against the activations (the B operand). The
// activations are packed in groups of 4 rows; a group's B tile holds, for each step of 32 k,
// 16 tile rows (k pairs) × 12 columns of 2 bf16: column 3m + p is part p (hi, mid, lo) of the
// group's row m. One tile product thus applies a weight tile to all three parts of four rows, and
// each part accumulates in its own C column; an output is (hi + mid) + lo of its three columns.
// For batch-1 decode that is one product per weight tile rather than three, so the tile unit
// keeps up with the weight stream. (Four rows, not five: a product over 15 columns measured 1.7x
// the time of one over 12 here, which made prefill and batched decode slower.) Every output
// element is the same sequence of operations whatever the number of rows (columns never mix;
// missing rows are columns never read).


// Tiles: C(group g, half h) = 2g + h, A(half) = 4, 5, B(group) = 6, 7. `cols0` and `cols1` are
// the C/B columns of the two groups multiplied together (3 per activation row; cols1 = 0: one
// group). Loaded afresh (`force`) the first time a thread runs a range in each linear_multi call:
// the calling thread is the host's, and other AMX code it runs between our calls (oneDNN, say) may
// have changed the configuration.
GDN_T_AMX void amx_configure(int cols0, int cols1, bool force) {
  thread_local int configured = -1;
  const int key = cols0 * 64 + cols1;
  if (configured == key && !force) return;
  detail::TileConfig c;
  const int cols[2] = {cols0, cols1};
  for (int g = 0; g < 2; ++g) {
    const auto rows = static_cast<std::uint8_t>(cols[g] > 0 ? 16 : 0);
    const auto bytes = static_cast<std::uint16_t>(4 * cols[g]);
    c.rows[2 * g] = c.rows[2 * g + 1] = c.rows[6 + g] = rows;
    c.colsb[2 * g] = c.colsb[2 * g + 1] = c.colsb[6 + g] = bytes;
  }
  c.rows[4] = c.rows[5] = 16;
  c.colsb[4] = c.colsb[5] = 64;
  _tile_loadconfig(&c);
  configured = key;
}

// Packs the activation groups [g0, g1) (`steps` tiles each).
GDN_T_AMX void pack_amx(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t in, std::int64_t steps,
                        std::int64_t g0, std::int64_t g1, std::uint16_t* out) {
  const __m512i kpair = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(16));  // dword kk·16 of tile row kk
  for (std::int64_t g = g0; g < g1; ++g) {
    std::uint16_t* base = out + g * steps * tile_u16;
    for (int m = 0; m < group_rows && g * group_rows + m < rows; ++m) {
      const std::int64_t r = g * group_rows + m;
      __m512i idx[split_parts];
      for (int p = 0; p < split_parts; ++p) idx[p] = _mm512_add_epi32(kpair, _mm512_set1_epi32(3 * m + p));
      for (std::int64_t s = 0; s < steps; ++s) {
        __m512i parts[split_parts];
        split32(x + r * ldx + s * 32, in - s * 32, parts);
        for (int p = 0; p < split_parts; ++p) _mm512_i32scatter_epi32(base + s * tile_u16, idx[p], parts[p], 4);
      }
    }
  }
}

// Tile loads wait for the products still reading their tile (tiles are not renamed), so while the
// tile unit works no new weight load is issued and the stream falls behind whenever the products
// take long (batched decode) or the prefetchers lag. Touching the image a few k steps ahead keeps
// its lines in flight: in A/B runs in one process, 2–4 steps ahead made batch-1 decode 4–10% and
// batch-16 decode 9–11% faster; 8 steps, or prefetching into L2 only, bought nothing. Lines past
// the end of a k block belong to the same 32-row block's next k block, read in a later pass; past
// the end of the image a prefetch touches nothing (prefetches never fault).
constexpr std::int64_t prefetch_steps = 3;

GDN_T_AMX inline void prefetch_tile(const std::uint16_t* t) {
  const char* p = reinterpret_cast<const char*>(t);
  for (int line = 0; line < 1024; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}

// (Tile numbers must be literals: the intrinsics paste them into the instruction.)
#define GDN_AMX_LOAD_A(i, tile)                                                               \
  do {                                                                                        \
    if (image != nullptr) {                                                                   \
      const std::uint16_t* t_ = image + image_tile((n0 >> 4) + (i), s, steps) * tile_u16;    \
      prefetch_tile(t_ + prefetch_steps * 2 * tile_u16);                                      \
      _tile_loadd(tile, t_, 64);                                                              \
    } else if (full[i] && s < full_steps) {                                                   \
      _tile_loadd(tile, w + (n0 + 16 * (i)) * in + s * 32, in * 2);                           \
    } else {                                                                                  \
      weight_tile_copy(w, in, out_rows, n0 + 16 * (i), s * 32, tmp[i]);                       \
      _tile_loadd(tile, tmp[i], 64);                                                          \
    }                                                                                         \
  } while (0)

// AMX tiles are not renamed, and a tile load costs about as much as a tile product, so each pair
// of weight tiles serves two activation groups, and the activation tiles are kept in L1: the k
// dimension is walked in blocks of `kblock` steps, and each block of activation tiles serves every
// weight block of the range before the next block of k. Partial sums wait in per-thread buffers of
// C tiles between k blocks (stored and reloaded exactly, so each element still accumulates its k
// steps in order: the same arithmetic as an unblocked loop).
constexpr std::int64_t kblock = 16;  // 2 groups × 16 steps × 1 KiB of activation tiles: in L1
constexpr std::int64_t max_range_rows = 1024;

// NA weight tiles (16 rows each) from row n0, against NG activation groups (b0, b1), k steps
// [s0, s1); partial sums in cb0 / cb1 (16 floats per weight row, the second half 256 floats on).
template <int NA, int NG>
GDN_T_AMX inline void amx_kblock(const bf16* w, const std::uint16_t* image, std::int64_t in, std::int64_t out_rows,
                                 std::int64_t n0, const std::uint16_t* b0, const std::uint16_t* b1, std::int64_t steps,
                                 std::int64_t s0, std::int64_t s1, float* cb0, float* cb1) {
  alignas(64) std::uint16_t tmp[2][tile_u16];
  const bool full[2] = {n0 + 16 <= out_rows, n0 + 32 <= out_rows};
  const std::int64_t full_steps = in / 32;
  if (s0 == 0) {
    _tile_zero(0);
    if constexpr (NA == 2) _tile_zero(1);
    if constexpr (NG == 2) _tile_zero(2);
    if constexpr (NA == 2 && NG == 2) _tile_zero(3);
  } else {
    _tile_loadd(0, cb0, 64);
    if constexpr (NA == 2) _tile_loadd(1, cb0 + 256, 64);
    if constexpr (NG == 2) _tile_loadd(2, cb1, 64);
    if constexpr (NA == 2 && NG == 2) _tile_loadd(3, cb1 + 256, 64);
  }
  for (std::int64_t s = s0; s < s1; ++s) {
    _tile_loadd(6, b0 + s * tile_u16, 64);
    if constexpr (NG == 2) _tile_loadd(7, b1 + s * tile_u16, 64);
    GDN_AMX_LOAD_A(0, 4);
    if constexpr (NA == 2) GDN_AMX_LOAD_A(1, 5);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NA == 2) _tile_dpbf16ps(1, 5, 6);
    if constexpr (NG == 2) _tile_dpbf16ps(2, 4, 7);
    if constexpr (NA == 2 && NG == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, cb0, 64);
  if constexpr (NA == 2) _tile_stored(1, cb0 + 256, 64);
  if constexpr (NG == 2) _tile_stored(2, cb1, 64);
  if constexpr (NA == 2 && NG == 2) _tile_stored(3, cb1 + 256, 64);
}
#undef GDN_AMX_LOAD_A

// Rows [n0, n1) (at most max_range_rows) of one weight against every activation group.
GDN_T_AMX void amx_range(const bf16* w, const std::uint16_t* image, std::int64_t in, std::int64_t out_rows, std::int64_t n0,
                         std::int64_t n1, const std::uint16_t* xp, std::int64_t steps, std::int64_t rows, float* y,
                         std::int64_t ldy, bool force_configure) {
  alignas(64) thread_local float cbuf[2][max_range_rows * 16];  // C tiles of the range per group, [n][column]
  const std::int64_t groups = amx_groups(rows);
  const auto group_size = [&](std::int64_t g) { return std::min<std::int64_t>(group_rows, rows - g * group_rows); };
  for (std::int64_t g = 0; g < groups; g += 2) {
    const bool two = g + 1 < groups;
    amx_configure(3 * static_cast<int>(group_size(g)), two ? 3 * static_cast<int>(group_size(g + 1)) : 0,
                  force_configure && g == 0);
    const std::uint16_t* b0 = xp + g * steps * tile_u16;
    const std::uint16_t* b1 = b0 + steps * tile_u16;
    for (std::int64_t s0 = 0; s0 < steps; s0 += kblock) {
      const std::int64_t s1 = std::min(steps, s0 + kblock);
      for (std::int64_t n = n0; n < n1; n += 32) {
        float* cb0 = cbuf[0] + (n - n0) * 16;
        float* cb1 = cbuf[1] + (n - n0) * 16;
        const bool pair = n + 16 < n1;
        if (two) {
          if (pair) amx_kblock<2, 2>(w, image, in, out_rows, n, b0, b1, steps, s0, s1, cb0, cb1);
          else amx_kblock<1, 2>(w, image, in, out_rows, n, b0, b1, steps, s0, s1, cb0, cb1);
        } else {
          if (pair) amx_kblock<2, 1>(w, image, in, out_rows, n, b0, b1, steps, s0, s1, cb0, cb1);
          else amx_kblock<1, 1>(w, image, in, out_rows, n, b0, b1, steps, s0, s1, cb0, cb1);
        }
      }
    }
    // cbuf[j][(n − n0)·16 + 3m + p]: weight row n, part p of activation row (g + j)·group_rows + m.
    for (std::int64_t j = 0; j < (two ? 2 : 1); ++j) {
      const float* cb = cbuf[j];
      for (std::int64_t m = 0; m < group_size(g + j); ++m) {
        float* yr = y + ((g + j) * group_rows + m) * ldy;
        for (std::int64_t n = n0; n < n1; ++n) {
          const float* c = cb + (n - n0) * 16 + 3 * m;
          yr[n] = (c[0] + c[1]) + c[2];
        }
      }
    }
  }
}
#endif  // GDN_X86

// ------------------------------------------------------------------------------------------------
// Dispatch.

template <typename W>
void run_block(LinearKernel k, const W* w, std::int64_t in, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
               std::int64_t ldy, std::int64_t n0, std::int64_t n1) {
#if GDN_X86
  if (k >= LinearKernel::avx512) return block_avx512<W>(w, in, x, ldx, rows, y, ldy, n0, n1);
  if (k == LinearKernel::avx2) return block_avx2<W>(w, in, x, ldx, rows, y, ldy, n0, n1);
#endif
  dot_rows_scalar<W>(w, in, x, ldx, rows, y, ldy, n0, n1);
}

void float_block(LinearKernel k, const TensorView& W, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
                 std::int64_t ldy, std::int64_t n0, std::int64_t n1) {
  const std::int64_t in = W.dim(1);
  switch (W.dtype) {
    case DType::bf16: return run_block(k, W.as<bf16>(), in, x, ldx, rows, y, ldy, n0, n1);
    case DType::f16: return run_block(k, W.as<f16>(), in, x, ldx, rows, y, ldy, n0, n1);
    case DType::f32: return run_block(k, W.as<float>(), in, x, ldx, rows, y, ldy, n0, n1);
    default: throw Error(Status::internal, fmt::format("linear: unsupported weight dtype {}", dtype_name(W.dtype)));
  }
}

std::int64_t round_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b * b; }

// uint16 elements of the AMX kernel's packed activations: groups of group_rows rows, kp / 32 tiles each.
std::size_t packed_activation_elements(std::int64_t rows, std::int64_t kp) {
  return static_cast<std::size_t>(amx_groups(rows) * (kp / 32) * tile_u16);
}

bool amx_part(LinearKernel k, const TensorView& W) { return W.dtype == DType::bf16 && k == LinearKernel::amx; }
bool panel_part(LinearKernel k, const TensorView& W) {
  return W.dtype == DType::bf16 && (k == LinearKernel::avx512 || k == LinearKernel::avx512bf16);
}

// The image a part brings, if it is in the layout this call's kernel reads.
const std::uint16_t* part_image(LinearKernel k, const LinearPart& p) {
  return p.image != nullptr && p.image_layout == weight_image_layout(k) ? p.image : nullptr;
}

}  // namespace

#if GDN_X86
bool detail::amx_permitted() noexcept {
  // Linux keeps AMX tile state off until a process asks for it (ARCH_REQ_XCOMP_PERM, XTILEDATA).
  constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
  return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}
#endif

LinearKernel linear_kernel() noexcept {
  static const LinearKernel k = detect_kernel();
  return k;
}

const char* linear_kernel_name() noexcept {
  switch (linear_kernel()) {
    case LinearKernel::amx: return "amx";
    case LinearKernel::avx512bf16: return "avx512bf16";
    case LinearKernel::avx512: return "avx512";
    case LinearKernel::avx2: return "avx2";
    default: return "scalar";
  }
}

void LinearWorkspace::reserve(std::int64_t rows, std::int64_t in, MatmulInput input) {
  rows = std::max<std::int64_t>(rows, 1);
  const std::int64_t kp = round_up(std::max<std::int64_t>(in, 1), 32);
  // The AMX kernel's tiles, or bf16 pairs (kp ≥ two per pair).
  get(std::max(packed_activation_elements(rows, kp), static_cast<std::size_t>(rows * kp)));
  if (input == MatmulInput::bf16) get_floats(static_cast<std::size_t>(rows * in));
  get_quantized(static_cast<std::size_t>(rows * quant_activation_stride(in)));
}

std::size_t LinearWorkspace::reserve_bytes(std::int64_t rows, std::int64_t in, MatmulInput input) {
  rows = std::max<std::int64_t>(rows, 1);
  const std::int64_t kp = round_up(std::max<std::int64_t>(in, 1), 32);
  std::size_t bytes = std::max(packed_activation_elements(rows, kp), static_cast<std::size_t>(rows * kp)) * sizeof(std::uint16_t);
  if (input == MatmulInput::bf16) bytes += static_cast<std::size_t>(rows * in) * sizeof(float);
  bytes += static_cast<std::size_t>(rows * quant_activation_stride(in)) + 64;
  return bytes;
}

void linear_multi(ThreadPool& pool, LinearWorkspace& ws, std::span<const LinearPart> parts, const float* x,
                  std::int64_t ldx, std::int64_t rows, MatmulInput input) {
  linear_multi(pool, ws, linear_kernel(), parts, x, ldx, rows, input);
}

void linear_multi(ThreadPool& pool, LinearWorkspace& ws, LinearKernel k, std::span<const LinearPart> parts,
                  const float* x, std::int64_t ldx, std::int64_t rows, MatmulInput input) {
  if (parts.empty() || rows <= 0) return;
  if (k > linear_kernel()) k = linear_kernel();
  const std::int64_t in = parts[0].w->dim(1);
  for (const auto& p : parts)
    if (p.w->dim(1) != in) throw Error(Status::internal, "linear_multi: parts have different input sizes");

  // bf16 inputs: the vdpbf16ps kernel takes them as packed pairs; every other kernel (and a part
  // whose weights are not bf16) runs its float32 arithmetic on the rounded values.
  const std::uint32_t* pairs = nullptr;
  if (input == MatmulInput::bf16) {
    bool dot = false, rounded = false;
    for (const auto& p : parts)
      if (!is_quantized(p.image_layout)) (panel_part(k, *p.w) && k == LinearKernel::avx512bf16 ? dot : rounded) = true;
    if (dot) {
      auto* xp = reinterpret_cast<std::uint32_t*>(ws.get(static_cast<std::size_t>(rows * 2 * detail::bf16_pairs_per_row(in))));
      pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) { detail::pack_bf16_pairs(x, ldx, r0, r1, in, xp); });
      pairs = xp;
    }
    if (rounded) {
      float* xr = ws.get_floats(static_cast<std::size_t>(rows * in));
      pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
        for (std::int64_t r = r0; r < r1; ++r)
          for (std::int64_t i = 0; i < in; ++i) xr[r * in + i] = to_float(to_bf16(x[r * ldx + i]));
      });
      x = xr;
      ldx = in;
    }
  }

  bool any_amx = false, any_quant = false;
  for (const auto& p : parts) {
    any_quant |= p.image != nullptr && is_quantized(p.image_layout);
    any_amx |= amx_part(k, *p.w) && !is_quantized(p.image_layout);
  }
  // Quantised weights: the activations are quantised once for every part (quant.hpp), by the
  // integer kernel that matches this call's kernel (a lowered kernel lowers it too).
  const QuantKernel qk = k == LinearKernel::scalar ? QuantKernel::scalar
                         : k == LinearKernel::avx2  ? std::min(QuantKernel::avx2, quant_kernel())
                                                    : quant_kernel();
  QuantActivations qx;
  if (any_quant) {
    const std::int64_t stride = quant_activation_stride(in);
    std::byte* buf = ws.get_quantized(static_cast<std::size_t>(rows * stride));
    pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) { quantize_activations(x, ldx, r0, r1, in, buf); });
    qx = QuantActivations{buf, in, round_up(in, 32), stride};
  }
  const std::uint64_t call = ws.begin_call();
  const std::int64_t kp = round_up(in, 32), steps = kp / 32;
  std::uint16_t* xp = nullptr;
  if (any_amx) {
    xp = ws.get(packed_activation_elements(rows, kp));
#if GDN_X86
    pool.parallel_for(amx_groups(rows), 1, [&](std::int64_t g0, std::int64_t g1, int) { pack_amx(x, ldx, rows, in, steps, g0, g1, xp); });
#endif
  }

  // Work items: ranges of output rows of each part (which rows share an item never changes a
  // result). The AVX-512 kernel runs every group of activation rows over a block of 32 weight rows
  // before the next block, so a range is a long sequential stream whatever the number of rows — a
  // quarter of each thread's share, at most 512 rows — which the prefetchers follow better than
  // many short ones. So is the AMX kernel's when it sweeps the weights once (batch ≤ 8); with up to
  // 32 rows every group pair sweeps the range again, so it is 32 rows, kept in L1/L2 between the
  // sweeps; with more (prefill) as many rows as fit in about 1 MiB of L2, reused by every group.
  std::int64_t range_rows = 64;
  const bool panels = k == LinearKernel::avx512 || k == LinearKernel::avx512bf16;
  if (panels || any_quant || (k == LinearKernel::amx && rows <= 2 * group_rows)) {
    std::int64_t total_rows = 0;
    for (const auto& p : parts) total_rows += p.w->dim(0);
    range_rows = std::clamp<std::int64_t>(total_rows / (4 * pool.size()) / 32 * 32, 32, 512);
  } else if (k == LinearKernel::amx) {
    range_rows = rows <= 32 ? 32 : std::clamp<std::int64_t>((std::int64_t{1} << 20) / (2 * in) / 32 * 32, 32, max_range_rows);
  }
  std::int64_t starts[16];
  std::int64_t total = 0;
  const std::size_t np = std::min<std::size_t>(parts.size(), 15);
  for (std::size_t i = 0; i < np; ++i) {
    starts[i] = total;
    total += (parts[i].w->dim(0) + range_rows - 1) / range_rows;
  }
  starts[np] = total;
  if (parts.size() > np) throw Error(Status::internal, "linear_multi: at most 15 parts");

  pool.parallel_for(total, 1, [&](std::int64_t b0, std::int64_t b1, int) {
    for (std::int64_t b = b0; b < b1; ++b) {
      std::size_t i = 0;
      while (b >= starts[i + 1]) ++i;
      const LinearPart& p = parts[i];
      const TensorView& W = *p.w;
      const std::int64_t out = W.dim(0);
      const std::int64_t n0 = (b - starts[i]) * range_rows, n1 = std::min(out, n0 + range_rows);
      if (p.image != nullptr && is_quantized(p.image_layout)) {
        quant_range(qk, quant_format(p.image_layout), reinterpret_cast<const std::byte*>(p.image), in, out, n0, n1, qx, rows, p.y, p.ldy);
        continue;
      }
#if GDN_X86
      if (amx_part(k, W)) {
        // The first range this thread runs in this call reloads the tile configuration.
        thread_local const LinearWorkspace* last_ws = nullptr;
        thread_local std::uint64_t last_call = 0;
        const bool fresh = last_ws != &ws || last_call != call;
        last_ws = &ws;
        last_call = call;
        amx_range(W.as<bf16>(), part_image(k, p), in, out, n0, n1, xp, steps, rows, p.y, p.ldy, fresh);
        continue;
      }
      if (panel_part(k, W)) {
        const detail::PanelInput pin{x, ldx, pairs};  // pairs: set only for the vdpbf16ps kernel
        detail::panel_range(W.as<bf16>(), part_image(k, p), in, out, n0, n1, pin, rows, p.y, p.ldy);
        continue;
      }
#endif
      float_block(k, W, x, ldx, rows, p.y, p.ldy, n0, n1);
    }
  });
}

void linear(ThreadPool& pool, LinearWorkspace& ws, const TensorView& W, const float* x, std::int64_t ldx,
            std::int64_t rows, float* y, std::int64_t ldy, MatmulInput input) {
  const LinearPart part{&W, y, ldy};
  linear_multi(pool, ws, std::span(&part, 1), x, ldx, rows, input);
}

WeightImage weight_image_layout(LinearKernel kernel) noexcept {
  switch (kernel) {
    case LinearKernel::amx: return WeightImage::amx_tiles;
    case LinearKernel::avx512bf16:
    case LinearKernel::avx512: return WeightImage::panels;
    default: return WeightImage::none;
  }
}

std::size_t weight_image_elements(WeightImage layout, std::int64_t out, std::int64_t in) noexcept {
  switch (layout) {
    case WeightImage::amx_tiles: return static_cast<std::size_t>(round_up(out, 32) * round_up(in, 32));
    case WeightImage::panels: return static_cast<std::size_t>(detail::panel_image_elements(out, in));
    case WeightImage::q8_0: return quant_image_bytes(QuantFormat::q8_0, out, in) / 2;
    case WeightImage::q5_0: return quant_image_bytes(QuantFormat::q5_0, out, in) / 2;
    case WeightImage::q4_0: return quant_image_bytes(QuantFormat::q4_0, out, in) / 2;
    case WeightImage::q4_k: return quant_image_bytes(QuantFormat::q4_k, out, in) / 2;
    default: return 0;
  }
}

void pack_weight_image(WeightImage layout, const TensorView& W, std::int64_t row0, std::int64_t row1,
                       std::uint16_t* image) {
  if (is_quantized(layout)) {
    return quantize_weight_image(quant_format(layout), W, row0, row1, reinterpret_cast<std::byte*>(image));
  }
  if (W.dtype != DType::bf16 || W.rank != 2) throw Error(Status::internal, "pack_weight_image: a rank-2 bf16 weight expected");
  const std::int64_t out = W.dim(0), in = W.dim(1);
  if (row0 % 32 != 0 || (row1 % 32 != 0 && row1 != out) || row0 > row1 || row1 > out)
    throw Error(Status::internal, "pack_weight_image: rows must be whole blocks of 32");
  if (layout == WeightImage::panels) return detail::pack_panel_image(W.as<bf16>(), out, in, row0, row1, image);
  if (layout != WeightImage::amx_tiles) throw Error(Status::internal, "pack_weight_image: no such layout");
  const std::int64_t steps = round_up(in, 32) / 32;
  // The last block of 32 rows includes its padding rows.
  const std::int64_t rb1 = row1 >= out ? round_up(out, 32) / 16 : row1 / 16;
  for (std::int64_t rb = row0 / 16; rb < rb1; ++rb)
    for (std::int64_t s = 0; s < steps; ++s)
      weight_tile_copy(W.as<bf16>(), in, out, rb * 16, s * 32, image + image_tile(rb, s, steps) * tile_u16);
}

void gather_row(const TensorView& table, std::int64_t row, float* out) {
  const std::int64_t dim = table.dim(1);
  switch (table.dtype) {
    case DType::bf16: {
      const bf16* s = table.as<bf16>() + row * dim;
      for (std::int64_t i = 0; i < dim; ++i) out[i] = to_float(s[i]);
      return;
    }
    case DType::f16: {
      const f16* s = table.as<f16>() + row * dim;
      for (std::int64_t i = 0; i < dim; ++i) out[i] = to_float(s[i]);
      return;
    }
    case DType::f32: std::memcpy(out, table.as<float>() + row * dim, static_cast<std::size_t>(dim) * sizeof(float)); return;
    default: throw Error(Status::internal, "gather_row: unsupported dtype");
  }
}

}  // namespace gdn::cpu
