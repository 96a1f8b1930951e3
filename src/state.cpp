#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

#include "gdn/state/gdn_state.hpp"
#include "gdn/state/kv_pages.hpp"

namespace gdn {

KvPagePool::KvPagePool(std::int64_t pages, int page_size, int layers, int kv_heads, int head_dim)
    : page_size_(page_size), layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim) {
  page_floats_ = static_cast<std::int64_t>(layers) * 2 * kv_heads * page_size * head_dim;
  // Checked before allocating: page ids are 32-bit, and the pool's size must not wrap around.
  std::int64_t floats = 0;
  if (pages > std::numeric_limits<std::int32_t>::max() || __builtin_mul_overflow(pages, page_floats_, &floats) ||
      floats > std::numeric_limits<std::int64_t>::max() / 4)
    throw Error(Status::out_of_capacity,
                fmt::format("a KV cache of {} pages of {} floats is beyond what one context can address "
                            "(page ids are 32-bit); lower max_context, max_sequences or kv_pages",
                            pages, page_floats_));
  data_.assign(static_cast<std::size_t>(floats), 0.0f);
  refcount_.assign(static_cast<std::size_t>(pages), 0);
  free_.reserve(static_cast<std::size_t>(pages));
  // Hand out low page ids first.
  for (std::int64_t p = pages - 1; p >= 0; --p) free_.push_back(static_cast<std::int32_t>(p));
}

std::int32_t KvPagePool::acquire() {
  if (free_.empty()) return -1;
  const std::int32_t p = free_.back();
  free_.pop_back();
  refcount_[static_cast<std::size_t>(p)] = 1;
  return p;
}

void KvPagePool::release(std::int32_t page) {
  if (--refcount_[static_cast<std::size_t>(page)] == 0) free_.push_back(page);
}

GdnStatePool::GdnStatePool(const ModelConfig& c, int slots, DType state_dtype) : state_dtype_(state_dtype) {
  layers_ = c.count_layers(LayerKind::linear_attention);
  conv_floats_ = static_cast<std::int64_t>(c.linear_conv_kernel_dim - 1) * c.gdn_conv_dim();
  recurrent_elems_ = static_cast<std::int64_t>(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim;
  conv_.assign(static_cast<std::size_t>(slots * layers_ * conv_floats_), 0.0f);
  recurrent_.assign(static_cast<std::size_t>(slots * layers_ * recurrent_elems_) * dtype_size(state_dtype), std::byte{0});
}

void GdnStatePool::clear(int slot) noexcept {
  std::fill_n(conv(slot, 0), layers_ * conv_floats_, 0.0f);
  std::fill_n(recurrent(slot, 0), layers_ * recurrent_elems_ * static_cast<std::int64_t>(dtype_size(state_dtype_)),
              std::byte{0});
}

}  // namespace gdn
