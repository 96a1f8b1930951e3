#pragma once
// Device helpers shared by the kernel families: bf16 loads and stores, warp and block reductions,
// the launch wrapper, and the dynamic shared memory declaration.
//
// Every kernel of cuda/ is written so that it also compiles as plain C++ under GDN_CUDA_EMULATE,
// where cuda/emulate.hpp runs each CUDA thread as a fiber on the CPU (tests/test_cuda_emulated).
// That restricts kernels to what the emulator provides: threadIdx/blockIdx/blockDim/gridDim,
// __syncthreads, __syncwarp, __shfl_xor_sync/__shfl_sync over full warps, atomicAdd/atomicMax on
// ints, static __shared__ arrays, GDN_DYNAMIC_SMEM, the CUB block primitives listed in emulate.hpp,
// and the float math of <cmath>. No inline PTX.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "kernels.hpp"

#if defined(GDN_CUDA_EMULATE)
#include "emulate.hpp"
#else
#include <cuda_runtime.h>
#endif

GDN_CUDA_NAMESPACE_BEGIN
namespace detail {

using bf16 = __nv_bfloat16;

constexpr int kWarp = 32;

__host__ __device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16(x);  // round to nearest even
}

// Exactly the float forms of include/gdn/layers/activations.hpp (expf, not __expf: tests hold the
// kernels to the CPU reference at float32 rounding where the inputs allow).
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
// Sum over groups of `Width` consecutive lanes (Width a power of two ≤ 32); every lane gets its group's.
template <int Width>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int m = Width / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
template <int Width>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int m = Width / 2; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Sum over the block; every thread gets the total. `scratch` holds ≥ 32 floats of shared memory
// and may be reused after the call returns (the trailing barrier protects it).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}

// Loads N consecutive bf16 (N = 1, 2, 4 or 8, pointer aligned to 2N bytes) as floats.
template <int N>
__device__ __forceinline__ void load_bf16(const bf16* p, float* out) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "1, 2, 4 or 8 elements");
  if constexpr (N == 1) {
    out[0] = __bfloat162float(*p);
  } else {
    using V = std::conditional_t<N == 2, unsigned int, std::conditional_t<N == 4, uint2, uint4>>;
    const V raw = *reinterpret_cast<const V*>(p);
    const unsigned int* w = reinterpret_cast<const unsigned int*>(&raw);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}
template <int N>
__device__ __forceinline__ void store_bf16(bf16* p, const float* in) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "1, 2, 4 or 8 elements");
  if constexpr (N == 1) {
    *p = __float2bfloat16(in[0]);
  } else {
    using V = std::conditional_t<N == 2, unsigned int, std::conditional_t<N == 4, uint2, uint4>>;
    V raw;
    unsigned short* h = reinterpret_cast<unsigned short*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = __bfloat16_as_ushort(__float2bfloat16(in[i]));
    *reinterpret_cast<V*>(p) = raw;
  }
}

inline bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

}  // namespace detail
GDN_CUDA_NAMESPACE_END

#if defined(GDN_CUDA_EMULATE)
#define GDN_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::gdn::emu::dynamic_smem())
#else
#define GDN_DYNAMIC_SMEM(T, name)                                    \
  extern __shared__ __align__(16) unsigned char gdn_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(gdn_dynamic_smem_)
#endif

GDN_CUDA_NAMESPACE_BEGIN
namespace detail {

// Launches `kernel` (a __global__ function) with dynamic shared memory `smem` bytes, raising the
// kernel's shared memory limit first when it needs more than the default 48 KiB.
// max_dynamic_smem: what a block of the current device may use (kernels that can tile two ways
// choose by it).
#if defined(GDN_CUDA_EMULATE)
using ::gdn::emu::launch;
inline cudaError_t max_dynamic_smem(std::size_t& bytes) {
  bytes = ::gdn::emu::device().model.smem_optin;
  return cudaSuccess;
}
#else
inline cudaError_t max_dynamic_smem(std::size_t& bytes) {
  int device = 0, v = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  bytes = static_cast<std::size_t>(v);
  return e;
}
template <typename... Params, typename... Args>
inline cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                          Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(args)...);
  return cudaGetLastError();
}
#endif

}  // namespace detail
GDN_CUDA_NAMESPACE_END
