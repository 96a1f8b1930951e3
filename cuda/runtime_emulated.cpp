// runtime.hpp for the CPU emulator (GDN_CUDA_EMULATE): one emulated GPU (emulate.hpp's device
// model) whose memory is host memory. Streams run operations as they are enqueued; a thread that
// captures records them instead, and a graph is that recording, replayed in order. Device memory
// is counted against the model's limit, so tests can fill it; a sticky error (an injected launch
// failure) fails every later call, as on a GPU.

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "emulate.hpp"
#include "runtime.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace rt {
namespace {

std::map<const void*, std::size_t>& allocations() {
  static std::map<const void*, std::size_t> m;
  return m;
}

cudaError_t sticky() { return emu::device().sticky; }

}  // namespace

const char* error_string(cudaError_t e) noexcept {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    default: return "emulated CUDA error";
  }
}

cudaError_t device_count(int* n) noexcept {
  *n = 1;
  return cudaSuccess;
}

cudaError_t device_info(int device, DeviceInfo* info) noexcept {
  if (device != 0) return cudaErrorInvalidDevice;
  const emu::DeviceModel& m = emu::device().model;
  info->name = m.name;
  info->major = m.major;
  info->minor = m.minor;
  info->sm_count = m.sm_count;
  info->smem_optin = m.smem_optin;
  info->total_memory = emu::device().memory_limit;
  info->driver_version = info->runtime_version = 13000;
  return cudaSuccess;
}

cudaError_t set_device(int device) noexcept { return device == 0 ? sticky() : cudaErrorInvalidDevice; }

cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept {
  const auto& d = emu::device();
  *total_bytes = d.memory_limit;
  *free_bytes = d.allocated < d.memory_limit ? d.memory_limit - d.allocated : 0;
  return sticky();
}

cudaError_t device_alloc(void** p, std::size_t bytes) noexcept {
  *p = nullptr;
  if (sticky() != cudaSuccess) return sticky();
  auto& d = emu::device();
  if (bytes > d.memory_limit - std::min(d.memory_limit, d.allocated)) return cudaErrorMemoryAllocation;
  // Aligned like cudaMalloc, and filled with NaN-like garbage: nothing may rely on zeroed memory.
  void* q = std::aligned_alloc(256, (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256);
  if (q == nullptr) return cudaErrorMemoryAllocation;
  std::memset(q, 0xff, bytes);
  d.allocated += bytes;
  allocations()[q] = bytes;
  *p = q;
  return cudaSuccess;
}

cudaError_t device_free(void* p) noexcept {
  if (p == nullptr) return cudaSuccess;
  auto it = allocations().find(p);
  if (it == allocations().end()) return cudaErrorInvalidValue;
  emu::device().allocated -= it->second;
  allocations().erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t host_alloc(void** p, std::size_t bytes) noexcept {
  *p = std::aligned_alloc(256, (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256);
  return *p == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
}
cudaError_t host_free(void* p) noexcept {
  std::free(p);
  return cudaSuccess;
}

cudaError_t stream_create(cudaStream_t* s) noexcept {
  static int token = 0;
  *s = reinterpret_cast<cudaStream_t>(&token);
  return sticky();
}
cudaError_t stream_destroy(cudaStream_t) noexcept { return cudaSuccess; }
cudaError_t stream_synchronize(cudaStream_t) noexcept { return sticky(); }

cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind, cudaStream_t) noexcept {
  if (sticky() != cudaSuccess) return sticky();
  if (bytes == 0) return cudaSuccess;
  emu::enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t memset_async(void* dst, int value, std::size_t bytes, cudaStream_t) noexcept {
  if (sticky() != cudaSuccess) return sticky();
  if (bytes == 0) return cudaSuccess;
  emu::enqueue([dst, value, bytes] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

cudaError_t last_error() noexcept { return sticky(); }

cudaError_t capture_begin(cudaStream_t) noexcept {
  if (sticky() != cudaSuccess) return sticky();
  if (emu::capturing() != nullptr) return cudaErrorIllegalState;
  emu::capturing() = new emu::Recording;
  return cudaSuccess;
}

cudaError_t capture_end(cudaStream_t, GraphExec* graph) noexcept {
  *graph = nullptr;
  emu::Recording* r = emu::capturing();
  if (r == nullptr) return cudaErrorIllegalState;
  emu::capturing() = nullptr;
  if (sticky() != cudaSuccess) {
    delete r;
    return sticky();
  }
  *graph = r;
  return cudaSuccess;
}

cudaError_t graph_launch(GraphExec graph, cudaStream_t) noexcept {
  if (sticky() != cudaSuccess) return sticky();
  for (const auto& op : *static_cast<emu::Recording*>(graph)) op();
  return cudaSuccess;
}

cudaError_t graph_destroy(GraphExec graph) noexcept {
  delete static_cast<emu::Recording*>(graph);
  return cudaSuccess;
}

}  // namespace rt
GDN_CUDA_NAMESPACE_END
