#pragma once
// A CPU emulation of the CUDA execution model, precise enough to run libgdn's kernels unchanged and
// check their logic (indexing, barriers, reductions, tails) where there is no GPU. Used only when
// GDN_CUDA_EMULATE is defined (tests/test_cuda_emulated); never part of the library.
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread. A fiber runs until it reaches
// a synchronisation point — __syncthreads, __syncwarp, a warp shuffle — or returns; the scheduler
// then releases a warp whose live lanes all wait at a warp barrier, or the block when all live
// threads wait at the block barrier, and reports a deadlock (a barrier some threads never reach)
// by aborting. Threads that have returned count as arrived, as on the hardware. Blocks run one at a
// time in a shuffled order and fibers are resumed in a shuffled order at every round (seeded from
// GDN_EMU_SEED), so a missing barrier or an inter-block dependency shows up as a wrong result
// instead of hiding behind a fixed order. Dynamic shared memory starts filled with NaN bytes.
//
// What this cannot check: the memory model within a phase (fibers never interleave between two
// synchronisation points), timing, occupancy, register pressure, and anything in a launch the
// hardware would refuse beyond the block-size and shared-memory limits checked here.
//
// __shared__ becomes `static`, so a kernel's shared arrays persist across blocks (uninitialised
// reads see stale data rather than NaN). Warp-synchronous code must use the *_sync intrinsics
// with all 32 lanes of a warp taking part.

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

namespace gdn::emu {

struct Fiber {
  enum class State { runnable, block_barrier, warp_barrier, done };
  ucontext_t ctx{};
  uint3 tid{};
  State state = State::runnable;
  std::unique_ptr<char[]> stack;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler{};
  uint3 bid{};
  dim3 bdim, gdim;
  std::vector<unsigned char> smem;
  std::vector<std::uint64_t> exchange;
  std::vector<int> vote;
  int current = -1;
  const std::function<void()>* entry = nullptr;
};

inline Block*& current_block() {
  static Block* b = nullptr;
  return b;
}
inline Fiber& current_fiber() { return current_block()->fibers[static_cast<std::size_t>(current_block()->current)]; }
inline const uint3& thread_idx() { return current_fiber().tid; }
inline const uint3& block_idx() { return current_block()->bid; }
inline const dim3& block_dim() { return current_block()->bdim; }
inline const dim3& grid_dim() { return current_block()->gdim; }
inline int linear_tid() {
  const Block& b = *current_block();
  const uint3 t = current_fiber().tid;
  return static_cast<int>(t.x + t.y * b.bdim.x + t.z * b.bdim.x * b.bdim.y);
}
inline unsigned char* dynamic_smem() { return current_block()->smem.data(); }

inline std::mt19937_64& rng() {
  static std::mt19937_64 r([] {
    const char* s = std::getenv("GDN_EMU_SEED");
    return s != nullptr ? std::strtoull(s, nullptr, 10) : 20261202ULL;
  }());
  return r;
}

inline void wait(Fiber::State s) {
  Fiber& f = current_fiber();
  f.state = s;
  swapcontext(&f.ctx, &current_block()->scheduler);
}
inline void syncthreads() { wait(Fiber::State::block_barrier); }
inline void syncwarp() { wait(Fiber::State::warp_barrier); }

template <typename T>
T shfl(T v, int src_lane_of_warp) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>, "shuffle of a small value");
  Block& b = *current_block();
  const int t = linear_tid(), base = t - t % 32;
  std::memcpy(&b.exchange[static_cast<std::size_t>(t)], &v, sizeof(T));
  syncwarp();
  const int src = base + (src_lane_of_warp & 31);
  T r;
  if (src >= static_cast<int>(b.fibers.size())) {
    r = v;
  } else {
    std::memcpy(&r, &b.exchange[static_cast<std::size_t>(src)], sizeof(T));
  }
  syncwarp();
  return r;
}

inline int syncthreads_count(int pred) {
  Block& b = *current_block();
  const int t = linear_tid();
  b.vote[static_cast<std::size_t>(t)] = pred != 0;
  syncthreads();
  int n = 0;
  for (std::size_t i = 0; i < b.fibers.size(); ++i)
    if (b.fibers[i].state != Fiber::State::done) n += b.vote[i];
  syncthreads();
  return n;
}

inline void fiber_main() {
  Block& b = *current_block();
  (*b.entry)();
  current_fiber().state = Fiber::State::done;
  // Returning from the fiber resumes uc_link, the scheduler.
}

inline void run_block(Block& b) {
  const std::size_t n = b.fibers.size();
  for (std::size_t i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.state = Fiber::State::runnable;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = 256 * 1024;
    f.ctx.uc_link = &b.scheduler;
    makecontext(&f.ctx, fiber_main, 0);
  }
  std::vector<int> order(n);
  for (;;) {
    order.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (b.fibers[i].state == Fiber::State::runnable) order.push_back(static_cast<int>(i));
    std::shuffle(order.begin(), order.end(), rng());
    for (const int i : order) {
      b.current = i;
      swapcontext(&b.scheduler, &b.fibers[static_cast<std::size_t>(i)].ctx);
    }
    bool released = false;
    for (std::size_t w = 0; w < n; w += 32) {
      bool any = false, all = true;
      for (std::size_t i = w; i < std::min(n, w + 32); ++i) {
        const auto s = b.fibers[i].state;
        if (s == Fiber::State::done) continue;
        if (s == Fiber::State::warp_barrier) any = true;
        else all = false;
      }
      if (any && all) {
        for (std::size_t i = w; i < std::min(n, w + 32); ++i)
          if (b.fibers[i].state == Fiber::State::warp_barrier) b.fibers[i].state = Fiber::State::runnable;
        released = true;
      }
    }
    if (released) continue;
    bool any_live = false, all_block = true;
    for (const auto& f : b.fibers) {
      if (f.state == Fiber::State::done) continue;
      any_live = true;
      if (f.state != Fiber::State::block_barrier) all_block = false;
    }
    if (!any_live) return;
    if (all_block) {
      for (auto& f : b.fibers)
        if (f.state == Fiber::State::block_barrier) f.state = Fiber::State::runnable;
      continue;
    }
    std::fprintf(stderr, "gdn::emu: deadlock in block (%u,%u,%u): threads wait at different barriers\n", b.bid.x,
                 b.bid.y, b.bid.z);
    std::abort();
  }
}

// Runs kernel<<<grid, block, smem>>>(args...) to completion. Refuses what the hardware would.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t, Args&&... args) {
  const std::size_t threads = static_cast<std::size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || smem > 227 * 1024) return cudaErrorInvalidConfiguration;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  std::tuple<std::decay_t<Params>...> params(static_cast<Params>(args)...);
  const std::function<void()> entry = [&] { std::apply(kernel, params); };
  Block b;
  b.bdim = block;
  b.gdim = grid;
  b.entry = &entry;
  b.fibers.resize(threads);
  b.exchange.resize(threads);
  b.vote.resize(threads);
  for (std::size_t i = 0; i < threads; ++i) {
    Fiber& f = b.fibers[i];
    f.stack.reset(new char[256 * 1024]);
    f.tid = uint3{static_cast<unsigned>(i % block.x), static_cast<unsigned>((i / block.x) % block.y),
                  static_cast<unsigned>(i / (static_cast<std::size_t>(block.x) * block.y))};
  }
  std::vector<uint3> blocks;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back(uint3{x, y, z});
  std::shuffle(blocks.begin(), blocks.end(), rng());
  Block* outer = current_block();
  current_block() = &b;
  for (const uint3 id : blocks) {
    b.bid = id;
    b.smem.assign(smem, 0xff);
    run_block(b);
  }
  current_block() = outer;
  return cudaSuccess;
}

template <typename To, typename From>
inline To bits(From f) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  std::memcpy(&t, &f, sizeof(To));
  return t;
}

}  // namespace gdn::emu

// The CUDA built-ins the kernels use, as the emulator provides them.
#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define threadIdx (::gdn::emu::thread_idx())
#define blockIdx (::gdn::emu::block_idx())
#define blockDim (::gdn::emu::block_dim())
#define gridDim (::gdn::emu::grid_dim())

inline void __syncthreads() { ::gdn::emu::syncthreads(); }
inline int __syncthreads_count(int pred) { return ::gdn::emu::syncthreads_count(pred); }
inline int __syncthreads_or(int pred) { return ::gdn::emu::syncthreads_count(pred) > 0; }
inline void __syncwarp(unsigned = 0xffffffffu) { ::gdn::emu::syncwarp(); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return ::gdn::emu::shfl(v, (::gdn::emu::linear_tid() % 32) ^ mask);
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int src) {
  return ::gdn::emu::shfl(v, src);
}
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old > v ? old : v;
  return old;
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __uint_as_float(unsigned x) { return ::gdn::emu::bits<float>(x); }
inline unsigned __float_as_uint(float x) { return ::gdn::emu::bits<unsigned>(x); }
inline float __int_as_float(int x) { return ::gdn::emu::bits<float>(x); }
inline int __float_as_int(float x) { return ::gdn::emu::bits<int>(x); }

#include "emulate_cub.hpp"
