#include "gdn_chunked.cuh"

GDN_CUDA_NAMESPACE_BEGIN

std::size_t gdn_chunked_workspace_bytes(std::int64_t rows, int num_v_heads) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(num_v_heads) * kernels::kWsRecord * sizeof(float);
}

cudaError_t gdn_chunked(const GdnParams& p, int max_seqlen, float* workspace, cudaStream_t stream) {
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.a == nullptr || p.b == nullptr || p.neg_exp_A == nullptr ||
      p.dt_bias == nullptr || p.state == nullptr || p.slots == nullptr || p.cu_seqlens == nullptr || p.out == nullptr ||
      workspace == nullptr || p.snapshots != nullptr)
    return cudaErrorInvalidValue;
  if (p.dk < 1 || p.dk > kernels::kChunkMaxDk || p.dv < 1 || p.num_k_heads < 1 || p.num_v_heads < p.num_k_heads ||
      p.num_v_heads % p.num_k_heads != 0 || p.num_seqs < 0 || max_seqlen < 0)
    return cudaErrorInvalidValue;
  if (max_seqlen == 0 || p.num_seqs == 0) return cudaSuccess;
  const unsigned Hv = static_cast<unsigned>(p.num_v_heads), N = static_cast<unsigned>(p.num_seqs);
  const dim3 block(kernels::kChunkThreads);
  const dim3 grid1(static_cast<unsigned>(detail::ceil_div(max_seqlen, kernels::kChunk)), Hv, N);
  cudaError_t e = detail::launch(kernels::gdn_chunk_prepare_kernel, grid1, block,
                                 kernels::kPrepareSmemFloats * sizeof(float), stream, p, workspace);
  if (e != cudaSuccess) return e;
  const dim3 grid2(static_cast<unsigned>(detail::ceil_div(p.dv, kernels::kChunkColumns)), Hv, N);
  const std::size_t staged = kernels::kStateSmemFloats * sizeof(float);
  const std::size_t unstaged = (kernels::kStateSmemFloats - kernels::kStateTSmemFloats) * sizeof(float);
  std::size_t limit = 0;
  e = detail::max_dynamic_smem(limit);
  if (e != cudaSuccess) return e;
  if (staged <= limit)
    return detail::launch(kernels::gdn_chunk_state_kernel<true>, grid2, block, staged, stream, p,
                          static_cast<const float*>(workspace));
  return detail::launch(kernels::gdn_chunk_state_kernel<false>, grid2, block, unstaged, stream, p,
                        static_cast<const float*>(workspace));
}

GDN_CUDA_NAMESPACE_END
