#include "conv1d.cuh"

GDN_CUDA_NAMESPACE_BEGIN
namespace {

bool valid(const Conv1dParams& p) {
  return p.x != nullptr && p.weight != nullptr && p.out != nullptr && p.state != nullptr && p.slots != nullptr &&
         p.cu_seqlens != nullptr && p.channels > 0 && p.num_seqs >= 0 && p.ld_x >= p.channels &&
         p.ld_out >= p.channels && p.kernel_size == 4;
}

cudaError_t run(const Conv1dParams& p, int tokens_per_block, int runs, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(p.channels, kernels::kConvThreads)),
                  static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(runs));
  return detail::launch(kernels::causal_conv1d_kernel<4>, grid, dim3(kernels::kConvThreads), 0, stream, p,
                        tokens_per_block);
}

}  // namespace

cudaError_t causal_conv1d_prefill(const Conv1dParams& p, int max_seqlen, cudaStream_t stream) {
  if (!valid(p) || max_seqlen < 0 || p.snapshots != nullptr) return cudaErrorInvalidValue;
  constexpr int run_tokens = 64;  // ≥ K − 1, as the kernel requires
  return run(p, run_tokens, detail::ceil_div(max_seqlen, run_tokens), stream);
}

cudaError_t causal_conv1d_update(const Conv1dParams& p, int max_tokens, cudaStream_t stream) {
  if (!valid(p) || max_tokens < 1 || max_tokens > 16) return cudaErrorInvalidValue;
  return run(p, max_tokens, 1, stream);
}

GDN_CUDA_NAMESPACE_END
