// Partial rotary position embedding, NeoX pairing. Only the first rotary_dim dims of each head
// rotate; dim i pairs with i + rotary_dim/2 (not head_dim/2). Qwen3.5's interleaved mRoPE reduces to
// this for text, since its three position streams are then equal. The inverse frequencies
// theta^(−2i/rotary_dim) are computed once (in double, rounded to float) by the backend.
// A fragment of a target region.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

// cos/sin of every frequency at `position`, as transformers computes them: angle in float32.
inline void rope_angles(const float* inv_freq, int half, std::int64_t position, float* cos_out, float* sin_out) {
  const float p = static_cast<float>(position);
  for (int i = 0; i < half; ++i) {
    const float a = p * inv_freq[i];
    cos_out[i] = std::cos(a);
    sin_out[i] = std::sin(a);
  }
}

// Rotates one head in place.
inline void rope_apply(float* head, const float* cos_v, const float* sin_v, int half) {
  for (int i = 0; i < half; ++i) {
    const float x1 = head[i];
    const float x2 = head[i + half];
    head[i] = x1 * cos_v[i] - x2 * sin_v[i];
    head[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
  }
}
