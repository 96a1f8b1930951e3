// Scalar activations with the exact forms torch uses in float32. A fragment of a target region.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with its default threshold of 20: linear above it.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
