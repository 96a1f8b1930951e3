// RMS normalisation, in the two conventions of the Qwen3.5 family (the classic trap):
//  - zero-centred (Qwen3_5RMSNorm): y = x·rsqrt(mean(x²)+eps)·(1 + w); stored w is near 0. Used by
//    the input/post-attention/final norms, q_norm/k_norm and every MTP norm. Callers pass
//    scale = 1 + w, precomputed in float32 at load exactly as transformers does per call.
//  - gated (RMSNormGated, the GDN output norm): y = x·rsqrt(mean(x²)+eps)·w·silu(z); stored w is
//    near 1 and used as is.
// A fragment of a target region.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

inline float inverse_rms(const float* x, std::int64_t n, float eps) {
  float sum[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) sum[j] += x[i + j] * x[i + j];
  float total = 0;
  for (int j = 0; j < 8; ++j) total += sum[j];
  for (; i < n; ++i) total += x[i] * x[i];
  return 1.0f / std::sqrt(total / static_cast<float>(n) + eps);
}

// Zero-centred convention; `scale` holds 1 + w.
inline void rms_norm(const float* x, const float* scale, float* y, std::int64_t n, float eps) {
  const float r = inverse_rms(x, n, eps);
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * r * scale[i];
}

// Gated convention: norm first, then the plain weight, then the SiLU gate.
inline void rms_norm_gated(const float* x, const float* z, const float* w, float* y, std::int64_t n, float eps) {
  const float r = inverse_rms(x, n, eps);
  vec::scale_silu_gate(x, r, w, z, y, n);
}
