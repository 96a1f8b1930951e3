#pragma once
// A fixed pool of worker threads owned by a Context (never global). parallel_for splits [0, n) into
// chunks of `grain` and runs them on the workers and the calling thread; it returns when all are
// done. Dispatch needs no heap allocation, so it may be used on the decode hot path. Workers spin
// briefly before sleeping because a decode step issues hundreds of short parallel regions.
// Thread safety: parallel_for is called by one thread at a time (the owning Context's).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace gdn {

class ThreadPool {
 public:
  // threads <= 0 means one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end, thread_index) with thread_index in [0, size()).
  template <typename F>
  void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    using Fn = std::remove_reference_t<F>;
    if (workers_.empty() || n <= grain) {
      fn(std::int64_t{0}, n, 0);
      return;
    }
    run(n, grain, [](void* ctx, std::int64_t b, std::int64_t e, int t) { (*static_cast<Fn*>(ctx))(b, e, t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Call = void (*)(void*, std::int64_t, std::int64_t, int);
  void run(std::int64_t n, std::int64_t grain, Call call, void* ctx);
  void work(int thread_index);
  void drain(int thread_index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  // The current job. Written by the caller before `generation_` is bumped.
  Call call_ = nullptr;
  void* ctx_ = nullptr;
  std::int64_t n_ = 0;
  std::int64_t grain_ = 1;
  std::atomic<std::int64_t> next_{0};
  std::atomic<int> busy_{0};
  std::atomic<std::uint64_t> generation_{0};
  bool stop_ = false;
};

}  // namespace gdn
