#pragma once
// RMS normalisation, in the two conventions of the Qwen3.5 family (the classic trap):
//  - zero-centred (Qwen3_5RMSNorm): y = x·rsqrt(mean(x²)+eps)·(1 + w); stored w is near 0. Used by
//    the input/post-attention/final norms, q_norm/k_norm and every MTP norm. Callers pass
//    scale = 1 + w, precomputed in float32 at load exactly as transformers does per call.
//  - gated (RMSNormGated, the GDN output norm): y = x·rsqrt(mean(x²)+eps)·w·silu(z); stored w is
//    near 1 and used as is.

#include <cmath>
#include <cstdint>

#include "gdn/backend/cpu/vec_math.hpp"
#include "gdn/layers/activations.hpp"

namespace gdn::layers {

template <typename Acc = float>
inline Acc inverse_rms(const float* x, std::int64_t n, float eps) {
  Acc sum[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) sum[j] += static_cast<Acc>(x[i + j]) * static_cast<Acc>(x[i + j]);
  Acc total = 0;
  for (int j = 0; j < 8; ++j) total += sum[j];
  for (; i < n; ++i) total += static_cast<Acc>(x[i]) * static_cast<Acc>(x[i]);
  return Acc(1) / std::sqrt(total / static_cast<Acc>(n) + static_cast<Acc>(eps));
}

// Zero-centred convention; `scale` holds 1 + w.
inline void rms_norm(const float* x, const float* scale, float* y, std::int64_t n, float eps) {
  const float r = inverse_rms(x, n, eps);
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * r * scale[i];
}

// Gated convention: norm first, then the plain weight, then the SiLU gate.
inline void rms_norm_gated(const float* x, const float* z, const float* w, float* y, std::int64_t n, float eps) {
  const float r = inverse_rms(x, n, eps);
  cpu::vec::scale_silu_gate(x, r, w, z, y, n);
}

}  // namespace gdn::layers
