#pragma once
// Who is using a C ABI handle right now (gdn.h, "Threads"). The C contract is one thread at a time
// per handle; the C ABI enforces it instead of trusting it: every call claims the flags of the
// handles it uses for its duration, and a call that finds one already claimed fails at once with
// GDN_STATUS_BUSY, before it touches anything. Fail fast rather than wait: a C host that shares a
// context between threads has a bug, and blocking would hide it (and would deadlock a callback that
// calls back into the context it is running on). Two atomic operations per handle per call, no
// lock, no allocation on success.
//
// Exclusive claims are for calls that change the handle, or read state a change would tear;
// shared claims for calls that only read a handle that is documented as readable by many threads at
// once (a gdn_batch that a step reads).

#include <atomic>
#include <string>
#include <thread>

#include "gdn/core/error.hpp"

namespace gdn::capi {

class UseFlag {
 public:
  bool try_lock() noexcept {
    int idle = 0;
    if (!users_.compare_exchange_strong(idle, -1, std::memory_order_acquire, std::memory_order_relaxed)) return false;
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }
  void unlock() noexcept {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    users_.store(0, std::memory_order_release);
  }
  bool try_lock_shared() noexcept {
    int n = users_.load(std::memory_order_relaxed);
    while (n >= 0)
      if (users_.compare_exchange_weak(n, n + 1, std::memory_order_acquire, std::memory_order_relaxed)) return true;
    return false;
  }
  void unlock_shared() noexcept { users_.fetch_sub(1, std::memory_order_release); }
  // Whether the exclusive user is this thread: then the claim failed because a callback of a call
  // on this handle is calling back into it, not because of another thread.
  bool held_by_this_thread() const noexcept { return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }

 private:
  std::atomic<int> users_{0};  // -1: one exclusive user; n >= 0: n shared users
  std::atomic<std::thread::id> owner_{};
};

// One call's claim on one handle, released when the call returns or throws.
class Claim {
 public:
  enum class Mode { exclusive, shared };

  // what: "the context"; rule: "a gdn_context is used by one thread at a time". Throws
  // gdn::Error(busy) naming both when the handle is in use.
  Claim(UseFlag& flag, Mode mode, const char* what, const char* rule) : flag_(flag), mode_(mode) {
    if (mode == Mode::exclusive ? flag.try_lock() : flag.try_lock_shared()) return;
    const bool reentry = flag.held_by_this_thread();
    throw Error(Status::busy, std::string(what) +
                                  (reentry ? " is in use by the call whose callback is running on this thread (a callback must "
                                             "not use it); "
                                           : " is in use by another thread; ") +
                                  rule);
  }
  ~Claim() {
    if (mode_ == Mode::exclusive) flag_.unlock();
    else flag_.unlock_shared();
  }
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;

 private:
  UseFlag& flag_;
  Mode mode_;
};

}  // namespace gdn::capi
