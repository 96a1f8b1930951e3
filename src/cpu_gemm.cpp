#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "gdn/backend/cpu/linear.hpp"
#include "gdn/core/error.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as uninitialised
// (a known false positive); nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace gdn::cpu {
namespace {

// Converts n weights to float.
template <typename W>
inline void widen(const W* src, float* dst, std::int64_t n) {
  if constexpr (std::is_same_v<W, float>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
  } else if constexpr (std::is_same_v<W, bf16>) {
    std::int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
#endif
    for (; i < n; ++i) dst[i] = to_float(src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
  }
}

#if defined(__AVX512F__)
template <typename W>
inline __m512 load16(const W* p) {
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
inline __m512 load16_masked(const W* p, __mmask16 m) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (std::is_same_v<W, bf16>) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
}
#endif

// One tile: R activation rows against N weight rows starting at n0. Every output element is the
// same sequence of operations whatever the tile shape (16 lanes accumulate k ≡ lane mod 16 in
// order, the tail through masked loads, then one horizontal sum), so a row's result never depends
// on how many other rows share the step: batched decode is bit-identical to single decode.
template <typename W, int R, int N>
inline void dot_tile(const W* w, std::int64_t in, const float* x, std::int64_t ldx, float* y, std::int64_t ldy,
                     std::int64_t n0) {
#if defined(__AVX512F__)
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
#else
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < N; ++j) {
      float lanes[16] = {};
      const W* wr = w + (n0 + j) * in;
      for (std::int64_t k = 0; k < in; ++k) lanes[k % 16] += to_float(wr[k]) * x[r * ldx + k];
      float s = 0.0f;
      for (float l : lanes) s += l;
      y[r * ldy + n0 + j] = s;
    }
#endif
}

template <typename W, int N>
inline void rows_tile(const W* w, std::int64_t in, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
                      std::int64_t ldy, std::int64_t n0) {
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4) dot_tile<W, 4, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
  for (; r + 2 <= rows; r += 2) dot_tile<W, 2, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
  for (; r < rows; ++r) dot_tile<W, 1, N>(w, in, x + r * ldx, ldx, y + r * ldy, ldy, n0);
}

template <typename W>
void linear_typed(ThreadPool& pool, const W* w, std::int64_t out, std::int64_t in, const float* x, std::int64_t ldx,
                  std::int64_t rows, float* y, std::int64_t ldy) {
  // Output rows are split across threads in blocks small enough to stay in L2 while every
  // activation row passes over them; decode (few rows) streams each weight row exactly once.
  constexpr std::int64_t block = 64;
  const std::int64_t blocks = (out + block - 1) / block;
  pool.parallel_for(blocks, 1, [&](std::int64_t b0, std::int64_t b1, int) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t n_end = std::min(out, (b + 1) * block);
      std::int64_t n = b * block;
      for (; n + 4 <= n_end; n += 4) rows_tile<W, 4>(w, in, x, ldx, rows, y, ldy, n);
      for (; n < n_end; ++n) rows_tile<W, 1>(w, in, x, ldx, rows, y, ldy, n);
    }
  });
}

}  // namespace

void linear(ThreadPool& pool, const TensorView& W, const float* x, std::int64_t ldx,
            std::int64_t rows, float* y, std::int64_t ldy) {
  const std::int64_t out = W.dim(0);
  const std::int64_t in = W.dim(1);
  switch (W.dtype) {
    case DType::bf16: return linear_typed(pool, W.as<bf16>(), out, in, x, ldx, rows, y, ldy);
    case DType::f16: return linear_typed(pool, W.as<f16>(), out, in, x, ldx, rows, y, ldy);
    case DType::f32: return linear_typed(pool, W.as<float>(), out, in, x, ldx, rows, y, ldy);
    default: throw Error(Status::internal, fmt::format("linear: unsupported weight dtype {}", dtype_name(W.dtype)));
  }
}

void gather_row(const TensorView& table, std::int64_t row, float* out) {
  const std::int64_t dim = table.dim(1);
  switch (table.dtype) {
    case DType::bf16: return widen(table.as<bf16>() + row * dim, out, dim);
    case DType::f16: return widen(table.as<f16>() + row * dim, out, dim);
    case DType::f32: return widen(table.as<float>() + row * dim, out, dim);
    default: throw Error(Status::internal, "gather_row: unsupported dtype");
  }
}

}  // namespace gdn::cpu
