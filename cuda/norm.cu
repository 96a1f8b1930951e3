#include <algorithm>

#include "norm.cuh"

GDN_CUDA_NAMESPACE_BEGIN

cudaError_t rmsnorm(const bf16* x, std::int64_t ld_x, bf16* residual, std::int64_t ld_residual, const float* weight,
                    float weight_offset, bf16* y, std::int64_t ld_y, int rows, int n, float eps, cudaStream_t stream) {
  if (x == nullptr || weight == nullptr || y == nullptr || rows < 0 || n < 1 || ld_x < n || ld_y < n ||
      (residual != nullptr && ld_residual < n))
    return cudaErrorInvalidValue;
  const bool vec = n % 8 == 0 && ld_x % 8 == 0 && ld_y % 8 == 0 && detail::aligned(x, 16) && detail::aligned(y, 16) &&
                   (residual == nullptr || (ld_residual % 8 == 0 && detail::aligned(residual, 16)));
  // A warp per 32 vectors of the row, up to kNormThreads (a 64-wide fixture row needs one warp,
  // a 5120-wide one all eight).
  const int vectors = detail::ceil_div(n, vec ? 8 : 1);
  const int threads = detail::imin(kernels::kNormThreads, detail::ceil_div(vectors, detail::kWarp) * detail::kWarp);
  const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(threads));
  return vec ? detail::launch(kernels::rmsnorm_kernel<8>, grid, block, 0, stream, x, ld_x, residual, ld_residual, weight,
                              weight_offset, y, ld_y, n, eps)
             : detail::launch(kernels::rmsnorm_kernel<1>, grid, block, 0, stream, x, ld_x, residual, ld_residual, weight,
                              weight_offset, y, ld_y, n, eps);
}

cudaError_t rmsnorm_gated(const bf16* x, std::int64_t ld_x, const bf16* z, std::int64_t ld_z, const float* weight,
                          bf16* y, std::int64_t ld_y, int rows, int heads, int head_dim, float eps, cudaStream_t stream) {
  if (x == nullptr || z == nullptr || weight == nullptr || y == nullptr || rows < 0 || heads < 1 || head_dim < 1)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(detail::ceil_div(heads, 4)));
  return detail::launch(kernels::rmsnorm_gated_kernel, grid, dim3(128), 0, stream, x, ld_x, z, ld_z, weight, y, ld_y, heads,
                        head_dim, eps);
}

cudaError_t swiglu(const bf16* in, std::int64_t ld_in, std::int64_t up_offset, bf16* out, std::int64_t ld_out, int rows,
                   int n, cudaStream_t stream) {
  if (in == nullptr || out == nullptr || rows < 0 || n < 1) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(detail::imin(detail::ceil_div(n, 256), 1024)), static_cast<unsigned>(rows));
  return detail::launch(kernels::swiglu_kernel, grid, dim3(256), 0, stream, in, ld_in, up_offset, out, ld_out, n);
}

cudaError_t rope_neox(bf16* x, std::int64_t ld_x, std::int64_t head_stride, int heads, int rotary_dim,
                      const std::int32_t* positions, const float* inv_freq, int rows, cudaStream_t stream) {
  if (x == nullptr || positions == nullptr || inv_freq == nullptr || heads < 1 || rows < 0 || rotary_dim < 2 ||
      rotary_dim % 2 != 0)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads));
  return detail::launch(kernels::rope_neox_kernel, grid, dim3(128), 0, stream, x, ld_x, head_stride, rotary_dim, positions,
                        inv_freq);
}

cudaError_t embedding_gather(const bf16* table, std::int64_t ld_table, const std::int32_t* tokens, bf16* out,
                             std::int64_t ld_out, int rows, int n, cudaStream_t stream) {
  if (table == nullptr || tokens == nullptr || out == nullptr || rows < 0 || n < 1) return cudaErrorInvalidValue;
  return detail::launch(kernels::embedding_gather_kernel, dim3(static_cast<unsigned>(rows)), dim3(256), 0, stream, table,
                        ld_table, tokens, out, ld_out, n);
}

cudaError_t fill_random_bf16(bf16* p, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t stream) {
  if (p == nullptr || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const std::int64_t blocks = std::min<std::int64_t>((n + 255) / 256, 65536);
  return detail::launch(kernels::fill_random_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, p, n, seed,
                        scale);
}

GDN_CUDA_NAMESPACE_END
