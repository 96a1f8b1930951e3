#pragma once
// The gated delta rule, token by token (the decode and MTP-verify form), gates and q/k L2 norm fused.
// Reference: the CPU backend's delta_rule_recurrent (src/backend/cpu/kernels/delta_rule.hpp) after
// its gating and q/k normalisation (kernels/kernel_set.hpp).
//
// One block per (32 value columns, value head, sequence), 4 warps. Warp w keeps rows
// [32w, 32w + 32) of the block's dk×32 slab of S in registers, lane j column j, so every state
// load and store is one 128-byte row segment per warp, the state is read once and written once
// per launch however many tokens the sequence brings, and each token costs two cross-warp sums
// through shared memory:
//   S ← e^g S;  kv = Sᵀk;  u = β(v − kv);  S ← S + k uᵀ;  o = Sᵀq.
// With snapshots, the state after every token is stored too (for exact rollback).

#include "common.cuh"
#include "kernels.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace kernels {

constexpr int kRecThreads = 128;
constexpr int kRecColumns = 32;
constexpr int kRecMaxDk = 128;

__global__ void __launch_bounds__(kRecThreads) gdn_recurrent_kernel(GdnParams p) {
  using detail::to_float;
  constexpr int R = kRecMaxDk / (kRecThreads / detail::kWarp);  // rows per warp
  __shared__ float sq[kRecMaxDk];
  __shared__ float sk[kRecMaxDk];
  __shared__ float red[kRecThreads / detail::kWarp][detail::kWarp];
  __shared__ float scratch[detail::kWarp];
  __shared__ float gates[2];

  const int tid = static_cast<int>(threadIdx.x), lane = tid % detail::kWarp, warp = tid / detail::kWarp;
  const int h = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
  const int dk = p.dk, dv = p.dv;
  const int col = static_cast<int>(blockIdx.x) * kRecColumns + lane;
  const bool col_ok = col < dv;
  const int kh = h / (p.num_v_heads / p.num_k_heads);
  const int row0 = p.cu_seqlens[s];
  const int len = p.cu_seqlens[s + 1] - row0;
  const std::int64_t head_elems = static_cast<std::int64_t>(dk) * dv;
  float* S = p.state + static_cast<std::int64_t>(p.slots[s]) * p.state_slot_stride + h * head_elems;
  const bool record = p.snapshots != nullptr && (p.snapshot_record == nullptr || p.snapshot_record[s] != 0);

  float st[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int a = warp * R + i;
    st[i] = (a < dk && col_ok) ? S[static_cast<std::int64_t>(a) * dv + col] : 0.0f;
  }
  const float neg_exp_a = p.neg_exp_A[h], dt_bias = p.dt_bias[h];
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));

  for (int t = 0; t < len; ++t) {
    const std::int64_t r = row0 + t;
    float qv = 0.0f, kv = 0.0f;
    if (tid < dk) {
      qv = to_float(p.q[r * p.ld_q + static_cast<std::int64_t>(kh) * dk + tid]);
      kv = to_float(p.k[r * p.ld_k + static_cast<std::int64_t>(kh) * dk + tid]);
    }
    const float qq = detail::block_sum(qv * qv, scratch);
    const float kk = detail::block_sum(kv * kv, scratch);
    sq[tid] = qv * (q_scale / sqrtf(qq + 1e-6f));
    sk[tid] = kv * (1.0f / sqrtf(kk + 1e-6f));
    if (tid == 0) {
      gates[0] = neg_exp_a * detail::softplus(to_float(p.a[r * p.ld_a + h]) + dt_bias);
      gates[1] = detail::sigmoid(to_float(p.b[r * p.ld_b + h]));
    }
    __syncthreads();
    const float decay = expf(gates[0]), beta = gates[1];
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      st[i] *= decay;
      part += st[i] * sk[warp * R + i];
    }
    red[warp][lane] = part;
    __syncthreads();
    float dot = 0.0f;
#pragma unroll
    for (int w = 0; w < kRecThreads / detail::kWarp; ++w) dot += red[w][lane];
    __syncthreads();
    const float vb = col_ok ? to_float(p.v[r * p.ld_v + static_cast<std::int64_t>(h) * dv + col]) : 0.0f;
    const float u = beta * (vb - dot);
    part = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      st[i] += sk[warp * R + i] * u;
      part += st[i] * sq[warp * R + i];
    }
    red[warp][lane] = part;
    __syncthreads();
    if (warp == 0 && col_ok) {
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kRecThreads / detail::kWarp; ++w) o += red[w][lane];
      p.out[r * p.ld_out + static_cast<std::int64_t>(h) * dv + col] = detail::from_float<bf16>(o);
    }
    if (record && col_ok) {
      float* snap = p.snapshots + static_cast<std::int64_t>(p.slots[s]) * p.snapshot_seq_stride + t * p.snapshot_token_stride +
                    h * head_elems;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int a = warp * R + i;
        if (a < dk) snap[static_cast<std::int64_t>(a) * dv + col] = st[i];
      }
    }
    __syncthreads();  // sq, sk, red and gates are rewritten by the next token
  }
  if (col_ok) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int a = warp * R + i;
      if (a < dk) S[static_cast<std::int64_t>(a) * dv + col] = st[i];
    }
  }
}

constexpr int kSelectThreads = 256;

// One thread per 16 bytes of a slot's state, grid.y over sequences.
__global__ void __launch_bounds__(kSelectThreads) select_snapshots_kernel(SnapshotSelect p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kSelectThreads + threadIdx.x;
  const int s = static_cast<int>(blockIdx.y);
  if (i * 16 >= p.bytes) return;
  const int keep = p.keep[s];
  if (keep <= 0) return;
  const std::int64_t slot = p.slots[s];
  char* snap = static_cast<char*>(p.snapshots) + slot * p.seq_stride_bytes + (keep - 1) * p.token_stride_bytes;
  char* pool = static_cast<char*>(p.pool) + slot * p.slot_stride_bytes;
  if (p.to_snapshots) reinterpret_cast<uint4*>(snap)[i] = reinterpret_cast<const uint4*>(pool)[i];
  else reinterpret_cast<uint4*>(pool)[i] = reinterpret_cast<const uint4*>(snap)[i];
}

}  // namespace kernels
GDN_CUDA_NAMESPACE_END
