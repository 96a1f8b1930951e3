#pragma once
// The CUB block primitives libgdn's kernels use, for the CPU emulator (emulate.hpp). Same
// interfaces and the same contracts as CUB: BlockReduce's result is valid in thread 0 only (the
// others get their own input back), and TempStorage must not be reused before a __syncthreads —
// no call here ends with a barrier, so a kernel that forgets one reads overwritten values.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace cub {

namespace emu_detail {
inline int tid() { return ::gdn::emu::linear_tid(); }
inline int threads() {
  const dim3& b = ::gdn::emu::block_dim();
  return static_cast<int>(b.x * b.y * b.z);
}
}  // namespace emu_detail

template <typename T, int BLOCK_DIM_X>
class BlockReduce {
 public:
  struct TempStorage {
    T v[BLOCK_DIM_X];
  };
  explicit BlockReduce(TempStorage& t) : t_(t) {}
  template <typename Op>
  T Reduce(T input, Op op) {
    const int me = emu_detail::tid();
    t_.v[me] = input;
    __syncthreads();
    if (me != 0) return input;
    T r = t_.v[0];
    for (int i = 1; i < emu_detail::threads(); ++i) r = op(r, t_.v[i]);
    return r;
  }
  T Sum(T input) {
    return Reduce(input, [](const T& a, const T& b) { return a + b; });
  }

 private:
  TempStorage& t_;
};

template <typename T, int BLOCK_DIM_X>
class BlockScan {
 public:
  struct TempStorage {
    T v[BLOCK_DIM_X];
  };
  explicit BlockScan(TempStorage& t) : t_(t) {}
  void ExclusiveSum(T input, T& output, T& aggregate) {
    const int me = emu_detail::tid();
    t_.v[me] = input;
    __syncthreads();
    T acc{};
    for (int i = 0; i < me; ++i) acc = acc + t_.v[i];
    output = acc;
    T all{};
    for (int i = 0; i < emu_detail::threads(); ++i) all = all + t_.v[i];
    aggregate = all;
  }
  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }
  void InclusiveSum(T input, T& output, T& aggregate) {
    ExclusiveSum(input, output, aggregate);
    output = output + input;
  }
  void InclusiveSum(T input, T& output) {
    T aggregate;
    InclusiveSum(input, output, aggregate);
  }

 private:
  TempStorage& t_;
};

// Stable ascending sort of (key, value) pairs held blocked, ITEMS per thread.
template <typename Key, int BLOCK_DIM_X, int ITEMS, typename Value>
class BlockRadixSort {
 public:
  struct TempStorage {
    Key k[BLOCK_DIM_X * ITEMS];
    Value v[BLOCK_DIM_X * ITEMS];
    int order[BLOCK_DIM_X * ITEMS];
  };
  explicit BlockRadixSort(TempStorage& t) : t_(t) {}
  void Sort(Key (&keys)[ITEMS], Value (&values)[ITEMS]) {
    const int me = emu_detail::tid(), n = emu_detail::threads() * ITEMS;
    for (int i = 0; i < ITEMS; ++i) {
      t_.k[me * ITEMS + i] = keys[i];
      t_.v[me * ITEMS + i] = values[i];
    }
    __syncthreads();
    if (me == 0) {
      std::iota(t_.order, t_.order + n, 0);
      std::stable_sort(t_.order, t_.order + n, [&](int a, int b) { return t_.k[a] < t_.k[b]; });
    }
    __syncthreads();
    for (int i = 0; i < ITEMS; ++i) {
      const int src = t_.order[me * ITEMS + i];
      keys[i] = t_.k[src];
      values[i] = t_.v[src];
    }
  }

 private:
  TempStorage& t_;
};

}  // namespace cub
