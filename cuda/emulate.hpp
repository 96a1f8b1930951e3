#pragma once
// A CPU emulation of the CUDA execution model, precise enough to run libgdn's kernels unchanged and
// check their logic (indexing, barriers, reductions, tails) where there is no GPU. Used only when
// GDN_CUDA_EMULATE is defined (tests/test_cuda_emulated); never part of the library.
//
// Each CUDA thread of a block is a fiber on one OS thread, switched by a few instructions that save
// and restore the callee-saved registers and the stack pointer (x86-64; elsewhere ucontext and
// _setjmp/_longjmp, slower); a launch's fibers run its blocks one after another, and their stacks
// are reused between launches. A fiber runs until it reaches
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
// with all 32 lanes of a warp taking part. Launches are serialised by one lock (those static
// arrays are shared by every OS thread).
//
// The emulated device (runtime_emulated.cpp) is one GPU of a chosen architecture (GDN_EMU_ARCH =
// 80, 86, 89 or 90, default 90; or set_arch()): launches are checked against that architecture's
// limits — block size, grid size, and above all shared memory per block, so a kernel that would
// not launch on an RTX A6000 (sm_86, 99 KB) fails here too. Test hooks make the device's memory
// smaller (set_memory_limit) or the n-th launch fail with a sticky launch failure (fail_launch),
// to exercise the backend's error paths.

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

namespace gdn::emu {

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores the stack pointer in *from, and
// (weak: every file that includes this header emits it; the linker keeps one)
// continues on the stack `to` (one that gdn_emu_switch saved, or a new fiber's initial frame).
extern "C" void gdn_emu_switch(void** from, void* to);
asm(R"(
  .text
  .p2align 4
  .weak gdn_emu_switch
  .hidden gdn_emu_switch
  .type gdn_emu_switch, @function
gdn_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gdn_emu_switch, .-gdn_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#define GDN_EMU_FAST_SWITCH 1
#else
#define GDN_EMU_FAST_SWITCH 0
#endif

struct Fiber {
  enum class State { runnable, block_barrier, warp_barrier, done };
#if GDN_EMU_FAST_SWITCH
  void* sp = nullptr;  // saved stack pointer of a waiting fiber
#else
  ucontext_t start{};  // the first entry, once per launch
  jmp_buf jb;          // where the fiber waits
#endif
  bool started = false;
  std::uint32_t shuffles = 0;  // shuffles this block (picks the exchange buffer)
  uint3 tid{};
  State state = State::runnable;
  char* stack = nullptr;
};

constexpr std::size_t kFiberStack = 256 * 1024;

// Fiber stacks, kept for the next launch (launches are serialised).
inline char* fiber_stack(std::size_t i) {
  static std::vector<std::unique_ptr<char[]>> stacks;
  while (stacks.size() <= i) stacks.emplace_back(new char[kFiberStack]);
  return stacks[i].get();
}

struct Block {
  std::vector<Fiber> fibers;
#if GDN_EMU_FAST_SWITCH
  void* scheduler = nullptr;
#else
  jmp_buf scheduler;
#endif
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

// ---- the emulated device --------------------------------------------------------------------

struct DeviceModel {
  const char* name;
  int major, minor, sm_count;
  std::size_t smem_optin;  // bytes of shared memory per block after opting in
};

// Published limits (CUDA C Programming Guide, compute capabilities table).
inline DeviceModel device_model_for(int arch) {
  switch (arch) {
    case 80: return {"emulated sm_80 (A100)", 8, 0, 108, 163 * 1024};
    case 86: return {"emulated sm_86 (RTX A6000)", 8, 6, 84, 99 * 1024};
    case 89: return {"emulated sm_89 (L40S)", 8, 9, 142, 99 * 1024};
    default: return {"emulated sm_90 (H200)", 9, 0, 132, 227 * 1024};
  }
}

struct DeviceState {
  std::mutex lock;  // one launch at a time: kernels' shared arrays are static
  DeviceModel model = device_model_for([] {
    const char* a = std::getenv("GDN_EMU_ARCH");
    return a != nullptr ? std::atoi(a) : 90;
  }());
  std::size_t memory_limit = std::size_t{16} << 30;
  std::size_t allocated = 0;
  std::int64_t fail_after_launches = -1;  // < 0: never
  cudaError_t sticky = cudaSuccess;
  std::uint64_t launches = 0;
};
inline DeviceState& device() {
  static DeviceState d;
  return d;
}

// Test hooks.
inline void set_arch(int arch) { device().model = device_model_for(arch); }
inline void set_memory_limit(std::size_t bytes) { device().memory_limit = bytes; }
// The launch after `n` more launches fails with cudaErrorLaunchFailure, which, as on a GPU, is
// sticky: every later call fails too, until reset_device().
inline void fail_launch(std::int64_t n) { device().fail_after_launches = n; }
inline void reset_device() {
  DeviceState& d = device();
  d.sticky = cudaSuccess;
  d.fail_after_launches = -1;
  d.memory_limit = std::size_t{16} << 30;
}

// Stream capture: while a thread captures, what it enqueues is recorded instead of run.
using Recording = std::vector<std::function<void()>>;
inline Recording*& capturing() {
  thread_local Recording* r = nullptr;
  return r;
}
// Runs fn now, or records it when the calling thread is capturing.
inline void enqueue(std::function<void()> fn) {
  if (Recording* r = capturing()) r->push_back(std::move(fn));
  else fn();
}

// splitmix64: the shuffles need speed, not statistical quality.
struct ShuffleRng {
  using result_type = std::uint64_t;
  std::uint64_t x;
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()() {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};
inline ShuffleRng& rng() {
  static ShuffleRng r{[] {
    const char* s = std::getenv("GDN_EMU_SEED");
    return s != nullptr ? std::strtoull(s, nullptr, 10) : 20261202ULL;
  }()};
  return r;
}

inline void wait(Fiber::State s) {
  Fiber& f = current_fiber();
  f.state = s;
#if GDN_EMU_FAST_SWITCH
  gdn_emu_switch(&f.sp, current_block()->scheduler);
#else
  if (_setjmp(f.jb) == 0) _longjmp(current_block()->scheduler, 1);
#endif
}
inline void syncthreads() { wait(Fiber::State::block_barrier); }
inline void syncwarp() { wait(Fiber::State::warp_barrier); }

// A shuffle: every lane publishes its value, waits for the warp, reads its source's. Two exchange
// buffers are used in turn (lanes of a warp shuffle in lockstep, so they agree on which): a lane
// can only write a buffer again after the next shuffle's barrier, which every lane passes only once
// it has read this one, so one barrier per shuffle suffices.
template <typename T>
T shfl(T v, int src_lane_of_warp) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>, "shuffle of a small value");
  Block& b = *current_block();
  Fiber& f = current_fiber();
  const int t = linear_tid(), base = t - t % 32;
  std::uint64_t* slots = b.exchange.data() + (f.shuffles++ & 1) * b.fibers.size();
  std::memcpy(&slots[t], &v, sizeof(T));
  syncwarp();
  const int src = base + (src_lane_of_warp & 31);
  T r;
  if (src >= static_cast<int>(b.fibers.size())) {
    r = v;
  } else {
    std::memcpy(&r, &slots[src], sizeof(T));
  }
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

// A fiber runs the kernel once per block: after each run it marks itself done and waits; the next
// block resumes it at the top of the loop.
inline void fiber_main() {
  for (;;) {
    Block& b = *current_block();
    (*b.entry)();
    wait(Fiber::State::done);
  }
}

inline void resume(Block& b, int i) {
  Fiber& f = b.fibers[static_cast<std::size_t>(i)];
  b.current = i;
#if GDN_EMU_FAST_SWITCH
  if (!f.started) {
    // A new fiber's frame: six zero registers, then fiber_main as the return address, positioned so
    // that fiber_main starts with the stack aligned as after a call.
    f.started = true;
    auto top = (reinterpret_cast<std::uintptr_t>(f.stack) + kFiberStack) & ~std::uintptr_t{15};
    auto* frame = reinterpret_cast<void**>(top) - 8;
    for (int k = 0; k < 6; ++k) frame[k] = nullptr;
    frame[6] = reinterpret_cast<void*>(&fiber_main);
    frame[7] = nullptr;
    f.sp = frame;
  }
  gdn_emu_switch(&b.scheduler, f.sp);
#else
  if (_setjmp(b.scheduler) != 0) return;  // the fiber waits again, or is done
  if (!f.started) {
    f.started = true;
    setcontext(&f.start);
  }
  _longjmp(f.jb, 1);
#endif
}

inline void run_block(Block& b) {
  const std::size_t n = b.fibers.size();
  for (auto& f : b.fibers) {
    f.state = Fiber::State::runnable;
    f.shuffles = 0;
  }
  std::vector<int> order(n);
  for (;;) {
    order.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (b.fibers[i].state == Fiber::State::runnable) order.push_back(static_cast<int>(i));
    std::shuffle(order.begin(), order.end(), rng());
    for (const int i : order) resume(b, i);
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

// Runs one launch's blocks to completion.
template <typename... Params>
void run_grid(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
              const std::tuple<std::decay_t<Params>...>& params) {
  std::lock_guard guard(device().lock);
  const std::size_t threads = static_cast<std::size_t>(block.x) * block.y * block.z;
  const std::function<void()> entry = [&] { std::apply(kernel, params); };
  Block b;
  b.bdim = block;
  b.gdim = grid;
  b.entry = &entry;
  b.fibers.resize(threads);
  b.exchange.resize(2 * threads);
  b.vote.resize(threads);
  for (std::size_t i = 0; i < threads; ++i) {
    Fiber& f = b.fibers[i];
    f.stack = fiber_stack(i);
#if !GDN_EMU_FAST_SWITCH
    getcontext(&f.start);
    f.start.uc_stack.ss_sp = f.stack;
    f.start.uc_stack.ss_size = kFiberStack;
    f.start.uc_link = nullptr;
    makecontext(&f.start, fiber_main, 0);
#endif
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
}

// Launches kernel<<<grid, block, smem>>>(args...): runs it to completion, or records it while the
// thread captures a graph. Refuses what the emulated GPU would.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t, Args&&... args) {
  DeviceState& d = device();
  if (d.sticky != cudaSuccess) return d.sticky;
  const std::size_t threads = static_cast<std::size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.y > 65535 || grid.z > 65535) return cudaErrorInvalidConfiguration;
  if (smem > d.model.smem_optin) return cudaErrorInvalidValue;  // what cudaFuncSetAttribute answers
  if (d.fail_after_launches == 0) {
    d.fail_after_launches = -1;
    d.sticky = cudaErrorLaunchFailure;
    return d.sticky;
  }
  if (d.fail_after_launches > 0) --d.fail_after_launches;
  ++d.launches;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  std::tuple<std::decay_t<Params>...> params(static_cast<Params>(args)...);
  enqueue([kernel, grid, block, smem, params] { run_grid(kernel, grid, block, smem, params); });
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
