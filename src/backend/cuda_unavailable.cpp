// The CUDA entry points of a libgdn built without nvcc: every request for the CUDA backend is
// refused with the reason.

#include "gdn/core/error.hpp"

#include "backend.hpp"

namespace gdn {

namespace {
[[noreturn]] void unavailable() {
  throw Error(Status::backend_unavailable,
              "the CUDA backend is not available: libgdn was built without it (no nvcc at build time; see docs/cuda.md)");
}
}  // namespace

std::unique_ptr<BackendInterface> make_cuda_backend(std::shared_ptr<const Model>, const BackendParams&) { unavailable(); }

void prepare_cuda_weights(const Model&, int, const std::function<void(std::size_t, std::size_t)>&) { unavailable(); }
void require_cuda_device(int) { unavailable(); }
double measure_cuda_copy_bandwidth(int, std::size_t) { unavailable(); }
void randomize_cuda_weights(const Model&, int, std::uint64_t) { unavailable(); }

}  // namespace gdn
