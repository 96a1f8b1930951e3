#pragma once
// Paged KV cache for the full-attention layers. A page holds `page_size` consecutive positions of
// one sequence for every attention layer (the main model's, then the MTP layer's when present):
// [layer][key|value][kv_head][position in page][head_dim], float32. A sequence owns a list of page
// ids; position p lives in page p / page_size at row p % page_size. Pages carry a reference count
// so that forks can share the pages of a common prefix. All memory is allocated up front; running
// out of pages is an error the host can act on, never an abort.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace gdn {

class KvPagePool {
 public:
  KvPagePool() = default;
  KvPagePool(std::int64_t pages, int page_size, int layers, int kv_heads, int head_dim);

  int page_size() const noexcept { return page_size_; }
  std::int64_t capacity() const noexcept { return static_cast<std::int64_t>(refcount_.size()); }
  std::int64_t free_pages() const noexcept { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t page_floats() const noexcept { return page_floats_; }

  // Returns a page id with reference count 1, or -1 when the pool is exhausted.
  std::int32_t acquire();
  void retain(std::int32_t page) { ++refcount_[static_cast<std::size_t>(page)]; }
  void release(std::int32_t page);
  int refcount(std::int32_t page) const { return refcount_[static_cast<std::size_t>(page)]; }
  // Copies every layer's keys and values of page `from` into page `to` (copy-on-write).
  void copy_page(std::int32_t from, std::int32_t to) noexcept {
    std::copy_n(data_.data() + static_cast<std::int64_t>(from) * page_floats_, page_floats_,
                data_.data() + static_cast<std::int64_t>(to) * page_floats_);
  }

  // [page_size][head_dim] block of keys (values) of one layer and kv head.
  float* keys(std::int32_t page, int layer, int kv_head) noexcept { return block(page, layer, 0, kv_head); }
  float* values(std::int32_t page, int layer, int kv_head) noexcept { return block(page, layer, 1, kv_head); }
  const float* keys(std::int32_t page, int layer, int kv_head) const noexcept {
    return const_cast<KvPagePool*>(this)->block(page, layer, 0, kv_head);
  }
  const float* values(std::int32_t page, int layer, int kv_head) const noexcept {
    return const_cast<KvPagePool*>(this)->block(page, layer, 1, kv_head);
  }

 private:
  float* block(std::int32_t page, int layer, int kv, int kv_head) noexcept {
    // 64-bit offsets: pools for long contexts exceed 2^31 floats.
    const std::int64_t per_head = static_cast<std::int64_t>(page_size_) * head_dim_;
    return data_.data() + static_cast<std::int64_t>(page) * page_floats_ +
           ((static_cast<std::int64_t>(layer) * 2 + kv) * kv_heads_ + kv_head) * per_head;
  }

  int page_size_ = 0, layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  std::int64_t page_floats_ = 0;
  std::vector<float> data_;
  std::vector<int> refcount_;
  std::vector<std::int32_t> free_;
};

}  // namespace gdn
