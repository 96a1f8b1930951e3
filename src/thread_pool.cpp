#include "gdn/core/thread_pool.hpp"

#include <immintrin.h>

namespace gdn {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads < 1) threads = 1;
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(int thread_index) {
  for (;;) {
    const std::int64_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (b >= n_) break;
    const std::int64_t e = b + grain_ < n_ ? b + grain_ : n_;
    call_(ctx_, b, e, thread_index);
  }
}

void ThreadPool::run(std::int64_t n, std::int64_t grain, Call call, void* ctx) {
  call_ = call;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain(0);
  // Wait for the workers: spin first, since most regions are short (but not long: when the
  // machine is oversubscribed a spinning waiter steals the core a worker needs).
  for (int spin = 0; spin < 2000; ++spin) {
    if (busy_.load(std::memory_order_acquire) == 0) return;
    _mm_pause();
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return busy_.load(std::memory_order_acquire) == 0; });
}

void ThreadPool::work(int thread_index) {
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 2000; ++spin) {
      _mm_pause();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    drain(thread_index);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);
      done_.notify_one();
    }
  }
}

}  // namespace gdn
