#pragma once
// y = x · Wᵀ for a weight W stored row-major [out, in] as in PyTorch checkpoints (bf16, f16 or f32)
// and float activations, accumulated in float. Weights are widened to float in registers. Output
// rows are processed in L2-sized blocks against all activation rows, so decode streams each weight
// once per step for every sequence, and prefill reuses each block across the whole ubatch.

#include <cstdint>
#include <vector>

#include "gdn/core/tensor.hpp"
#include "gdn/core/thread_pool.hpp"

namespace gdn::cpu {

// Rows of x are `ldx` floats apart, rows of y `ldy`. W must be rank 2 with W.dim(1) == in.
void linear(ThreadPool& pool, const TensorView& W, const float* x, std::int64_t ldx,
            std::int64_t rows, float* y, std::int64_t ldy);

// Reads row `row` of a [n, dim] table (an embedding) as float.
void gather_row(const TensorView& table, std::int64_t row, float* out);

}  // namespace gdn::cpu
