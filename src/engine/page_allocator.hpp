#pragma once
// KV page ownership: which page ids are free, and how many holders (sequences, snapshots) each
// page has, so forks and snapshots share the pages of a common prefix and a write into a shared
// page copies it first (the engine asks the backend for the copy). The pages' contents live in
// the backend. Everything is sized when the context is created; running out of pages is an error
// the host can act on, never an abort.

#include <cstdint>
#include <limits>
#include <vector>

namespace gdn {

class PageAllocator {
 public:
  PageAllocator() = default;
  explicit PageAllocator(std::int64_t pages) {
    refcount_.assign(static_cast<std::size_t>(pages), 0);
    free_.reserve(static_cast<std::size_t>(pages));
    // Hand out low page ids first.
    for (std::int64_t p = pages - 1; p >= 0; --p) free_.push_back(static_cast<std::int32_t>(p));
  }

  std::int64_t capacity() const noexcept { return static_cast<std::int64_t>(refcount_.size()); }
  std::int64_t free_pages() const noexcept { return static_cast<std::int64_t>(free_.size()); }

  // A page id with reference count 1, or -1 when every page is taken.
  std::int32_t acquire() {
    if (free_.empty()) return -1;
    const std::int32_t p = free_.back();
    free_.pop_back();
    refcount_[static_cast<std::size_t>(p)] = 1;
    return p;
  }
  void retain(std::int32_t page) { ++refcount_[static_cast<std::size_t>(page)]; }
  void release(std::int32_t page) {
    if (--refcount_[static_cast<std::size_t>(page)] == 0) free_.push_back(page);
  }
  int refcount(std::int32_t page) const { return refcount_[static_cast<std::size_t>(page)]; }

 private:
  std::vector<int> refcount_;
  std::vector<std::int32_t> free_;
};

}  // namespace gdn
