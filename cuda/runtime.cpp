// runtime.hpp on the CUDA runtime.

#include "runtime.hpp"

#include <cuda_runtime.h>

GDN_CUDA_NAMESPACE_BEGIN
namespace rt {

const char* error_string(cudaError_t e) noexcept { return cudaGetErrorString(e); }

cudaError_t device_count(int* n) noexcept {
  *n = 0;
  const cudaError_t e = cudaGetDeviceCount(n);
  if (e != cudaSuccess) {
    *n = 0;
    (void)cudaGetLastError();  // a missing driver is not sticky; do not leave it for the next call
  }
  return e;
}

cudaError_t device_info(int device, DeviceInfo* info) noexcept {
  cudaDeviceProp p{};
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) return e;
  info->name = p.name;
  info->major = p.major;
  info->minor = p.minor;
  info->sm_count = p.multiProcessorCount;
  info->smem_optin = p.sharedMemPerBlockOptin;
  info->total_memory = p.totalGlobalMem;
  if ((e = cudaDriverGetVersion(&info->driver_version)) != cudaSuccess) return e;
  return cudaRuntimeGetVersion(&info->runtime_version);
}

cudaError_t set_device(int device) noexcept { return cudaSetDevice(device); }
cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept {
  return cudaMemGetInfo(free_bytes, total_bytes);
}

cudaError_t device_alloc(void** p, std::size_t bytes) noexcept {
  const cudaError_t e = cudaMalloc(p, bytes == 0 ? 256 : bytes);
  if (e == cudaErrorMemoryAllocation) (void)cudaGetLastError();  // not sticky: the context stays usable
  return e;
}
cudaError_t device_free(void* p) noexcept { return p == nullptr ? cudaSuccess : cudaFree(p); }
cudaError_t host_alloc(void** p, std::size_t bytes) noexcept {
  const cudaError_t e = cudaMallocHost(p, bytes == 0 ? 64 : bytes);
  if (e == cudaErrorMemoryAllocation) (void)cudaGetLastError();
  return e;
}
cudaError_t host_free(void* p) noexcept { return p == nullptr ? cudaSuccess : cudaFreeHost(p); }

cudaError_t stream_create(cudaStream_t* s) noexcept { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); }
cudaError_t stream_destroy(cudaStream_t s) noexcept { return cudaStreamDestroy(s); }
cudaError_t stream_synchronize(cudaStream_t s) noexcept { return cudaStreamSynchronize(s); }
cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) noexcept {
  return bytes == 0 ? cudaSuccess : cudaMemcpyAsync(dst, src, bytes, kind, s);
}
cudaError_t memset_async(void* dst, int value, std::size_t bytes, cudaStream_t s) noexcept {
  return bytes == 0 ? cudaSuccess : cudaMemsetAsync(dst, value, bytes, s);
}
cudaError_t last_error() noexcept { return cudaGetLastError(); }

cudaError_t capture_begin(cudaStream_t s) noexcept { return cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal); }

cudaError_t capture_end(cudaStream_t s, GraphExec* graph) noexcept {
  *graph = nullptr;
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess) return e;
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  if (e == cudaSuccess) *graph = exec;
  return e;
}

cudaError_t graph_launch(GraphExec graph, cudaStream_t s) noexcept {
  return cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), s);
}
cudaError_t graph_destroy(GraphExec graph) noexcept {
  return graph == nullptr ? cudaSuccess : cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

}  // namespace rt
GDN_CUDA_NAMESPACE_END
