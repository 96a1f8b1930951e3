// The causal depthwise conv of a GDN layer and the q/k L2 normalisation. A fragment of a target
// region.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

// Causal depthwise conv + SiLU over one sequence's rows, continuing from (and updating) its conv
// state, for channels [c0, c1). state: [K-1][C] oldest first; taps w[j*C + c], j = K-1 multiplies
// the current token.
inline void causal_conv1d_silu(const float* w, int K, std::int64_t C, const float* in, std::int64_t ld_in, std::int64_t n,
                               float* state, float* out, std::int64_t ld_out, std::int64_t c0, std::int64_t c1) {
  const int H = K - 1;  // history length
  for (std::int64_t t = 0; t < n; ++t) {
    // Tap by tap over a run of channels (vectorisable), same summation order per channel.
    float* o = out + t * ld_out;
    std::fill(o + c0, o + c1, 0.0f);
    for (int j = 0; j < K; ++j) {
      const std::int64_t src = t - H + j;  // row index; negative means history
      const float* u = src >= 0 ? in + src * ld_in : state + (H + src) * C;
      const float* wj = w + j * C;
      for (std::int64_t c = c0; c < c1; ++c) o[c] += wj[c] * u[c];
    }
    vec::silu_inplace(o + c0, c1 - c0);
  }
  // New history: the last H raw inputs of [state ; in].
  for (int h = 0; h < H; ++h) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t src = n - H + h;
      state[h * C + c] = src >= 0 ? in[src * ld_in + c] : state[(h + n) * C + c];
    }
  }
}

inline void l2_normalize(float* x, int n, float scale) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  const float r = scale / std::sqrt(s + 1e-6f);  // eps fixed at 1e-6 in the reference, not rms_norm_eps
  for (int i = 0; i < n; ++i) x[i] *= r;
}
