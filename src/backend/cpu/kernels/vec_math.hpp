// Vectorised float helpers for the CPU kernels: dot products, axpy, and exp / SiLU / sigmoid over
// arrays. A fragment of a target region (target_begin.hpp): compiled once per CPU target, with the
// AVX-512 paths in the avx512 target and plain loops (which the compiler vectorises for the
// target's vector unit) elsewhere.
//
// Every function is a fixed sequence of operations for a given length, so a row's result never
// depends on which other rows are processed with it. exp is the Cephes single-precision
// polynomial (≤ 2 ulp on its range, clamped to [-87.3, 88.7] like expf's finite range); SiLU and
// sigmoid use it in the forms torch uses, x / (1 + e^-x) and 1 / (1 + e^-x).

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

namespace vec {


#if GDN_CPU_AVX512
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#endif

#if GDN_CPU_AVX2 && !GDN_CPU_AVX512
// exp16's operations in 8 lanes; AVX2 has no scalef, so 2^n is applied as exp1 applies it (below).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.72283f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
#endif

// 2^n for an integer n ∈ [-126, 127], built from its exponent bits.
inline float pow2i(int n) {
  const std::uint32_t bits = static_cast<std::uint32_t>(n + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Written so that the compiler vectorises the plain loops that call it (on targets without an
// explicit vector path): comparisons instead of fmin/fmax calls (NaN → the bound, as fmax and
// the AVX-512 max give), and 2^n as two exact power-of-two products instead of ldexp — p·2^⌊n/2⌋
// is exact and normal, the second product rounds once, so the result is ldexp's (and scalef's).
inline float exp1(float x) {
  x = x > -87.33654f ? x : -87.33654f;
  x = x < 88.72283f ? x : 88.72283f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r + 1.0f);
  const int ni = static_cast<int>(n), n1 = ni >> 1;
  return p * pow2i(n1) * pow2i(ni - n1);
}

// x[i] = exp(x[i] - shift); returns the sum of the results (fixed order).
inline float exp_shift_sum(float* x, std::int64_t n, float shift) {
  std::int64_t i = 0;
  float total = 0.0f;
#if GDN_CPU_AVX512
  __m512 acc = _mm512_setzero_ps();
  const __m512 s = _mm512_set1_ps(shift);
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s));
    _mm512_mask_storeu_ps(x + i, m, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    i = n;
  }
  total = _mm512_reduce_add_ps(acc);
#elif GDN_CPU_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (const float l : lanes) total += l;
#endif
  for (; i < n; ++i) total += x[i] = exp1(x[i] - shift);
  return total;
}

// g[i] = silu(g[i]) * u[i]  (SwiGLU)
inline void silu_mul(float* g, const float* u, std::int64_t n) {
  std::int64_t i = 0;
#if GDN_CPU_AVX512
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
  }
#endif
  for (; i < n; ++i) g[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
}

// x[i] = silu(x[i])
inline void silu_inplace(float* x, std::int64_t n) {
  std::int64_t i = 0;
#if GDN_CPU_AVX512
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(x + i, _mm512_div_ps(v, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v)))));
  }
#endif
  for (; i < n; ++i) x[i] = x[i] / (1.0f + exp1(-x[i]));
}

// o[i] *= sigmoid(gate[i])
inline void mul_sigmoid(float* o, const float* gate, std::int64_t n) {
  std::int64_t i = 0;
#if GDN_CPU_AVX512
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 z = _mm512_loadu_ps(gate + i);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), z))));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), s));
  }
#endif
  for (; i < n; ++i) o[i] *= 1.0f / (1.0f + exp1(-gate[i]));
}

// y[i] = x[i] * r * w[i] * silu(z[i])  (the GDN gated norm, after its rms factor r)
inline void scale_silu_gate(const float* x, float r, const float* w, const float* z, float* y, std::int64_t n) {
  std::int64_t i = 0;
#if GDN_CPU_AVX512
  const __m512 one = _mm512_set1_ps(1.0f), rv = _mm512_set1_ps(r);
  for (; i + 16 <= n; i += 16) {
    const __m512 zz = _mm512_loadu_ps(z + i);
    const __m512 s = _mm512_div_ps(zz, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), zz))));
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), rv), _mm512_loadu_ps(w + i)), s);
    _mm512_storeu_ps(y + i, v);
  }
#endif
  for (; i < n; ++i) y[i] = x[i] * r * w[i] * (z[i] / (1.0f + exp1(-z[i])));
}

// Σ a[i]·b[i] in a fixed order (4 interleaved 16-lane partial sums on AVX-512).
inline float dot(const float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  float total = 0.0f;
#if GDN_CPU_AVX512
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    i = n;
  }
  total = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
#else
  float lanes[16] = {};
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lanes[j] += a[i + j] * b[i + j];
  for (int j = 0; j < 16; ++j) total += lanes[j];
#endif
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// y[i] += a · x[i]
inline void axpy(float* y, float a, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

inline void scale(float* y, float a, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] *= a;
}

#if GDN_CPU_AVX512
// The float vector gemm_bcast works in: 16 lanes, 4 of them side by side per accumulator row.
struct FloatLanes {
  using V = __m512;
  static constexpr int width = 16, wide = 4;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
#elif GDN_CPU_AVX2
// 8 lanes, 2 side by side: 4 rows × 16 columns of accumulators, the B row and the broadcast fit
// AVX2's 16 registers.
struct FloatLanes {
  using V = __m256;
  static constexpr int width = 8, wide = 2;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif

// C[i][n] = (accumulate ? cscale·C[i][n] : 0) + Σ_k a(i, k)·B[k][n] for i < M, n < N: a small
// register-blocked matrix product (4 rows × 64 columns of accumulators on AVX-512, 4 × 16 on AVX2)
// for the chunked delta rule, where A's elements come from a functor (strided, scaled or masked
// views need no copy). Each C element is C·cscale, then one FMA per k in order, on every target;
// results depend only on the operands, not on M.
template <typename AF>
inline void gemm_bcast(int M, int N, int K, AF&& a, const float* B, std::int64_t ldb, float* C, std::int64_t ldc,
                       bool accumulate, float cscale = 1.0f) {
  int n = 0;
#if GDN_CPU_AVX2
  using L = FloatLanes;
  const auto block = [&]<int MI, int NB>(int i0, int n0) {
    typename L::V acc[MI][NB];
    for (int i = 0; i < MI; ++i)
      for (int v = 0; v < NB; ++v)
        acc[i][v] = accumulate ? L::mul(L::load(C + (i0 + i) * ldc + n0 + L::width * v), L::set1(cscale)) : L::zero();
    for (int k = 0; k < K; ++k) {
      typename L::V b[NB];
      for (int v = 0; v < NB; ++v) b[v] = L::load(B + k * ldb + n0 + L::width * v);
      for (int i = 0; i < MI; ++i) {
        const typename L::V av = L::set1(a(i0 + i, k));
        for (int v = 0; v < NB; ++v) acc[i][v] = L::fma(av, b[v], acc[i][v]);
      }
    }
    for (int i = 0; i < MI; ++i)
      for (int v = 0; v < NB; ++v) L::store(C + (i0 + i) * ldc + n0 + L::width * v, acc[i][v]);
  };
  const auto rows = [&]<int NB>(int n0) {
    int i = 0;
    for (; i + 4 <= M; i += 4) block.template operator()<4, NB>(i, n0);
    for (; i < M; ++i) block.template operator()<1, NB>(i, n0);
  };
  for (; n + L::wide * L::width <= N; n += L::wide * L::width) rows.template operator()<L::wide>(n);
  for (; n + L::width <= N; n += L::width) rows.template operator()<1>(n);
#endif
  if (n < N) {
    for (int i = 0; i < M; ++i)
      for (int c = n; c < N; ++c) {
        float acc = accumulate ? cscale * C[i * ldc + c] : 0.0f;
        for (int k = 0; k < K; ++k) acc += a(i, k) * B[k * ldb + c];
        C[i * ldc + c] = acc;
      }
  }
}

}  // namespace vec
