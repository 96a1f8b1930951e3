#pragma once
// The lock of each Python object over a mutable libgdn object (Context, Batch, Sampler,
// StreamDecoder; a Generator and a SpeculativeDecoder share their Context's). The C++ objects are
// one thread at a time; Python hosts share them between threads anyway (a thread-pool web handler
// does), and the binding runs steps without the GIL, so two threads could be inside one Context at
// once. Each call therefore takes the object's lock: calls from several threads serialise, as they
// would under the GIL alone.
//
// The rule that keeps this free of deadlocks with the GIL: never wait for a lock while holding the
// GIL. A call first tries the lock; when another thread has it, the call releases the GIL, waits,
// and takes the GIL back only once it holds the lock (lock, then GIL: the order a text callback
// also follows, taking the GIL back while its generation holds the context). Calls that run without
// the GIL release it before they lock.
//
// A callback (on_text) runs inside its generation's call, on the same thread, with the context
// locked: when it calls back into that context, waiting would never end, so it raises
// gdn.BusyError instead. `with ctx.hold():` keeps the lock across several calls of one thread (a
// step and the reading of its logits); calls of that thread inside the block go straight through.

#include <pybind11/pybind11.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "gdn/core/error.hpp"

namespace gdn::python {

class UseLock {
 public:
  // what: how messages name the object ("the context").
  explicit UseLock(const char* what) : what_(what) {}
  UseLock(const UseLock&) = delete;
  UseLock& operator=(const UseLock&) = delete;

  // Starts one call (`call` names it in errors: "Context.step"). gil_held: the caller holds the GIL
  // and keeps it; the wait, if any, happens without it.
  void enter(const char* call, bool gil_held) {
    if (owned_here()) {
      if (in_call_) throw reentry(call);
      in_call_ = true;  // inside this thread's hold()
      return;
    }
    acquire(gil_held);
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    in_call_ = true;
  }
  void leave() noexcept {
    in_call_ = false;
    if (holds_ > 0) return;
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mutex_.unlock();
  }

  // `with ctx.hold():` (the GIL held). Nests.
  void hold(const char* call) {
    if (owned_here()) {
      if (in_call_) throw reentry(call);
      ++holds_;
      return;
    }
    acquire(true);
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    holds_ = 1;
  }
  void unhold(const char* call) {
    if (!owned_here() || holds_ == 0)
      throw Error(Status::invalid_argument, std::string(call) + ": " + what_ + " is not held by this thread");
    if (in_call_) throw reentry(call);
    if (--holds_ == 0) {
      owner_.store(std::thread::id(), std::memory_order_relaxed);
      mutex_.unlock();
    }
  }

 private:
  // Only the owner ever stores its own id, so a thread that reads its id holds the lock.
  bool owned_here() const noexcept { return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }
  void acquire(bool gil_held) {
    if (mutex_.try_lock()) return;
    if (gil_held) {
      pybind11::gil_scoped_release nogil;
      mutex_.lock();
    } else {
      mutex_.lock();
    }
  }
  Error reentry(const char* call) const {
    return Error(Status::busy, std::string(call) + ": " + what_ +
                                   " is in use by the call whose callback is running on this thread; a callback must not "
                                   "call into the object its call runs on (it would wait for itself)");
  }

  const char* what_;
  std::mutex mutex_;
  std::atomic<std::thread::id> owner_{};
  int holds_ = 0;         // hold() depth; only the owner touches it
  bool in_call_ = false;  // a call of the owner is running; only the owner touches it
};

// One call's use of an object, for the call's duration.
class Use {
 public:
  enum class Gil { held, released };
  Use(UseLock& lock, const char* call, Gil gil) : lock_(lock) { lock.enter(call, gil == Gil::held); }
  ~Use() { lock_.leave(); }
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;

 private:
  UseLock& lock_;
};

}  // namespace gdn::python
