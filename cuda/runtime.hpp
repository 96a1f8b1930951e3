#pragma once
// The CUDA runtime calls the CUDA backend makes (memory, copies, streams, graphs, device facts),
// behind one small interface with two implementations: runtime.cpp calls the CUDA runtime, and
// runtime_emulated.cpp, under GDN_CUDA_EMULATE, runs everything on the host for the CPU emulator
// (emulate.hpp) — device memory is host memory, a stream runs each operation as it is enqueued,
// and a captured graph is the list of operations it recorded, replayed in order. So the whole
// backend, graphs included, runs in CI without a GPU, and the emulator can stand in for a smaller
// GPU (its shared-memory limit), a full device memory or a failing launch (see the test hooks in
// emulate.hpp).
//
// Every function returns the runtime's cudaError_t; none throws.

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "kernels.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace rt {

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;         // compute capability
  int sm_count = 0;
  std::size_t smem_optin = 0;       // shared memory one block may use (after opting in)
  std::size_t total_memory = 0;
  int driver_version = 0, runtime_version = 0;
};

const char* error_string(cudaError_t e) noexcept;

cudaError_t device_count(int* n) noexcept;
cudaError_t device_info(int device, DeviceInfo* info) noexcept;
cudaError_t set_device(int device) noexcept;
cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept;

cudaError_t device_alloc(void** p, std::size_t bytes) noexcept;
cudaError_t device_free(void* p) noexcept;
cudaError_t host_alloc(void** p, std::size_t bytes) noexcept;  // pinned
cudaError_t host_free(void* p) noexcept;

cudaError_t stream_create(cudaStream_t* s) noexcept;
cudaError_t stream_destroy(cudaStream_t s) noexcept;
cudaError_t stream_synchronize(cudaStream_t s) noexcept;
cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) noexcept;
cudaError_t memset_async(void* dst, int value, std::size_t bytes, cudaStream_t s) noexcept;
// The first error of an earlier asynchronous operation, cleared unless it is sticky.
cudaError_t last_error() noexcept;

// A captured, instantiated graph of everything enqueued on a stream between capture_begin and
// capture_end.
using GraphExec = void*;
cudaError_t capture_begin(cudaStream_t s) noexcept;
cudaError_t capture_end(cudaStream_t s, GraphExec* graph) noexcept;
cudaError_t graph_launch(GraphExec graph, cudaStream_t s) noexcept;
cudaError_t graph_destroy(GraphExec graph) noexcept;

}  // namespace rt
GDN_CUDA_NAMESPACE_END
