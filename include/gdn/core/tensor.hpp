#pragma once
// A non-owning view of a tensor stored in a checkpoint (or anywhere else): element type, shape and
// a pointer. Weights stay in the memory-mapped file; a view is how a layer refers to them.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gdn/core/dtype.hpp"

namespace gdn {

struct TensorView {
  static constexpr int max_rank = 8;  // vision towers carry rank-5 conv weights

  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, max_rank> shape{};
  const std::byte* data = nullptr;

  std::int64_t dim(int i) const noexcept { return shape[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[static_cast<std::size_t>(i)];
    return n;
  }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool empty() const noexcept { return data == nullptr; }

  template <typename T>
  const T* as() const noexcept { return reinterpret_cast<const T*>(data); }
};

std::string shape_string(const TensorView& t);

}  // namespace gdn
