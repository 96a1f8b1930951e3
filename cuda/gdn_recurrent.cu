#include "gdn_recurrent.cuh"

GDN_CUDA_NAMESPACE_BEGIN

cudaError_t gdn_recurrent(const GdnParams& p, int max_tokens, cudaStream_t stream) {
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.a == nullptr || p.b == nullptr || p.neg_exp_A == nullptr ||
      p.dt_bias == nullptr || p.state == nullptr || p.slots == nullptr || p.cu_seqlens == nullptr || p.out == nullptr)
    return cudaErrorInvalidValue;
  if (p.dk < 1 || p.dk > kernels::kRecMaxDk || p.dv < 1 || p.num_k_heads < 1 || p.num_v_heads < p.num_k_heads ||
      p.num_v_heads % p.num_k_heads != 0 || p.num_seqs < 0 || max_tokens < 0)
    return cudaErrorInvalidValue;
  if (max_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(p.dv, kernels::kRecColumns)), static_cast<unsigned>(p.num_v_heads),
                  static_cast<unsigned>(p.num_seqs));
  return detail::launch(kernels::gdn_recurrent_kernel, grid, dim3(kernels::kRecThreads), 0, stream, p);
}

cudaError_t select_snapshots(const SnapshotSelect& p, cudaStream_t stream) {
  if (p.pool == nullptr || p.slots == nullptr || p.snapshots == nullptr || p.keep == nullptr || p.num_seqs < 0 ||
      p.bytes < 0 || p.bytes % 16 != 0 || p.slot_stride_bytes % 16 != 0 || p.seq_stride_bytes % 16 != 0 ||
      p.token_stride_bytes % 16 != 0 || !detail::aligned(p.pool, 16) || !detail::aligned(p.snapshots, 16))
    return cudaErrorInvalidValue;
  const std::int64_t vectors = p.bytes / 16;
  const dim3 grid(static_cast<unsigned>((vectors + kernels::kSelectThreads - 1) / kernels::kSelectThreads),
                  static_cast<unsigned>(p.num_seqs));
  return detail::launch(kernels::select_snapshots_kernel, grid, dim3(kernels::kSelectThreads), 0, stream, p);
}

GDN_CUDA_NAMESPACE_END
