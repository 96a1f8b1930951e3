#pragma once
// Causal depthwise conv1d + SiLU over a GDN layer's qkv channels, continuing every sequence from
// its history (the last K−1 raw inputs, oldest first) and leaving the history of the step's end.
// Reference: the CPU backend's causal_conv1d_silu (src/backend/cpu/kernels/conv.hpp).
//
// One thread per channel, one block per (128 channels, sequence, run of tokens): the thread slides
// a K−1 window through its tokens in registers. Only the block holding a sequence's first run reads
// the old history, so it alone writes the new one (from its registers and the inputs): no other
// block touches the history and prefill needs no second pass.

#include "common.cuh"
#include "kernels.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace kernels {

constexpr int kConvThreads = 128;

template <int K>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_kernel(Conv1dParams p, int tokens_per_block) {
  using detail::to_float;
  const int c = static_cast<int>(blockIdx.x) * kConvThreads + static_cast<int>(threadIdx.x);
  if (c >= p.channels) return;
  const int s = static_cast<int>(blockIdx.y);
  const int row0 = p.cu_seqlens[s];
  const int len = p.cu_seqlens[s + 1] - row0;
  const int t0 = static_cast<int>(blockIdx.z) * tokens_per_block;
  if (t0 >= len) return;
  const int t1 = detail::imin(len, t0 + tokens_per_block);
  const std::int64_t C = p.channels;
  bf16* hist_mem = p.state + static_cast<std::int64_t>(p.slots[s]) * p.state_slot_stride;
  const auto x = [&](int t) { return to_float(p.x[static_cast<std::int64_t>(row0 + t) * p.ld_x + c]); };

  float w[K];
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = to_float(p.weight[static_cast<std::int64_t>(c) * K + j]);
  // old[i]: the input at position i − (K−1) relative to the sequence start (read by the first run only).
  float old[K - 1];
  const bool first = t0 == 0;
  const bool record = p.snapshots != nullptr && (p.snapshot_record == nullptr || p.snapshot_record[s] != 0);
#pragma unroll
  for (int i = 0; i < K - 1; ++i) old[i] = first ? to_float(hist_mem[i * C + c]) : 0.0f;
  // win[j]: the input at t0 − (K−1) + j. Runs after the first start ≥ tokens_per_block ≥ K−1 in.
  float win[K - 1];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int src = t0 - (K - 1) + j;
    win[j] = src >= 0 ? x(src) : old[src + K - 1];
  }
  for (int t = t0; t < t1; ++t) {
    const float cur = x(t);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) acc += w[j] * win[j];
    acc += w[K - 1] * cur;
    p.out[static_cast<std::int64_t>(row0 + t) * p.ld_out + c] = detail::from_float<bf16>(detail::silu(acc));
#pragma unroll
    for (int j = 0; j < K - 2; ++j) win[j] = win[j + 1];
    win[K - 2] = cur;
    if (record) {
      bf16* snap = p.snapshots + static_cast<std::int64_t>(p.slots[s]) * p.snapshot_seq_stride + t * p.snapshot_token_stride;
#pragma unroll
      for (int j = 0; j < K - 1; ++j) snap[j * C + c] = detail::from_float<bf16>(win[j]);
    }
  }
  if (first) {
    // New history: the last K−1 inputs of [old ; x].
#pragma unroll
    for (int i = 0; i < K - 1; ++i) {
      const int src = len - (K - 1) + i;
      hist_mem[i * C + c] = detail::from_float<bf16>(src >= 0 ? x(src) : old[src + K - 1]);
    }
  }
}

}  // namespace kernels
GDN_CUDA_NAMESPACE_END
