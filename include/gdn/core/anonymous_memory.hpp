#pragma once
// A block of zeroed, page-aligned anonymous memory (mmap), optionally backed by 2 MiB transparent
// huge pages. Used for data the library derives at load and then streams on every step (weights
// packed into a kernel's order): huge pages keep a sequential sweep over gigabytes from missing
// the TLB every 4 KiB, and pages are only committed as they are written.

#include <cstddef>

namespace gdn {

class AnonymousMemory {
 public:
  AnonymousMemory() = default;
  // Throws gdn::Error(out_of_capacity) when the mapping fails.
  explicit AnonymousMemory(std::size_t bytes, bool huge_pages = true);
  ~AnonymousMemory();
  AnonymousMemory(AnonymousMemory&& other) noexcept;
  AnonymousMemory& operator=(AnonymousMemory&& other) noexcept;
  AnonymousMemory(const AnonymousMemory&) = delete;
  AnonymousMemory& operator=(const AnonymousMemory&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void release() noexcept;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;    // what the caller asked for
  std::size_t mapped_ = 0;  // rounded up, plus alignment slack
  void* base_ = nullptr;
};

}  // namespace gdn
