#pragma once
// Sampling on the device, one 1024-thread block per row (semantics in kernels.hpp, reference
// gdn::Sampler::distribution / draw in src/sampling.cpp). The steps, each a pass over the row
// (which the first pass leaves in L2):
//  1. argmax with CUB BlockReduce (greedy rows stop here);
//  2. the k-th largest logit by radix select on order-preserving keys (4 passes of 8 bits, shared
//     histograms), its count of strictly larger ones, and the top-k mass Z;
//  3. the (at most 1024) most likely tokens compacted in vocabulary order with a BlockScan, then
//     sorted by logit with BlockRadixSort (stable, so ties keep the lower index first, as the CPU);
//  4. top-p and min-p cuts on the sorted candidates (BlockScan of the weights);
//  5. the draw: a BlockScan of the kept weights in vocabulary order, first prefix above u.
// The kept set is carried as (threshold key, number of tied tokens kept), so the final pass can
// test membership of any token without storing the set.

#include <climits>

#include "common.cuh"
#include "kernels.hpp"

#if !defined(GDN_CUDA_EMULATE)
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#endif

GDN_CUDA_NAMESPACE_BEGIN
namespace kernels {

constexpr int kSampleThreads = 1024;
constexpr int kSampleItems = 4;
constexpr int kSampleTile = kSampleThreads * kSampleItems;
static_assert(kSampleMaxCandidates == kSampleThreads, "one candidate per thread");

// Larger float ↔ larger key; NaN below everything.
__device__ __forceinline__ unsigned order_key(float f) {
  if (f != f) return 0u;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k);
}

struct KeyIndex {
  unsigned key;
  int index;
};
struct KeyIndexMax {
  __device__ __forceinline__ KeyIndex operator()(const KeyIndex& a, const KeyIndex& b) const {
    return (a.key > b.key || (a.key == b.key && a.index < b.index)) ? a : b;
  }
};
struct IntMin {
  __device__ __forceinline__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct IntMax {
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};

using SampleReduceKI = cub::BlockReduce<KeyIndex, kSampleThreads>;
using SampleReduceF = cub::BlockReduce<float, kSampleThreads>;
using SampleReduceI = cub::BlockReduce<int, kSampleThreads>;
using SampleScanU64 = cub::BlockScan<unsigned long long, kSampleThreads>;
using SampleScanF = cub::BlockScan<float, kSampleThreads>;
using SampleSort = cub::BlockRadixSort<unsigned, kSampleThreads, 1, int>;

union SampleTemp {
  typename SampleReduceKI::TempStorage reduce_ki;
  typename SampleReduceF::TempStorage reduce_f;
  typename SampleReduceI::TempStorage reduce_i;
  typename SampleScanU64::TempStorage scan_u64;
  typename SampleScanF::TempStorage scan_f;
  typename SampleSort::TempStorage sort;
};

// Block-wide argmax of row L (lowest index on ties); every thread gets it.
__device__ __forceinline__ KeyIndex block_argmax(const float* L, int V, SampleTemp& tmp, KeyIndex* bcast) {
  KeyIndex best{0u, INT_MAX};
  for (int i = static_cast<int>(threadIdx.x); i < V; i += kSampleThreads) {
    const unsigned k = order_key(L[i]);
    if (k > best.key || (k == best.key && i < best.index)) best = KeyIndex{k, i};
  }
  const KeyIndex agg = SampleReduceKI(tmp.reduce_ki).Reduce(best, KeyIndexMax());
  if (threadIdx.x == 0) *bcast = agg;
  __syncthreads();
  const KeyIndex r = *bcast;
  __syncthreads();
  return r;
}

// The key of the k-th largest element (1 ≤ k ≤ V) and how many keys are strictly larger.
__device__ __forceinline__ void radix_select(const float* L, int V, int k, int* hist, int* bcast, unsigned& thr, int& gt) {
  const int tid = static_cast<int>(threadIdx.x);
  unsigned prefix = 0u, mask = 0u;
  int remaining = k, above_total = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kSampleThreads) hist[i] = 0;
    __syncthreads();
    for (int i = tid; i < V; i += kSampleThreads) {
      const unsigned key = order_key(L[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int acc = 0, d = 255;
      for (; d > 0; --d) {
        if (acc + hist[d] >= remaining) break;
        acc += hist[d];
      }
      bcast[0] = d;
      bcast[1] = acc;
    }
    __syncthreads();
    const unsigned d = static_cast<unsigned>(bcast[0]);
    const int above = bcast[1];
    above_total += above;
    remaining -= above;
    prefix |= d << shift;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  thr = prefix;
  gt = above_total;
}

__global__ void __launch_bounds__(kSampleThreads) argmax_kernel(const float* logits, std::int64_t ld, int V,
                                                                std::int32_t* tokens) {
  __shared__ SampleTemp tmp;
  __shared__ KeyIndex bcast;
  const KeyIndex best = block_argmax(logits + static_cast<std::int64_t>(blockIdx.x) * ld, V, tmp, &bcast);
  if (threadIdx.x == 0) tokens[blockIdx.x] = best.index;
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(SampleParams p) {
  __shared__ SampleTemp tmp;
  __shared__ unsigned cand_key[kSampleThreads];
  __shared__ int cand_idx[kSampleThreads];
  __shared__ int hist[256];
  __shared__ int ib[4];
  __shared__ float fb[2];
  __shared__ unsigned ub[1];
  __shared__ KeyIndex kib;
  const int tid = static_cast<int>(threadIdx.x);
  const int r = static_cast<int>(blockIdx.x), V = p.vocab;
  const float* L = p.logits + static_cast<std::int64_t>(r) * p.ld_logits;
  float* probs = p.probs != nullptr ? p.probs + static_cast<std::int64_t>(r) * p.ld_probs : nullptr;
  if (tid == 0 && p.flags != nullptr) p.flags[r] = 0;

  const KeyIndex best = block_argmax(L, V, tmp, &kib);
  const float temperature = p.temperature[r];
  if (!(temperature > 0.0f)) {
    if (tid == 0) p.tokens[r] = best.index;
    if (probs != nullptr)
      for (int i = tid; i < V; i += kSampleThreads) probs[i] = i == best.index ? 1.0f : 0.0f;
    return;
  }
  const float mx = key_value(best.key), inv_t = 1.0f / temperature;
  const auto weight = [&](float l) { return expf((l - mx) * inv_t); };
  const int K = p.top_k[r] > 0 ? detail::imin(p.top_k[r], V) : V;

  // Top-k set: keys above thr_k, plus the first ties_k (in vocabulary order) equal to it; its mass Z.
  unsigned thr_k;
  int gt_k;
  radix_select(L, V, K, hist, ib, thr_k, gt_k);
  const int ties_k = K - gt_k;
  float zpart = 0.0f;
  for (int i = tid; i < V; i += kSampleThreads) {
    const float l = L[i];
    if (order_key(l) > thr_k) zpart += weight(l);
  }
  const float zsum = SampleReduceF(tmp.reduce_f).Sum(zpart);
  if (tid == 0) fb[0] = zsum + static_cast<float>(ties_k) * weight(key_value(thr_k));
  __syncthreads();
  const float Z = fb[0];

  // Candidates: the Kc most likely, compacted in vocabulary order.
  const int Kc = detail::imin(K, kSampleThreads);
  unsigned thr_c = thr_k;
  int gt_c = gt_k;
  if (K > Kc) radix_select(L, V, Kc, hist, ib, thr_c, gt_c);
  const int ties_c = Kc - gt_c;
  {
    long long run_gt = 0, run_eq = 0;
    for (int base = 0; base < V; base += kSampleTile) {
      unsigned keys[kSampleItems];
      unsigned long long cnt = 0;
#pragma unroll
      for (int e = 0; e < kSampleItems; ++e) {
        const int i = base + tid * kSampleItems + e;
        keys[e] = i < V ? order_key(L[i]) : 0u;
        if (i < V && keys[e] > thr_c) cnt += 1ull << 32;
        else if (i < V && keys[e] == thr_c) cnt += 1ull;
      }
      unsigned long long pre, agg;
      SampleScanU64(tmp.scan_u64).ExclusiveSum(cnt, pre, agg);
      long long pg = run_gt + static_cast<long long>(pre >> 32), pe = run_eq + static_cast<long long>(pre & 0xffffffffull);
#pragma unroll
      for (int e = 0; e < kSampleItems; ++e) {
        const int i = base + tid * kSampleItems + e;
        if (i >= V) continue;
        if (keys[e] > thr_c) {
          const long long pos = pg + (pe < ties_c ? pe : ties_c);
          cand_key[pos] = keys[e];
          cand_idx[pos] = i;
          ++pg;
        } else if (keys[e] == thr_c) {
          if (pe < ties_c) {
            cand_key[pg + pe] = keys[e];
            cand_idx[pg + pe] = i;
          }
          ++pe;
        }
      }
      run_gt += static_cast<long long>(agg >> 32);
      run_eq += static_cast<long long>(agg & 0xffffffffull);
      __syncthreads();
    }
  }
  unsigned sk[1];
  int sv[1];
  sk[0] = tid < Kc ? ~cand_key[tid] : 0xffffffffu;
  sv[0] = tid < Kc ? cand_idx[tid] : INT_MAX;
  __syncthreads();
  SampleSort(tmp.sort).Sort(sk, sv);
  __syncthreads();
  const bool valid = tid < Kc;
  const unsigned my_key = ~sk[0];
  const float my_w = valid ? weight(key_value(my_key)) : 0.0f;

  // The kept set as (thr_f, ties_f) and its mass.
  const float top_p = p.top_p[r], min_p = p.min_p[r];
  const bool tp_on = top_p < 1.0f, mp_on = min_p > 0.0f;
  unsigned thr_f = thr_k;
  int ties_f = ties_k;
  float total = Z;
  if (tp_on || mp_on) {
    float cum;
    SampleScanF(tmp.scan_f).InclusiveSum(my_w, cum);
    __syncthreads();
    const int cut = SampleReduceI(tmp.reduce_i).Reduce(tp_on && valid && cum / Z >= top_p ? tid + 1 : INT_MAX, IntMin());
    const int n_keep_m = __syncthreads_count(mp_on && valid && my_w >= min_p);
    if (tid == 0) {
      int n_p = K, n_m = K;
      bool flag = false;
      if (tp_on) {
        n_p = cut != INT_MAX ? cut : Kc;
        flag = flag || (cut == INT_MAX && K > Kc);
      }
      if (mp_on) {
        n_m = n_keep_m;
        flag = flag || (n_keep_m == Kc && K > Kc);
      }
      const int n = detail::imax(1, detail::imin(detail::imin(n_p, n_m), Kc));
      ib[0] = n;
      if (flag && p.flags != nullptr) p.flags[r] = 1;
    }
    __syncthreads();
    const int n = ib[0];
    if (tid == n - 1) ub[0] = my_key;
    __syncthreads();
    thr_f = ub[0];
    ties_f = __syncthreads_count(tid < n && my_key == thr_f);
    const float kept = SampleReduceF(tmp.reduce_f).Sum(tid < n ? my_w : 0.0f);
    if (tid == 0) fb[1] = kept;
    __syncthreads();
    total = fb[1];
  }

  // The draw, in vocabulary order.
  const float u = p.uniforms[r];
  const float inv_total = 1.0f / total;
  long long run_eq = 0;
  float run_cum = 0.0f;
  int found = INT_MAX, last = -1;
  for (int base = 0; base < V; base += kSampleTile) {
    unsigned keys[kSampleItems];
    float l[kSampleItems];
    unsigned long long eq = 0;
#pragma unroll
    for (int e = 0; e < kSampleItems; ++e) {
      const int i = base + tid * kSampleItems + e;
      l[e] = i < V ? L[i] : 0.0f;
      keys[e] = i < V ? order_key(l[e]) : 0u;
      if (i < V && keys[e] == thr_f) ++eq;
    }
    unsigned long long pre, agg;
    SampleScanU64(tmp.scan_u64).ExclusiveSum(eq, pre, agg);
    __syncthreads();
    long long rank = run_eq + static_cast<long long>(pre);
    float pw[kSampleItems], mine = 0.0f;
#pragma unroll
    for (int e = 0; e < kSampleItems; ++e) {
      const int i = base + tid * kSampleItems + e;
      bool kept = false;
      if (i < V && keys[e] > thr_f) kept = true;
      else if (i < V && keys[e] == thr_f) kept = rank++ < ties_f;
      pw[e] = kept ? weight(l[e]) * inv_total : -1.0f;
      if (kept) mine += pw[e];
    }
    run_eq += static_cast<long long>(agg);
    float before, tile_sum;
    SampleScanF(tmp.scan_f).ExclusiveSum(mine, before, tile_sum);
    float c = run_cum + before;
    int first_here = INT_MAX;
#pragma unroll
    for (int e = 0; e < kSampleItems; ++e) {
      const int i = base + tid * kSampleItems + e;
      if (pw[e] >= 0.0f) {
        c += pw[e];
        last = i;
        if (first_here == INT_MAX && u < c) first_here = i;
      }
      if (probs != nullptr && i < V) probs[i] = pw[e] >= 0.0f ? pw[e] : 0.0f;
    }
    run_cum += tile_sum;
    __syncthreads();
    const int tile_first = SampleReduceI(tmp.reduce_i).Reduce(first_here, IntMin());
    if (tid == 0) ib[2] = tile_first;
    __syncthreads();
    if (ib[2] != INT_MAX && found == INT_MAX) found = ib[2];
    if (found != INT_MAX && probs == nullptr) break;  // uniform: every thread read the same ib[2]
    __syncthreads();
  }
  __syncthreads();
  const int last_kept = SampleReduceI(tmp.reduce_i).Reduce(last, IntMax());
  if (tid == 0) p.tokens[r] = found != INT_MAX ? found : last_kept;
}

}  // namespace kernels
GDN_CUDA_NAMESPACE_END
