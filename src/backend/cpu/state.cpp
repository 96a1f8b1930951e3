#include <algorithm>
#include <limits>
#include <new>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

#include "gdn_state.hpp"
#include "kv_store.hpp"

namespace gdn::cpu {
namespace {

template <typename T>
void allocate(std::vector<T>& v, std::int64_t n, T value, const char* what) {
  try {
    v.assign(static_cast<std::size_t>(n), value);
  } catch (const std::bad_alloc&) {
    throw Error(Status::out_of_capacity, fmt::format("cannot allocate {} bytes of host memory for the {}",
                                                     n * static_cast<std::int64_t>(sizeof(T)), what));
  }
}

}  // namespace

KvStore::KvStore(std::int64_t pages, int page_size, int layers, int kv_heads, int head_dim)
    : page_size_(page_size), layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), pages_(pages) {
  page_floats_ = static_cast<std::int64_t>(layers) * 2 * kv_heads * page_size * head_dim;
  std::int64_t floats = 0;
  if (__builtin_mul_overflow(pages, page_floats_, &floats) || floats > std::numeric_limits<std::int64_t>::max() / 4)
    throw Error(Status::out_of_capacity, fmt::format("a KV cache of {} pages of {} floats cannot be addressed", pages, page_floats_));
  allocate(data_, floats, 0.0f, "KV cache");
}

GdnStatePool::GdnStatePool(const ModelConfig& c, int slots, DType state_dtype) : state_dtype_(state_dtype) {
  layers_ = c.count_layers(LayerKind::linear_attention);
  conv_floats_ = static_cast<std::int64_t>(c.linear_conv_kernel_dim - 1) * c.gdn_conv_dim();
  recurrent_elems_ = static_cast<std::int64_t>(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim;
  allocate(conv_, slots * layers_ * conv_floats_, 0.0f, "GDN conv state");
  allocate(recurrent_, slots * layers_ * recurrent_elems_ * static_cast<std::int64_t>(dtype_size(state_dtype)), std::byte{0},
           "GDN recurrent state");
}

void GdnStatePool::clear(int slot) noexcept {
  std::fill_n(conv(slot, 0), layers_ * conv_floats_, 0.0f);
  std::fill_n(recurrent(slot, 0), layers_ * recurrent_elems_ * static_cast<std::int64_t>(dtype_size(state_dtype_)),
              std::byte{0});
}

}  // namespace gdn::cpu
