#pragma once
// The gated delta rule in chunks of 64 tokens (WY/UT form) for prefill, gates and q/k L2 norm fused,
// state carried between chunks in float32. Reference: the CPU delta_rule_chunked (src/backend/cpu/kernels/delta_rule.hpp).
//
// Within a chunk of m ≤ 64 tokens, with γ the inclusive cumulative log-decay, Γ_ij = e^(γ_i − γ_j),
// A = strict_tril(diag(β)·K·Kᵀ ⊙ Γ) and T = I + A (unit lower triangular):
//   Vn = T⁻¹(β ⊙ (V − e^γ ⊙ K·S))       (= U − W·S of the reference: T⁻¹ is applied after K·S)
//   O  = (e^γ ⊙ Q)·S + (Q·Kᵀ ⊙ Γ ⊙ causal)·Vn
//   S ← e^(γ_m) S + (e^(γ_m − γ) ⊙ K)ᵀ·Vn
// Two launches over all sequences:
//  1. gdn_chunk_prepare_kernel — one block per (chunk, value head, sequence), all chunks at once:
//     normalises q and k, computes the gates, γ, A, the decayed causal Q·Kᵀ, and T⁻¹ (by forward
//     substitution on the identity), and stores per row: T⁻¹ row | QK row | γ | β (kWsRecord floats).
//  2. gdn_chunk_state_kernel — one block per (32 value columns, value head, sequence): walks the
//     sequence's chunks in order with its dk×32 slab of S in shared memory, doing only the
//     state-dependent products above.
// Every product is float32 on CUDA cores (no tensor cores yet: see docs/cuda.md).

#include "common.cuh"
#include "kernels.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace kernels {

constexpr int kChunk = 64;
constexpr int kChunkMaxDk = 128;
constexpr int kChunkThreads = 256;
constexpr int kChunkColumns = 32;
constexpr int kWsRecord = 2 * kChunk + 4;  // T⁻¹ row, QK row, γ, β, padding to 16 bytes
constexpr int kKPitch = kChunkMaxDk + 1;   // shared rows of q/k, padded against bank conflicts
constexpr int kTPitch = kChunk + 1;

// Shared memory of each kernel, in floats.
constexpr int kPrepareSmemFloats = 2 * kChunk * kKPitch + 2 * kChunk * kTPitch + 3 * kChunk;
// The state kernel stages each chunk's T⁻¹ and QK rows in shared memory when the device allows
// (Hopper, A100: 130 KB); on GPUs with 99 KB per block (RTX 30xx/40xx, A6000, L40) it reads them
// from the workspace (L1/L2) instead: the same values in the same order, so the same results.
constexpr int kStateTSmemFloats = 2 * kChunk * kTPitch;
constexpr int kStateSmemFloats = kChunkMaxDk * kChunkColumns + 2 * kChunk * kKPitch + kStateTSmemFloats +
                                 2 * kChunk * (kChunkColumns + 1) + 3 * kChunk;

// Loads rows [t0, t0 + m) of q and k of key head kh, L2-normalised (q also scaled), into qs/ks
// (pitch kKPitch); rows ≥ m and dims ≥ dk are zero. One warp per row.
__device__ __forceinline__ void load_normalized_qk(const GdnParams& p, std::int64_t row0, int m, int kh, float* qs,
                                                   float* ks) {
  using detail::to_float;
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarp, warp = static_cast<int>(threadIdx.x) / detail::kWarp;
  constexpr int warps = kChunkThreads / detail::kWarp;
  constexpr int per_lane = kChunkMaxDk / detail::kWarp;
  const int dk = p.dk;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  for (int i = warp; i < kChunk; i += warps) {
    float qv[per_lane], kv[per_lane];
    float qq = 0.0f, kk = 0.0f;
#pragma unroll
    for (int j = 0; j < per_lane; ++j) {
      const int e = lane + j * detail::kWarp;
      qv[j] = kv[j] = 0.0f;
      if (i < m && e < dk) {
        qv[j] = to_float(p.q[(row0 + i) * p.ld_q + static_cast<std::int64_t>(kh) * dk + e]);
        kv[j] = to_float(p.k[(row0 + i) * p.ld_k + static_cast<std::int64_t>(kh) * dk + e]);
      }
      qq += qv[j] * qv[j];
      kk += kv[j] * kv[j];
    }
    qq = detail::warp_sum(qq);
    kk = detail::warp_sum(kk);
    const float rq = q_scale / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
#pragma unroll
    for (int j = 0; j < per_lane; ++j) {
      const int e = lane + j * detail::kWarp;
      qs[i * kKPitch + e] = qv[j] * rq;
      ks[i * kKPitch + e] = kv[j] * rk;
    }
  }
}

__global__ void __launch_bounds__(kChunkThreads) gdn_chunk_prepare_kernel(GdnParams p, float* ws) {
  using detail::to_float;
  const int tid = static_cast<int>(threadIdx.x);
  const int c = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
  const int seq0 = p.cu_seqlens[s];
  const int len = p.cu_seqlens[s + 1] - seq0;
  const int t0 = c * kChunk;
  if (t0 >= len) return;
  const int m = detail::imin(kChunk, len - t0);
  const std::int64_t row0 = static_cast<std::int64_t>(seq0) + t0;
  const int kh = h / (p.num_v_heads / p.num_k_heads);
  const int Hv = p.num_v_heads;

  GDN_DYNAMIC_SMEM(float, smem);
  float* qs = smem;
  float* ks = qs + kChunk * kKPitch;
  float* A = ks + kChunk * kKPitch;
  float* X = A + kChunk * kTPitch;  // T⁻¹
  float* g = X + kChunk * kTPitch;
  float* gam = g + kChunk;
  float* bet = gam + kChunk;

  load_normalized_qk(p, row0, m, kh, qs, ks);
  if (tid < kChunk) {
    float gi = 0.0f, bi = 0.0f;
    if (tid < m) {
      gi = p.neg_exp_A[h] * detail::softplus(to_float(p.a[(row0 + tid) * p.ld_a + h]) + p.dt_bias[h]);
      bi = detail::sigmoid(to_float(p.b[(row0 + tid) * p.ld_b + h]));
    }
    g[tid] = gi;
    bet[tid] = bi;
  }
  __syncthreads();
  if (tid == 0) {
    float acc = 0.0f;  // sequential, in the reference's order
    for (int i = 0; i < kChunk; ++i) gam[i] = acc += g[i];
  }
  __syncthreads();

  // A and the decayed causal QK, 4×4 entries per thread: rows ti + 16a, columns tj + 16b.
  {
    const int ti = tid / 16, tj = tid % 16;
    float kk[4][4] = {}, qk[4][4] = {};
    for (int e = 0; e < p.dk; ++e) {
      float ki[4], qi[4], kj[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        ki[x] = ks[(ti + 16 * x) * kKPitch + e];
        qi[x] = qs[(ti + 16 * x) * kKPitch + e];
        kj[x] = ks[(tj + 16 * x) * kKPitch + e];
      }
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) {
          kk[x][y] += ki[x] * kj[y];
          qk[x][y] += qi[x] * kj[y];
        }
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int i = ti + 16 * x;
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        const int j = tj + 16 * y;
        const bool in = i < m && j <= i;
        const float decay = in ? expf(gam[i] - gam[j]) : 0.0f;
        A[i * kTPitch + j] = in && j < i ? bet[i] * kk[x][y] * decay : 0.0f;
        if (i < m) ws[((row0 + i) * Hv + h) * kWsRecord + kChunk + j] = in ? qk[x][y] * decay : 0.0f;
      }
    }
  }
  __syncthreads();

  // X = (I + A)⁻¹ row by row: X[i][j] = δ_ij − Σ_{j ≤ l < i} A[i][l]·X[l][j]. Four threads per column.
  {
    const int j = tid / 4, part = tid % 4;
    for (int i = 0; i < kChunk; ++i) {
      float acc = 0.0f;
      for (int l = j + part; l < i; l += 4) acc += A[i * kTPitch + l] * X[l * kTPitch + j];
      acc = detail::group_sum<4>(acc);
      if (part == 0) X[i * kTPitch + j] = j < i ? -acc : (j == i ? 1.0f : 0.0f);
      __syncthreads();
    }
  }
  for (int idx = tid; idx < m * kChunk; idx += kChunkThreads) {
    const int i = idx / kChunk, j = idx % kChunk;
    ws[((row0 + i) * Hv + h) * kWsRecord + j] = X[i * kTPitch + j];
  }
  if (tid < m) {
    float* rec = ws + ((row0 + tid) * Hv + h) * kWsRecord;
    rec[2 * kChunk] = gam[tid];
    rec[2 * kChunk + 1] = bet[tid];
  }
}

template <bool kStageT>
__global__ void __launch_bounds__(kChunkThreads) gdn_chunk_state_kernel(GdnParams p, const float* ws) {
  using detail::to_float;
  constexpr int BV = kChunkColumns;
  constexpr int warps = kChunkThreads / detail::kWarp;  // 8: warp = row group, lane = column
  constexpr int RO = kChunk / warps;                    // output rows per thread
  constexpr int RS = kChunkMaxDk / warps;               // state rows per thread
  const int tid = static_cast<int>(threadIdx.x), lane = tid % detail::kWarp, warp = tid / detail::kWarp;
  const int h = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
  const int dk = p.dk, dv = p.dv, Hv = p.num_v_heads;
  const int col = static_cast<int>(blockIdx.x) * BV + lane;
  const bool col_ok = col < dv;
  const int kh = h / (p.num_v_heads / p.num_k_heads);
  const int seq0 = p.cu_seqlens[s];
  const int len = p.cu_seqlens[s + 1] - seq0;
  const std::int64_t head_elems = static_cast<std::int64_t>(dk) * dv;
  float* Sg = p.state + static_cast<std::int64_t>(p.slots[s]) * p.state_slot_stride + h * head_elems;

  GDN_DYNAMIC_SMEM(float, smem);
  float* S = smem;  // [kChunkMaxDk][BV]
  float* qs = S + kChunkMaxDk * BV;
  float* ks = qs + kChunk * kKPitch;
  float* Ti = ks + kChunk * kKPitch;  // staged only
  float* QK = Ti + kChunk * kTPitch;
  float* R = kStageT ? QK + kChunk * kTPitch : Ti;  // [kChunk][BV + 1]
  float* Vn = R + kChunk * (BV + 1);
  float* gam = Vn + kChunk * (BV + 1);
  float* bet = gam + kChunk;
  float* kdec = bet + kChunk;  // e^(γ_m − γ_j)

#pragma unroll
  for (int x = 0; x < RS; ++x) {
    const int a = warp + warps * x;
    S[a * BV + lane] = (a < dk && col_ok) ? Sg[static_cast<std::int64_t>(a) * dv + col] : 0.0f;
  }

  for (int t0 = 0; t0 < len; t0 += kChunk) {
    const int m = detail::imin(kChunk, len - t0);
    const std::int64_t row0 = static_cast<std::int64_t>(seq0) + t0;
    __syncthreads();  // the previous chunk is done with every buffer
    load_normalized_qk(p, row0, m, kh, qs, ks);
    if constexpr (kStageT) {
      for (int idx = tid; idx < kChunk * kChunk; idx += kChunkThreads) {
        const int i = idx / kChunk, j = idx % kChunk;
        const float* rec = ws + ((row0 + i) * Hv + h) * kWsRecord;
        Ti[i * kTPitch + j] = i < m ? rec[j] : 0.0f;
        QK[i * kTPitch + j] = i < m ? rec[kChunk + j] : 0.0f;
      }
    }
    // Row i of T⁻¹ (QK): staged, or the workspace record of the chunk's row i (rows ≥ m are zero).
    const auto t_row = [&](int i) { return kStageT ? Ti + i * kTPitch : ws + ((row0 + i) * Hv + h) * kWsRecord; };
    const auto qk_row = [&](int i) { return kStageT ? QK + i * kTPitch : ws + ((row0 + i) * Hv + h) * kWsRecord + kChunk; };
    if (tid < kChunk) {
      const float* rec = ws + ((row0 + tid) * Hv + h) * kWsRecord;
      gam[tid] = tid < m ? rec[2 * kChunk] : 0.0f;
      bet[tid] = tid < m ? rec[2 * kChunk + 1] : 0.0f;
    }
    __syncthreads();
    if (tid < kChunk) kdec[tid] = tid < m ? expf(gam[m - 1] - gam[tid]) : 0.0f;

    // P = K·S and Q·S for rows warp + 8x, column lane; then R = β(V − e^γ P), and e^γ Q·S kept.
    float qsum[RO];
    {
      float ksum[RO];
#pragma unroll
      for (int x = 0; x < RO; ++x) ksum[x] = qsum[x] = 0.0f;
      for (int e = 0; e < dk; ++e) {
        const float sv = S[e * BV + lane];
#pragma unroll
        for (int x = 0; x < RO; ++x) {
          const int i = warp + warps * x;
          ksum[x] += ks[i * kKPitch + e] * sv;
          qsum[x] += qs[i * kKPitch + e] * sv;
        }
      }
#pragma unroll
      for (int x = 0; x < RO; ++x) {
        const int i = warp + warps * x;
        const float eg = i < m ? expf(gam[i]) : 0.0f;
        qsum[x] *= eg;
        float r = 0.0f;
        if (i < m && col_ok) {
          const float v = to_float(p.v[(row0 + i) * p.ld_v + static_cast<std::int64_t>(h) * dv + col]);
          r = bet[i] * (v - eg * ksum[x]);
        }
        R[i * (BV + 1) + lane] = r;
      }
    }
    __syncthreads();
    // Vn = T⁻¹·R (lower triangular, unit diagonal stored).
#pragma unroll
    for (int x = 0; x < RO; ++x) {
      const int i = warp + warps * x;
      float acc = 0.0f;
      if (i < m) {
        const float* ti = t_row(i);
        for (int j = 0; j <= i; ++j) acc += ti[j] * R[j * (BV + 1) + lane];
      }
      Vn[i * (BV + 1) + lane] = i < m ? acc : 0.0f;
    }
    __syncthreads();
    // O = e^γ Q·S + QK·Vn.
#pragma unroll
    for (int x = 0; x < RO; ++x) {
      const int i = warp + warps * x;
      float acc = qsum[x];
      if (i < m) {
        const float* qk = qk_row(i);
        for (int j = 0; j <= i; ++j) acc += qk[j] * Vn[j * (BV + 1) + lane];
      }
      if (i < m && col_ok)
        p.out[(row0 + i) * p.ld_out + static_cast<std::int64_t>(h) * dv + col] = detail::from_float<bf16>(acc);
    }
    // S ← e^(γ_m) S + Σ_j e^(γ_m − γ_j) k_j Vn_jᵀ (each thread its own entries of S).
    const float chunk_decay = expf(gam[m - 1]);
#pragma unroll 4
    for (int x = 0; x < RS; ++x) {
      const int a = warp + warps * x;
      float acc = 0.0f;
      for (int j = 0; j < m; ++j) acc += kdec[j] * ks[j * kKPitch + a] * Vn[j * (BV + 1) + lane];
      S[a * BV + lane] = chunk_decay * S[a * BV + lane] + acc;
    }
  }
  __syncthreads();
  if (col_ok) {
#pragma unroll
    for (int x = 0; x < RS; ++x) {
      const int a = warp + warps * x;
      if (a < dk) Sg[static_cast<std::int64_t>(a) * dv + col] = S[a * BV + lane];
    }
  }
}

}  // namespace kernels
GDN_CUDA_NAMESPACE_END
