#include "gemv.cuh"

GDN_CUDA_NAMESPACE_BEGIN

cudaError_t gemv(const GemvParams& p, cudaStream_t stream) {
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr || p.rows < 0 || p.in < 1 || p.out < 1 || p.ldx < p.in ||
      p.ldw < p.in || p.ldy < p.out)
    return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  constexpr int per_block = kernels::kGemvWarps * kernels::kGemvOutPerWarp;
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(p.out, per_block)),
                  static_cast<unsigned>(detail::ceil_div(p.rows, kernels::kGemvRows)));
  const bool vec = p.in % 8 == 0 && p.ldx % 8 == 0 && p.ldw % 8 == 0 && detail::aligned(p.x, 16) && detail::aligned(p.w, 16);
  return vec ? detail::launch(kernels::gemv_kernel<true>, grid, dim3(kernels::kGemvWarps * 32), 0, stream, p)
             : detail::launch(kernels::gemv_kernel<false>, grid, dim3(kernels::kGemvWarps * 32), 0, stream, p);
}

GDN_CUDA_NAMESPACE_END
