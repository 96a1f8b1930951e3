#pragma once
// Projections of a few rows (decode, MTP verify): y[r][o] = Σ_i x[r][i]·W[o][i] with bf16 x and W
// (W as stored, [out][in]), float32 sums, bf16 or float32 y. Memory-bound: each weight row is
// read once per group of 8 activation rows, 16 bytes a lane, and the activations come from L1/L2.
//
// One block per (16 output rows, group of 8 activation rows), 4 warps of 4 output rows each (four
// 16-byte weight loads in flight per lane and step); a lane sums its own columns in increasing
// order, then one lane per (output, row) adds the 32 partials in lane order. An element of y is thus the same sequence of operations whatever the number of rows or which rows
// share the call: a batch of decodes gives each sequence exactly what it would get alone, and an
// MTP verification step exactly what plain decoding would.

#include "common.cuh"
#include "kernels.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace kernels {

constexpr int kGemvWarps = 4;
constexpr int kGemvOutPerWarp = 4;
constexpr int kGemvRows = 8;  // activation rows per block
static_assert(kGemvOutPerWarp * kGemvRows == 32, "one lane per (output, row) of a warp adds its partials");

// VEC: 8 elements (16 bytes) per lane and step; needs in % 8 == 0 and 16-byte aligned rows.
template <bool VEC>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvParams p) {
  using detail::to_float;
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarp, warp = static_cast<int>(threadIdx.x) / detail::kWarp;
  const int o0 = (static_cast<int>(blockIdx.x) * kGemvWarps + warp) * kGemvOutPerWarp;
  const int r0 = static_cast<int>(blockIdx.y) * kGemvRows;
  const int nr = detail::imin(kGemvRows, p.rows - r0);
  if (o0 >= p.out) return;  // a whole warp at once: no shuffle below waits for it
  float acc[kGemvOutPerWarp][kGemvRows];
#pragma unroll
  for (int j = 0; j < kGemvOutPerWarp; ++j)
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) acc[j][r] = 0.0f;
  const bf16* wrow[kGemvOutPerWarp];
#pragma unroll
  for (int j = 0; j < kGemvOutPerWarp; ++j) wrow[j] = p.w + static_cast<std::int64_t>(detail::imin(o0 + j, p.out - 1)) * p.ldw;
  if constexpr (VEC) {
    for (int k = lane * 8; k < p.in; k += detail::kWarp * 8) {
      float w[kGemvOutPerWarp][8];
#pragma unroll
      for (int j = 0; j < kGemvOutPerWarp; ++j) detail::load_bf16<8>(wrow[j] + k, w[j]);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r < nr) {
          float x[8];
          detail::load_bf16<8>(p.x + static_cast<std::int64_t>(r0 + r) * p.ldx + k, x);
#pragma unroll
          for (int j = 0; j < kGemvOutPerWarp; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[j][r] += w[j][e] * x[e];
        }
      }
    }
  } else {
    for (int k = lane; k < p.in; k += detail::kWarp) {
      float w[kGemvOutPerWarp];
#pragma unroll
      for (int j = 0; j < kGemvOutPerWarp; ++j) w[j] = to_float(wrow[j][k]);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r < nr) {
          const float x = to_float(p.x[static_cast<std::int64_t>(r0 + r) * p.ldx + k]);
#pragma unroll
          for (int j = 0; j < kGemvOutPerWarp; ++j) acc[j][r] += w[j] * x;
        }
      }
    }
  }
  // The 32 lanes' partials of each (output, row) through shared memory, then lane j·8 + r adds
  // those of output j, row r in lane order: one barrier instead of a shuffle tree per pair.
  __shared__ float part[kGemvWarps][kGemvOutPerWarp * kGemvRows][detail::kWarp + 1];
#pragma unroll
  for (int j = 0; j < kGemvOutPerWarp; ++j)
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) part[warp][j * kGemvRows + r][lane] = acc[j][r];
  __syncwarp();
  const int j = lane / kGemvRows, r = lane % kGemvRows;
  if (r >= nr || o0 + j >= p.out) return;
  float sum = 0.0f;
  for (int l = 0; l < detail::kWarp; ++l) sum += part[warp][lane][l];
  const std::int64_t at = static_cast<std::int64_t>(r0 + r) * p.ldy + o0 + j;
  if (p.f32_out) static_cast<float*>(p.y)[at] = sum;
  else static_cast<bf16*>(p.y)[at] = detail::from_float<bf16>(sum);
}

}  // namespace kernels
GDN_CUDA_NAMESPACE_END
