// q4_k's fit of a block's d and m (quant.hpp): the scalar definition, and the same operations on
// AVX-512 with one super-block's 8 blocks in the 8 lanes, which give the same bits.
//
// Why lanes are blocks, not a block's 32 values: the fit's sums are sequential double sums, and
// summing them in another order would give other bits on another CPU; one block per lane keeps
// every operation of the definition in its order, so an image packed on any x86-64 CPU is byte for
// byte the same. This file is compiled with -ffp-contract=off (CMakeLists.txt): a multiply and an
// add fused into one FMA would round once instead of twice.
//
// The fit costs 43 passes over the block (21 candidates, each refitted by least squares and then
// scored, and the first guess scored), each a chain of dependent double adds: one block at a time
// the chains' latency bounds it (about 3 µs per block on Zen 4), eight side by side share it.

#include <algorithm>
#include <cmath>

#include "gemm_internal.hpp"  // GDN_X86
#include "quant.hpp"

#if GDN_X86
#include <immintrin.h>
#define GDN_T_FIT __attribute__((target("avx512f,avx512vl,avx2,avx")))
// GCC 12's _mm512_cvtps_pd reads an undefined vector of its own (as in gemm_quant.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace gdn::cpu {
namespace {

using detail::round_even;
constexpr float fit_nmax = 15.0f;
constexpr int fit_candidates = 21;

// The candidates' inverse steps: (nmax − 1 + 0.1 · step) in float, as the definition computes them.
inline float candidate_steps(int step) { return (fit_nmax - 1.0f) + 0.1f * static_cast<float>(step); }

}  // namespace

void fit_q4k_block(const float* w, int n, float& d_out, float& m_out) {
  float lo = 0.0f, hi = 0.0f, sum2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
    sum2 += w[i] * w[i];
  }
  d_out = 0.0f;
  m_out = -lo;
  if (!(hi > lo)) return;  // all zero (the range always holds 0): q = 0, m = 0
  const float av = std::sqrt(sum2 / static_cast<float>(n));
  float wt[32];
  double sw = 0, sx = 0;  // the same for every candidate
  for (int i = 0; i < n; ++i) {
    wt[i] = av + std::fabs(w[i]);
    sw += wt[i];
    sx += wt[i] * w[i];
  }
  // Weighted squared error of (d, m0), m0 = -m ≤ 0, with q rounded against them.
  auto error = [&](float d, float m0) {
    double e = 0.0;
    for (int i = 0; i < n; ++i) {
      const float q = std::clamp(round_even((w[i] - m0) / d), 0.0f, fit_nmax);
      const double r = static_cast<double>(q * d + m0 - w[i]);
      e += wt[i] * r * r;
    }
    return e;
  };
  float best_d = (hi - lo) / fit_nmax, best_m0 = lo;
  double best = error(best_d, best_m0);
  for (int step = 0; step < fit_candidates; ++step) {
    const float iscale = candidate_steps(step) / (hi - lo);
    double sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      const double q = std::clamp(round_even(iscale * (w[i] - lo)), 0.0f, fit_nmax);
      sl += wt[i] * q;
      sl2 += wt[i] * q * q;
      sxl += wt[i] * w[i] * q;
    }
    const double det = sw * sl2 - sl * sl;
    if (!(det > 0.0)) continue;
    double d = (sw * sxl - sx * sl) / det, m0 = (sl2 * sx - sl * sxl) / det;
    if (m0 > 0.0) {  // the offset may only lower the values (m ≥ 0): refit d alone
      m0 = 0.0;
      d = sxl / sl2;
    }
    if (!(d > 0.0)) continue;
    const double e = error(static_cast<float>(d), static_cast<float>(m0));
    if (e < best) {
      best = e;
      best_d = static_cast<float>(d);
      best_m0 = static_cast<float>(m0);
    }
  }
  d_out = best_d;
  m_out = -best_m0;
}

#if GDN_X86
namespace {

// Every step below is one of fit_q4k_block's, on 8 blocks: floats in a ymm, doubles in a zmm, a
// branch a blend. `a ? b : c` of the definition is select(a, b, c).
GDN_T_FIT inline __m256 select(__m256 mask, __m256 yes, __m256 no) { return _mm256_blendv_ps(no, yes, mask); }
GDN_T_FIT inline __m256 lt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
GDN_T_FIT inline __m256 neg(__m256 v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f)); }

// detail::round_even, lane by lane.
GDN_T_FIT inline __m256 round_even8(__m256 v) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 pos = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
  const __m256 negv = neg(_mm256_sub_ps(_mm256_add_ps(neg(v), magic), magic));
  return select(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ), pos, negv);
}

// std::clamp(v, 0, 15) = min(max(v, 0), 15), with std::max(a, b) = a < b ? b : a and
// std::min(a, b) = b < a ? b : a.
GDN_T_FIT inline __m256 clamp_q(__m256 v) {
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(fit_nmax);
  const __m256 m = select(lt(v, zero), zero, v);
  return select(lt(top, m), top, m);
}

struct Lanes {
  __m256 w[32];
  __m512d wt_d[32];  // the weights wt as double, and wt · w (a float product) as double
  __m512d wtw_d[32];
};

GDN_T_FIT __m512d error8(const Lanes& L, __m256 d, __m256 m0) {
  __m512d e = _mm512_setzero_pd();
  for (int i = 0; i < 32; ++i) {
    const __m256 q = clamp_q(round_even8(_mm256_div_ps(_mm256_sub_ps(L.w[i], m0), d)));
    const __m512d r = _mm512_cvtps_pd(_mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(q, d), m0), L.w[i]));
    e = _mm512_add_pd(e, _mm512_mul_pd(_mm512_mul_pd(L.wt_d[i], r), r));
  }
  return e;
}

GDN_T_FIT void fit_q4k_8(const float (*w)[32], float* d_out, float* m_out) {
  Lanes L;
  const __m256i lane = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
  for (int i = 0; i < 32; ++i) L.w[i] = _mm256_i32gather_ps(&w[0][i], lane, 4);  // value i of each block
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(), sum2 = _mm256_setzero_ps();
  for (int i = 0; i < 32; ++i) {
    lo = select(lt(L.w[i], lo), L.w[i], lo);
    hi = select(lt(hi, L.w[i]), L.w[i], hi);
    sum2 = _mm256_add_ps(sum2, _mm256_mul_ps(L.w[i], L.w[i]));
  }
  const __m256 range = _mm256_sub_ps(hi, lo);
  const __m256 av = _mm256_sqrt_ps(_mm256_div_ps(sum2, _mm256_set1_ps(32.0f)));
  __m512d sw = _mm512_setzero_pd(), sx = _mm512_setzero_pd();
  for (int i = 0; i < 32; ++i) {
    const __m256 wt = _mm256_add_ps(av, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), L.w[i]));
    L.wt_d[i] = _mm512_cvtps_pd(wt);
    L.wtw_d[i] = _mm512_cvtps_pd(_mm256_mul_ps(wt, L.w[i]));
    sw = _mm512_add_pd(sw, L.wt_d[i]);
    sx = _mm512_add_pd(sx, L.wtw_d[i]);
  }
  __m256 best_d = _mm256_div_ps(range, _mm256_set1_ps(fit_nmax)), best_m0 = lo;
  __m512d best = error8(L, best_d, best_m0);
  const __m512d dzero = _mm512_setzero_pd();
  for (int step = 0; step < fit_candidates; ++step) {
    const __m256 iscale = _mm256_div_ps(_mm256_set1_ps(candidate_steps(step)), range);
    __m512d sl = dzero, sl2 = dzero, sxl = dzero;
    for (int i = 0; i < 32; ++i) {
      const __m512d q = _mm512_cvtps_pd(clamp_q(round_even8(_mm256_mul_ps(iscale, _mm256_sub_ps(L.w[i], lo)))));
      const __m512d wq = _mm512_mul_pd(L.wt_d[i], q);
      sl = _mm512_add_pd(sl, wq);
      sl2 = _mm512_add_pd(sl2, _mm512_mul_pd(wq, q));
      sxl = _mm512_add_pd(sxl, _mm512_mul_pd(L.wtw_d[i], q));
    }
    const __m512d det = _mm512_sub_pd(_mm512_mul_pd(sw, sl2), _mm512_mul_pd(sl, sl));
    __m512d d = _mm512_div_pd(_mm512_sub_pd(_mm512_mul_pd(sw, sxl), _mm512_mul_pd(sx, sl)), det);
    __m512d m0 = _mm512_div_pd(_mm512_sub_pd(_mm512_mul_pd(sl2, sx), _mm512_mul_pd(sl, sxl)), det);
    const __mmask8 refit = _mm512_cmp_pd_mask(m0, dzero, _CMP_GT_OQ);
    m0 = _mm512_mask_blend_pd(refit, m0, dzero);
    d = _mm512_mask_blend_pd(refit, d, _mm512_div_pd(sxl, sl2));
    const __mmask8 ok = _mm512_cmp_pd_mask(det, dzero, _CMP_GT_OQ) & _mm512_cmp_pd_mask(d, dzero, _CMP_GT_OQ);
    if (ok == 0) continue;
    const __m256 df = _mm512_cvtpd_ps(d), m0f = _mm512_cvtpd_ps(m0);
    const __m512d e = error8(L, df, m0f);
    const __mmask8 better = ok & _mm512_cmp_pd_mask(e, best, _CMP_LT_OQ);
    best = _mm512_mask_blend_pd(better, best, e);
    best_d = _mm256_mask_blend_ps(better, best_d, df);
    best_m0 = _mm256_mask_blend_ps(better, best_m0, m0f);
  }
  // All-zero blocks (hi ≤ lo): d = 0, m = −lo.
  const __m256 flat = _mm256_cmp_ps(hi, lo, _CMP_NGT_UQ);
  _mm256_storeu_ps(d_out, select(flat, _mm256_setzero_ps(), best_d));
  _mm256_storeu_ps(m_out, neg(select(flat, lo, best_m0)));
}

}  // namespace
#endif

void fit_q4k_blocks(QuantKernel k, const float (*w)[32], const int* n, int count, float* d, float* m) {
#if GDN_X86
  if (count == 8 && k >= QuantKernel::avx512vnni && std::all_of(n, n + 8, [](int v) { return v == 32; })) {
    fit_q4k_8(w, d, m);
    return;
  }
#endif
  for (int b = 0; b < count; ++b) fit_q4k_block(w[b], n[b], d[b], m[b]);
}

}  // namespace gdn::cpu
