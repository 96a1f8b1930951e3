#include "gdn/core/anonymous_memory.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

namespace gdn {

namespace {
constexpr std::size_t huge_page = std::size_t{2} << 20;
}

AnonymousMemory::AnonymousMemory(std::size_t bytes, bool huge_pages) : size_(bytes) {
  if (bytes == 0) return;
  // Over-map by one huge page so the start can be aligned to one (THP only backs aligned 2 MiB
  // ranges), then give the slack back.
  const std::size_t len = (bytes + huge_page - 1) / huge_page * huge_page;
  const std::size_t want = huge_pages ? len + huge_page : len;
  void* p = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error(Status::out_of_capacity, fmt::format("cannot map {} bytes of memory: {}", bytes, std::strerror(errno)));
  auto* start = static_cast<std::byte*>(p);
  if (huge_pages) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    const std::size_t lead = (huge_page - addr % huge_page) % huge_page;
    if (lead > 0) ::munmap(p, lead);
    const std::size_t tail = huge_page - lead;
    if (tail > 0) ::munmap(start + lead + len, tail);
    start += lead;
    // Best effort: without THP (or with it disabled) the memory is simply 4 KiB pages.
    (void)::madvise(start, len, MADV_HUGEPAGE);
  }
  base_ = start;
  data_ = start;
  mapped_ = len;
}

AnonymousMemory::~AnonymousMemory() { release(); }

void AnonymousMemory::release() noexcept {
  if (base_ != nullptr) ::munmap(base_, mapped_);
  base_ = nullptr;
  data_ = nullptr;
  size_ = mapped_ = 0;
}

AnonymousMemory::AnonymousMemory(AnonymousMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      base_(std::exchange(other.base_, nullptr)) {}

AnonymousMemory& AnonymousMemory::operator=(AnonymousMemory&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    base_ = std::exchange(other.base_, nullptr);
  }
  return *this;
}

}  // namespace gdn
