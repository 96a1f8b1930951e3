#pragma once
// Gated full attention over the paged KV cache (include/gdn/layers/attention.hpp; reference: the
// CPU backend's src/backend/cpu/kernels/attention.hpp): q/k zero-centred RMSNorm per head, partial NeoX RoPE, GQA,
// causal softmax in float32 with scale 1/sqrt(hd), output multiplied by sigmoid(gate).
//
//  attention_prepare_kernel  one warp per (row, head) of q and k: norm, rope, and for k/v heads the
//                            append to the cache (position kv_len − n + t of its sequence).
//  attention_decode_kernel   flash-decoding: block (split, q head, row), splits of a fixed number of
//                            positions, 4 warps each taking every 4th run of 4 positions of the
//                            split's range, online softmax per warp, merged in
//                            shared memory; with one split it writes the gated output directly,
//                            otherwise (o/l, log-sum-exp) partials for
//  attention_combine_kernel  block (row, q head): merges the splits' partials, applies the gate.
//  attention_prefill_kernel  block (16 query rows, q head, sequence): 32-position K/V tiles staged
//                            in shared memory through the page table, 8 threads per query row,
//                            online softmax. Float32 on CUDA cores; a tensor-core kernel is the
//                            next step (docs/cuda.md).

#include <cfloat>

#include "common.cuh"
#include "kernels.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace kernels {

// Sequence holding row r: the last s with cu_seqlens[s] ≤ r.
__device__ __forceinline__ int sequence_of_row(const std::int32_t* cu_seqlens, int num_seqs, int r) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ const bf16* kv_row(const PagedKv& kv, int s, int pos, int which, int head) {
  const int page = kv.page_indices[kv.page_indptr[s] + pos / kv.page_size];
  return kv.data + page * kv.page_stride + which * kv.kv_stride + head * kv.head_stride +
         static_cast<std::int64_t>(pos % kv.page_size) * kv.row_stride;
}

constexpr int kPrepWarps = 4;

template <int HD>
__global__ void __launch_bounds__(kPrepWarps * 32) attention_prepare_kernel(AttnPrepareParams p) {
  constexpr int V = HD / detail::kWarp;  // elements per lane, contiguous
  __shared__ float buf[kPrepWarps][HD];
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarp, w = static_cast<int>(threadIdx.x) / detail::kWarp;
  const int r = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y) * kPrepWarps + w;
  const int Hq = p.num_q_heads;
  if (head >= Hq + p.num_kv_heads) return;  // whole warps only: no block barrier below
  const int s = sequence_of_row(p.cu_seqlens, p.num_seqs, r);
  const int n = p.cu_seqlens[s + 1] - p.cu_seqlens[s];
  const int pos = p.kv.kv_lens[s] - n + (r - p.cu_seqlens[s]);
  const bool is_q = head < Hq;
  const int g = head - Hq;
  const bf16* src = is_q ? p.q_gate + r * p.ld_q + static_cast<std::int64_t>(head) * 2 * HD
                         : p.k + r * p.ld_k + static_cast<std::int64_t>(g) * HD;
  const float* scale = is_q ? p.q_norm_scale : p.k_norm_scale;
  float x[V];
  detail::load_bf16<V>(src + lane * V, x);
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) ss += x[i] * x[i];
  ss = detail::warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(HD) + p.eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    x[i] = x[i] * inv * scale[lane * V + i];
    buf[w][lane * V + i] = x[i];
  }
  __syncwarp();
  const int half = p.rotary_dim / 2;
  const float fpos = static_cast<float>(pos);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int e = lane * V + i;
    if (e < half) {
      const float a = fpos * p.inv_freq[e];
      x[i] = buf[w][e] * cosf(a) - buf[w][e + half] * sinf(a);
    } else if (e < 2 * half) {
      const float a = fpos * p.inv_freq[e - half];
      x[i] = buf[w][e] * cosf(a) + buf[w][e - half] * sinf(a);
    }
  }
  if (is_q) {
    detail::store_bf16<V>(p.q_out + r * p.ld_q_out + static_cast<std::int64_t>(head) * HD + lane * V, x);
  } else {
    detail::store_bf16<V>(const_cast<bf16*>(kv_row(p.kv, s, pos, 0, g)) + lane * V, x);
    float vv[V];
    detail::load_bf16<V>(p.v + r * p.ld_v + static_cast<std::int64_t>(g) * HD + lane * V, vv);
    detail::store_bf16<V>(const_cast<bf16*>(kv_row(p.kv, s, pos, 1, g)) + lane * V, vv);
  }
}

constexpr int kDecodeWarps = 4;
constexpr int kDecodeUnroll = 4;

template <int HD>
__global__ void __launch_bounds__(kDecodeWarps * 32) attention_decode_kernel(AttnParams p, int splits, int split_len, float* ws) {
  constexpr int V = HD / detail::kWarp;
  __shared__ float sm[kDecodeWarps], sl[kDecodeWarps];
  __shared__ float so[kDecodeWarps][HD];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % detail::kWarp, w = tid / detail::kWarp;
  const int split = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), r = static_cast<int>(blockIdx.z);
  const int s = sequence_of_row(p.cu_seqlens, p.num_seqs, r);
  const int n = p.cu_seqlens[s + 1] - p.cu_seqlens[s];
  const int len = p.kv.kv_lens[s] - n + (r - p.cu_seqlens[s]) + 1;  // positions this row attends to
  const int g = h / (p.num_q_heads / p.num_kv_heads);
  // Split x covers positions [x·split_len, (x + 1)·split_len): fixed boundaries, so a row's result
  // does not depend on its length relative to other rows', nor on the batch (batch invariance).
  const int lo = split * split_len, hi = detail::imin(len, lo + split_len);

  float q[V], o[V];
  detail::load_bf16<V>(p.q + r * p.ld_q + static_cast<std::int64_t>(h) * HD + lane * V, q);
#pragma unroll
  for (int i = 0; i < V; ++i) o[i] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;
  // kDecodeUnroll positions per warp and iteration: their page lookups and K/V loads are issued
  // together, so each lane has 2·kDecodeUnroll independent loads in flight.
  constexpr int U = kDecodeUnroll;
  for (int j0 = lo + w * U; j0 < hi; j0 += kDecodeWarps * U) {
    float kx[U][V], vx[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j0 + u < hi) {
        detail::load_bf16<V>(kv_row(p.kv, s, j0 + u, 0, g) + lane * V, kx[u]);
        detail::load_bf16<V>(kv_row(p.kv, s, j0 + u, 1, g) + lane * V, vx[u]);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) kx[u][i] = vx[u][i] = 0.0f;
      }
    }
    float sc[U];
    float mx = -FLT_MAX;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < V; ++i) d += q[i] * kx[u][i];
      sc[u] = detail::warp_sum(d) * p.scale;
      if (j0 + u < hi) mx = fmaxf(mx, sc[u]);
    }
    const float m_new = fmaxf(m, mx);
    const float corr = expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int i = 0; i < V; ++i) o[i] *= corr;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float e = j0 + u < hi ? expf(sc[u] - m_new) : 0.0f;
      l += e;
#pragma unroll
      for (int i = 0; i < V; ++i) o[i] += e * vx[u][i];
    }
    m = m_new;
  }
  if (lane == 0) {
    sm[w] = m;
    sl[w] = l;
  }
#pragma unroll
  for (int i = 0; i < V; ++i) so[w][lane * V + i] = o[i];
  __syncthreads();
  float M = -FLT_MAX;
#pragma unroll
  for (int x = 0; x < kDecodeWarps; ++x)
    if (sl[x] > 0.0f) M = fmaxf(M, sm[x]);
  float L = 0.0f, wgt[kDecodeWarps];
#pragma unroll
  for (int x = 0; x < kDecodeWarps; ++x) {
    wgt[x] = sl[x] > 0.0f ? expf(sm[x] - M) : 0.0f;
    L += sl[x] * wgt[x];
  }
  const std::int64_t part = (static_cast<std::int64_t>(r) * p.num_q_heads + h) * splits + split;
  for (int d = tid; d < HD; d += kDecodeWarps * 32) {
    float acc = 0.0f;
#pragma unroll
    for (int x = 0; x < kDecodeWarps; ++x) acc += so[x][d] * wgt[x];
    if (splits == 1) {
      const float gate = detail::to_float(p.gate[r * p.ld_gate + h * p.gate_head_stride + d]);
      p.out[r * p.ld_out + static_cast<std::int64_t>(h) * HD + d] = detail::from_float<bf16>(acc / L * detail::sigmoid(gate));
    } else {
      ws[part * HD + d] = L > 0.0f ? acc / L : 0.0f;
    }
  }
  if (splits > 1 && tid == 0) {
    const std::int64_t parts = static_cast<std::int64_t>(p.rows) * p.num_q_heads * splits;
    ws[parts * HD + part] = L > 0.0f ? M + logf(L) : -FLT_MAX;
  }
}

template <int HD>
__global__ void __launch_bounds__(HD) attention_combine_kernel(AttnParams p, int splits, const float* ws) {
  const int d = static_cast<int>(threadIdx.x);
  const int r = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const std::int64_t parts = static_cast<std::int64_t>(p.rows) * p.num_q_heads * splits;
  const std::int64_t first = (static_cast<std::int64_t>(r) * p.num_q_heads + h) * splits;
  const float* lse = ws + parts * HD + first;
  float M = -FLT_MAX;
  for (int x = 0; x < splits; ++x) M = fmaxf(M, lse[x]);
  float W = 0.0f, acc = 0.0f;
  for (int x = 0; x < splits; ++x) {
    if (lse[x] == -FLT_MAX) continue;  // an empty split
    const float wx = expf(lse[x] - M);
    W += wx;
    acc += wx * ws[(first + x) * HD + d];
  }
  const float gate = detail::to_float(p.gate[r * p.ld_gate + h * p.gate_head_stride + d]);
  p.out[r * p.ld_out + static_cast<std::int64_t>(h) * HD + d] = detail::from_float<bf16>(acc / W * detail::sigmoid(gate));
}

constexpr int kPrefillRows = 16;
constexpr int kPrefillKeys = 32;
constexpr int kPrefillThreads = 128;  // 8 per query row
static_assert(kPrefillRows * 8 == kPrefillThreads && kPrefillKeys == 4 * 8, "8 threads per row, 4 keys each");
template <int HD>
constexpr int prefill_smem_floats() {
  return kPrefillRows * (HD + 1) + kPrefillKeys * (HD + 1) + kPrefillKeys * HD + kPrefillRows * kPrefillKeys;
}

template <int HD>
__global__ void __launch_bounds__(kPrefillThreads) attention_prefill_kernel(AttnParams p) {
  constexpr int QP = HD + 1, KP = HD + 1;
  constexpr int DT = HD / 8;  // output dims per thread: sub + 8e
  constexpr int V = HD / detail::kWarp;  // bf16 per staged load
  const int tid = static_cast<int>(threadIdx.x);
  const int qi = tid / 8, sub = tid % 8;
  const int h = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
  const int q0 = p.cu_seqlens[s];
  const int n = p.cu_seqlens[s + 1] - q0;
  const int t0 = static_cast<int>(blockIdx.x) * kPrefillRows;
  if (t0 >= n) return;
  const int base = p.kv.kv_lens[s] - n;  // position of row 0
  const int g = h / (p.num_q_heads / p.num_kv_heads);
  const int rows_here = detail::imin(kPrefillRows, n - t0);
  const int last = base + t0 + rows_here - 1;  // the tile's largest query position
  const bool row_ok = qi < rows_here;
  const int my_pos = base + t0 + qi;

  GDN_DYNAMIC_SMEM(float, smem);
  float* Qs = smem;
  float* Ks = Qs + kPrefillRows * QP;
  float* Vs = Ks + kPrefillKeys * KP;
  float* Ps = Vs + kPrefillKeys * HD;

  for (int idx = tid; idx < kPrefillRows * HD / V; idx += kPrefillThreads) {
    const int i = idx / (HD / V), d = (idx % (HD / V)) * V;
    float x[V];
    if (i < rows_here) {
      detail::load_bf16<V>(p.q + static_cast<std::int64_t>(q0 + t0 + i) * p.ld_q + static_cast<std::int64_t>(h) * HD + d, x);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) x[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < V; ++e) Qs[i * QP + d + e] = x[e];
  }
  float o[DT];
#pragma unroll
  for (int e = 0; e < DT; ++e) o[e] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;

  for (int k0 = 0; k0 <= last; k0 += kPrefillKeys) {
    __syncthreads();  // Q staged / the previous tile consumed
    for (int idx = tid; idx < kPrefillKeys * HD / V; idx += kPrefillThreads) {
      const int j = idx / (HD / V), d = (idx % (HD / V)) * V;
      float kx[V], vx[V];
      if (k0 + j <= last) {
        detail::load_bf16<V>(kv_row(p.kv, s, k0 + j, 0, g) + d, kx);
        detail::load_bf16<V>(kv_row(p.kv, s, k0 + j, 1, g) + d, vx);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) kx[e] = vx[e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < V; ++e) {
        Ks[j * KP + d + e] = kx[e];
        Vs[j * HD + d + e] = vx[e];
      }
    }
    __syncthreads();
    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int e = 0; e < HD; ++e) {
      const float qv = Qs[qi * QP + e];
#pragma unroll
      for (int c = 0; c < 4; ++c) sc[c] += qv * Ks[(sub + 8 * c) * KP + e];
    }
    float tmax = -FLT_MAX;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const bool ok = row_ok && k0 + sub + 8 * c <= my_pos;
      sc[c] = ok ? sc[c] * p.scale : -FLT_MAX;
      tmax = fmaxf(tmax, sc[c]);
    }
    tmax = detail::group_max<8>(tmax);
    const float m_new = fmaxf(m, tmax);
    float psum = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float e = sc[c] == -FLT_MAX ? 0.0f : expf(sc[c] - m_new);
      Ps[qi * kPrefillKeys + sub + 8 * c] = e;
      psum += e;
    }
    const float corr = m == -FLT_MAX ? 0.0f : expf(m - m_new);
    l = l * corr + detail::group_sum<8>(psum);
    m = m_new;
    __syncwarp();
#pragma unroll
    for (int e = 0; e < DT; ++e) o[e] *= corr;
    for (int j = 0; j < kPrefillKeys; ++j) {
      const float pj = Ps[qi * kPrefillKeys + j];
#pragma unroll
      for (int e = 0; e < DT; ++e) o[e] += pj * Vs[j * HD + sub + 8 * e];
    }
  }
  if (!row_ok) return;
  const std::int64_t r = q0 + t0 + qi;
  const float inv = 1.0f / l;
#pragma unroll
  for (int e = 0; e < DT; ++e) {
    const int d = sub + 8 * e;
    const float gate = detail::to_float(p.gate[r * p.ld_gate + h * p.gate_head_stride + d]);
    p.out[r * p.ld_out + static_cast<std::int64_t>(h) * HD + d] = detail::from_float<bf16>(o[e] * inv * detail::sigmoid(gate));
  }
}

}  // namespace kernels
GDN_CUDA_NAMESPACE_END
