#pragma once
// The CPU backend's paged KV cache for the full-attention layers. A page holds `page_size`
// consecutive positions of one sequence for every attention layer (the main model's, then the MTP
// layer's when present): [layer][key|value][kv_head][position in page][head_dim], float32 — the
// backend-neutral page layout of backend.hpp, so save/load copies pages as they are. Which
// sequence owns which page, and reference counts, are the engine's (src/engine/page_allocator.hpp).
// All memory is allocated when the context is created.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace gdn::cpu {

class KvStore {
 public:
  KvStore() = default;
  KvStore(std::int64_t pages, int page_size, int layers, int kv_heads, int head_dim);

  int page_size() const noexcept { return page_size_; }
  std::int64_t pages() const noexcept { return pages_; }
  std::int64_t page_floats() const noexcept { return page_floats_; }

  void copy_page(std::int32_t from, std::int32_t to) noexcept {
    std::copy_n(page(from), page_floats_, page(to));
  }
  float* page(std::int32_t p) noexcept { return data_.data() + static_cast<std::int64_t>(p) * page_floats_; }

  // [page_size][head_dim] block of keys (values) of one layer and kv head.
  float* keys(std::int32_t page, int layer, int kv_head) noexcept { return block(page, layer, 0, kv_head); }
  float* values(std::int32_t page, int layer, int kv_head) noexcept { return block(page, layer, 1, kv_head); }
  const float* keys(std::int32_t page, int layer, int kv_head) const noexcept {
    return const_cast<KvStore*>(this)->block(page, layer, 0, kv_head);
  }
  const float* values(std::int32_t page, int layer, int kv_head) const noexcept {
    return const_cast<KvStore*>(this)->block(page, layer, 1, kv_head);
  }

 private:
  float* block(std::int32_t page, int layer, int kv, int kv_head) noexcept {
    // 64-bit offsets: pools for long contexts exceed 2^31 floats.
    const std::int64_t per_head = static_cast<std::int64_t>(page_size_) * head_dim_;
    return data_.data() + static_cast<std::int64_t>(page) * page_floats_ +
           ((static_cast<std::int64_t>(layer) * 2 + kv) * kv_heads_ + kv_head) * per_head;
  }

  int page_size_ = 0, layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  std::int64_t pages_ = 0, page_floats_ = 0;
  std::vector<float> data_;
};

}  // namespace gdn::cpu
