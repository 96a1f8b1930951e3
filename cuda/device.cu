#include <cuda_runtime.h>

#include "kernels.hpp"

namespace gdn::cuda {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

const char* unavailable_reason() noexcept {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(e);
  }
  return n == 0 ? "no CUDA device" : "available";
}

}  // namespace gdn::cuda
