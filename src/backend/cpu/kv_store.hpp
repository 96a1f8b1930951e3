#pragma once
// The CPU backend's paged KV cache for the full-attention layers. A page holds `page_size`
// consecutive positions of one sequence for every attention layer (the main model's, then the MTP
// layer's when present): [layer][key|value][kv_head][position in page][head_dim] — the
// backend-neutral page layout of backend.hpp — in the context's KV dtype: float32 (exact), or bf16
// (each key and value rounded to nearest even when written; half the bytes every decode step
// streams). Which sequence owns which page, and reference counts, are the engine's
// (src/engine/page_allocator.hpp). All memory is allocated (and zeroed) when the context is created.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gdn/core/dtype.hpp"

namespace gdn::cpu {

class KvStore {
 public:
  KvStore() = default;
  // dtype: DType::f32 or DType::bf16.
  KvStore(std::int64_t pages, int page_size, int layers, int kv_heads, int head_dim, DType dtype);

  int page_size() const noexcept { return page_size_; }
  std::int64_t pages() const noexcept { return pages_; }
  DType dtype() const noexcept { return dtype_; }
  std::int64_t page_elements() const noexcept { return page_elements_; }
  std::int64_t page_bytes() const noexcept { return page_elements_ * elem_bytes(); }

  void copy_page(std::int32_t from, std::int32_t to) noexcept {
    std::copy_n(page_base(from), page_bytes(), page_base(to));
  }
  // One page as float32 (exact for either dtype), and back (rounded to the dtype).
  void read_page(std::int32_t page, float* out) const noexcept;
  void write_page(std::int32_t page, const float* in) noexcept;

  // [page_size][head_dim] block of keys (values) of one layer and kv head; T is float for a
  // float32 store, bf16 for a bf16 one.
  template <typename T>
  T* keys(std::int32_t page, int layer, int kv_head) noexcept { return block<T>(page, layer, 0, kv_head); }
  template <typename T>
  T* values(std::int32_t page, int layer, int kv_head) noexcept { return block<T>(page, layer, 1, kv_head); }
  template <typename T>
  const T* keys(std::int32_t page, int layer, int kv_head) const noexcept {
    return const_cast<KvStore*>(this)->block<T>(page, layer, 0, kv_head);
  }
  template <typename T>
  const T* values(std::int32_t page, int layer, int kv_head) const noexcept {
    return const_cast<KvStore*>(this)->block<T>(page, layer, 1, kv_head);
  }

 private:
  std::int64_t elem_bytes() const noexcept { return static_cast<std::int64_t>(dtype_size(dtype_)); }
  std::byte* page_base(std::int32_t p) noexcept { return data_.get() + static_cast<std::int64_t>(p) * page_bytes(); }
  const std::byte* page_base(std::int32_t p) const noexcept {
    return data_.get() + static_cast<std::int64_t>(p) * page_bytes();
  }
  template <typename T>
  T* block(std::int32_t page, int layer, int kv, int kv_head) noexcept {
    // 64-bit offsets: pools for long contexts exceed 2^31 elements.
    const std::int64_t per_head = static_cast<std::int64_t>(page_size_) * head_dim_;
    return reinterpret_cast<T*>(page_base(page)) + ((static_cast<std::int64_t>(layer) * 2 + kv) * kv_heads_ + kv_head) * per_head;
  }

  int page_size_ = 0, kv_heads_ = 0, head_dim_ = 0;
  DType dtype_ = DType::f32;
  std::int64_t pages_ = 0, page_elements_ = 0;
  // Heap memory (a memory plan counts it as such) whose 2 MiB-aligned interior is advised into
  // transparent huge pages before it is first written: decode at long context streams the cache
  // page by page, and in 4 KiB pages every jump between pages also missed the TLB.
  std::unique_ptr<std::byte[]> data_;
};

}  // namespace gdn::cpu
