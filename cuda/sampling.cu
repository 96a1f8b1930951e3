#include "sampling.cuh"

GDN_CUDA_NAMESPACE_BEGIN

cudaError_t sample(const SampleParams& p, cudaStream_t stream) {
  if (p.logits == nullptr || p.rows < 0 || p.vocab < 1 || p.ld_logits < p.vocab || p.temperature == nullptr ||
      p.top_k == nullptr || p.top_p == nullptr || p.min_p == nullptr || p.uniforms == nullptr || p.tokens == nullptr ||
      (p.probs != nullptr && p.ld_probs < p.vocab))
    return cudaErrorInvalidValue;
  return detail::launch(kernels::sample_kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kernels::kSampleThreads), 0,
                        stream, p);
}

cudaError_t argmax(const float* logits, std::int64_t ld_logits, int rows, int vocab, std::int32_t* tokens,
                   cudaStream_t stream) {
  if (logits == nullptr || tokens == nullptr || rows < 0 || vocab < 1 || ld_logits < vocab) return cudaErrorInvalidValue;
  return detail::launch(kernels::argmax_kernel, dim3(static_cast<unsigned>(rows)), dim3(kernels::kSampleThreads), 0,
                        stream, logits, ld_logits, vocab, tokens);
}

GDN_CUDA_NAMESPACE_END
