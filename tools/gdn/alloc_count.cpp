// A counting replacement of the global allocation functions, linked only into the programs that
// measure allocations (gdn-bench, test_no_alloc). Not into the `gdn` tool itself: a replacement
// there changes the allocator of every command, and one that misses a form breaks them under ASan
// (the runtime's own nothrow new was paired with the replacement delete: "alloc-dealloc mismatch"
// at tokenizer load in `gdn generate`). `gdn bench` executes gdn-bench in its place instead, so the
// counter sees exactly the benchmark's process.
//
// C++17 lets a program replace the global allocation functions only as a set it keeps consistent,
// so this file replaces all twenty: new and new[], each plain, nothrow, align_val_t and
// align_val_t + nothrow; delete and delete[], each plain, sized, align_val_t, sized + align_val_t,
// nothrow and align_val_t + nothrow. Every one allocates with malloc or posix_memalign and
// releases with free, so a block always goes back to the allocator it came from (under ASan, its
// malloc), whichever forms the program, the runtime and libstdc++ pair up.

#include "alloc_count.hpp"

#include <stdlib.h>  // posix_memalign

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

std::atomic<long> allocations{0};
std::atomic<bool> counting{false};

void counted() noexcept {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
}

// [new.delete.single]: on failure call the new-handler until it succeeds or there is none.
void* allocate(std::size_t n) {
  counted();
  for (;;) {
    if (void* p = std::malloc(n != 0 ? n : 1)) return p;
    const std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* allocate(std::size_t n, std::align_val_t al) {
  counted();
  // posix_memalign takes any power of two that is a multiple of sizeof(void*); align_val_t is a
  // power of two, possibly smaller.
  const std::size_t alignment = std::max(static_cast<std::size_t>(al), sizeof(void*));
  for (;;) {
    void* p = nullptr;
    if (posix_memalign(&p, alignment, n != 0 ? n : 1) == 0) return p;
    const std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

}  // namespace

namespace gdn::alloc_count {

void begin() noexcept {
  allocations.store(0, std::memory_order_relaxed);
  counting.store(true, std::memory_order_relaxed);
}

long end() noexcept {
  counting.store(false, std::memory_order_relaxed);
  return allocations.load(std::memory_order_relaxed);
}

}  // namespace gdn::alloc_count

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, std::align_val_t al) { return allocate(n, al); }
void* operator new[](std::size_t n, std::align_val_t al) { return allocate(n, al); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, al);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t& t) noexcept { return operator new(n, al, t); }

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
