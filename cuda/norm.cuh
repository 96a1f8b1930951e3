#pragma once
// RMSNorm in both conventions (with the residual add fused), the GDN gated norm, SwiGLU, partial
// NeoX RoPE, embedding rows and random fill. References: the CPU rms_norm / rms_norm_gated
// (src/backend/cpu/kernels/rms_norm.hpp), rope_apply (rope.hpp), the SwiGLU of kernel_set.hpp.

#include "common.cuh"
#include "kernels.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace kernels {

constexpr int kNormThreads = 256;  // at most; a row of n elements gets enough warps for n / V vectors

// One block per row; V-element vectors (V = 8 when the row allows 16-byte accesses, else 1).
// The residual sum is rounded to bf16 before it is normalised, as a bf16 residual stream is.
template <int V>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(const bf16* x, std::int64_t ld_x, bf16* residual, std::int64_t ld_res, const float* weight,
                   float weight_offset, bf16* y, std::int64_t ld_y, int n, float eps) {
  __shared__ float scratch[detail::kWarp];
  const std::int64_t r = blockIdx.x;
  const bf16* xr = x + r * ld_x;
  bf16* res = residual != nullptr ? residual + r * ld_res : nullptr;
  float ss = 0.0f;
  for (int i = static_cast<int>(threadIdx.x) * V; i < n; i += static_cast<int>(blockDim.x) * V) {
    float v[V];
    detail::load_bf16<V>(xr + i, v);
    if (res != nullptr) {
      float rv[V];
      detail::load_bf16<V>(res + i, rv);
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = detail::to_float(detail::from_float<bf16>(v[e] + rv[e]));
      detail::store_bf16<V>(res + i, v);
    }
#pragma unroll
    for (int e = 0; e < V; ++e) ss += v[e] * v[e];
  }
  const float inv = 1.0f / sqrtf(detail::block_sum(ss, scratch) / static_cast<float>(n) + eps);
  const bf16* src = res != nullptr ? res : xr;
  for (int i = static_cast<int>(threadIdx.x) * V; i < n; i += static_cast<int>(blockDim.x) * V) {
    float v[V];
    detail::load_bf16<V>(src + i, v);
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = v[e] * inv * (weight[i + e] + weight_offset);
    detail::store_bf16<V>(y + r * ld_y + i, v);
  }
}

// One warp per (row, head); grid (rows, ceil(heads / 4)).
__global__ void __launch_bounds__(128)
    rmsnorm_gated_kernel(const bf16* x, std::int64_t ld_x, const bf16* z, std::int64_t ld_z, const float* weight, bf16* y,
                         std::int64_t ld_y, int heads, int hd, float eps) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarp;
  const int head = static_cast<int>(blockIdx.y) * 4 + static_cast<int>(threadIdx.x) / detail::kWarp;
  if (head >= heads) return;
  const std::int64_t r = blockIdx.x;
  const bf16* xh = x + r * ld_x + static_cast<std::int64_t>(head) * hd;
  const bf16* zh = z + r * ld_z + static_cast<std::int64_t>(head) * hd;
  float ss = 0.0f;
  for (int i = lane; i < hd; i += detail::kWarp) {
    const float v = detail::to_float(xh[i]);
    ss += v * v;
  }
  const float inv = 1.0f / sqrtf(detail::warp_sum(ss) / static_cast<float>(hd) + eps);
  bf16* yh = y + r * ld_y + static_cast<std::int64_t>(head) * hd;
  for (int i = lane; i < hd; i += detail::kWarp) {
    const float v = detail::to_float(xh[i]) * inv * weight[i] * detail::silu(detail::to_float(zh[i]));
    yh[i] = detail::from_float<bf16>(v);
  }
}

__global__ void __launch_bounds__(256)
    swiglu_kernel(const bf16* in, std::int64_t ld_in, std::int64_t up_offset, bf16* out, std::int64_t ld_out, int n) {
  const std::int64_t r = blockIdx.y;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += static_cast<int>(gridDim.x * blockDim.x)) {
    const float g = detail::to_float(in[r * ld_in + i]);
    const float u = detail::to_float(in[r * ld_in + up_offset + i]);
    out[r * ld_out + i] = detail::from_float<bf16>(detail::silu(g) * u);
  }
}

// Block per (row, head), a thread per rotated pair.
__global__ void __launch_bounds__(128) rope_neox_kernel(bf16* x, std::int64_t ld_x, std::int64_t head_stride, int rotary_dim,
                                                        const std::int32_t* positions, const float* inv_freq) {
  const std::int64_t r = blockIdx.x;
  bf16* hx = x + r * ld_x + blockIdx.y * head_stride;
  const int half = rotary_dim / 2;
  const float pos = static_cast<float>(positions[r]);
  for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
    const float a = pos * inv_freq[i];
    const float c = cosf(a), s = sinf(a);
    const float x1 = detail::to_float(hx[i]), x2 = detail::to_float(hx[i + half]);
    hx[i] = detail::from_float<bf16>(x1 * c - x2 * s);
    hx[i + half] = detail::from_float<bf16>(x2 * c + x1 * s);
  }
}

__global__ void __launch_bounds__(256) embedding_gather_kernel(const bf16* table, std::int64_t ld_table,
                                                               const std::int32_t* tokens, bf16* out, std::int64_t ld_out,
                                                               int n) {
  const std::int64_t r = blockIdx.x;
  const bf16* src = table + static_cast<std::int64_t>(tokens[r]) * ld_table;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) out[r * ld_out + i] = src[i];
}

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__global__ void __launch_bounds__(256) fill_random_kernel(bf16* p, std::int64_t n, std::uint64_t seed, float scale) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = detail::from_float<bf16>(scale * (2.0f * u - 1.0f));
  }
}

}  // namespace kernels
GDN_CUDA_NAMESPACE_END
