#pragma once
// y = x · Wᵀ for a weight W stored row-major [out, in] as in PyTorch checkpoints (bf16, f16 or f32)
// and float activations, accumulated in float.
//
// The kernel is chosen once per process from the CPU's features (never from the number of rows):
//   amx         bf16 weights on AMX tiles (Sapphire Rapids and later)
//   avx512bf16  bf16 weights with vdpbf16ps
//   avx512      weights widened to float in registers, fp32 FMA (also f16 / f32 weights)
//   avx2        the same with 8 lanes
//   scalar      portable C++
// The two bf16-dot-product kernels need bf16 activations: each float activation is split exactly
// into three bf16 parts (hi + mid + lo, 3 × 8 significant bits = float's 24), and each part is
// multiplied by the weight with exact products and float accumulation, so the result is a float32
// dot product of the float activations (only the summation order differs from the fp32 kernels).
// (Two parts, a 2⁻¹⁷ relative error per activation, fail the 2e-3 logits tolerance on the random
// fixtures.) These are three dot-product instructions per weight block, which only prefill feels;
// decode is bound by streaming the weights. Weights that are not bf16
// take the avx512 / avx2 / scalar path. GDN_CPU_KERNEL=amx|avx512bf16|avx512|avx2|scalar picks a
// lower kernel (for tests and comparisons).
//
// Batch invariance: in every kernel, an output element is the same sequence of operations
// whatever the number of rows in the call and whichever other rows share it (activation rows
// never mix; blocking only reorders independent elements), so batched decode is bit-identical to
// single decode and a verification step to plain decoding.
//
// Decode (few rows) streams each weight once per step for every sequence; prefill reuses each
// block of weights, held in L2, across all rows.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gdn/core/tensor.hpp"
#include "gdn/core/thread_pool.hpp"

namespace gdn::cpu {

enum class LinearKernel { scalar, avx2, avx512, avx512bf16, amx };

// The kernel this process uses for bf16 weights, and its name.
LinearKernel linear_kernel() noexcept;
const char* linear_kernel_name() noexcept;

// Packed activations for the bf16 kernels. reserve() once with the largest call a context makes;
// then no call allocates.
class LinearWorkspace {
 public:
  void reserve(std::int64_t rows, std::int64_t in);
  std::uint16_t* get(std::size_t elements) {
    if (buf_.size() < elements) buf_.resize(elements);
    return buf_.data();
  }
  // Numbers the calls made with this workspace (the AMX kernel reloads its tile configuration once
  // per call and thread, not once per block of rows).
  std::uint64_t begin_call() noexcept { return ++calls_; }

 private:
  std::vector<std::uint16_t> buf_;
  std::uint64_t calls_ = 0;
};

// One projection of a fused call: y (rows of `ldy` floats) = x · wᵀ.
struct LinearPart {
  const TensorView* w;
  float* y;
  std::int64_t ldy;
  const std::uint16_t* amx_tiles = nullptr;  // w's AMX tile image, if the model packed one
};

// The AMX tile image of a bf16 weight [out, in]: the same values in the order the AMX kernel reads
// them. Read in place, a 16-row × 32-column tile is 16 cache lines 2·in bytes apart, so a thread
// sweeping a block of rows keeps 16–32 strided streams open and decode pulls weights well below the
// machine's read bandwidth. In the image every tile is 1 KiB of contiguous memory, and the tiles of
// each block of 32 rows follow one another step by step along k, so decode reads one sequential
// stream per thread. Padding (rows past `out`, columns past `in`) is zero, which is what the
// in-place kernel substitutes, so results are bit-identical with and without the image.
std::size_t amx_tile_image_elements(std::int64_t out, std::int64_t in) noexcept;
// Writes W's image (amx_tile_image_elements(W.dim(0), W.dim(1)) uint16 values) to `image`, rows
// [row0, row1) of blocks of 32 rows only (so several threads can share one tensor); row0 and row1
// must be multiples of 32, or row1 == W.dim(0).
void pack_amx_tile_image(const TensorView& W, std::int64_t row0, std::int64_t row1, std::uint16_t* image);

// Rows of x are `ldx` floats apart, rows of y `ldy`. W must be rank 2 with W.dim(1) == in.
void linear(ThreadPool& pool, LinearWorkspace& ws, const TensorView& W, const float* x, std::int64_t ldx,
            std::int64_t rows, float* y, std::int64_t ldy);

// Several projections of the same input in one pass: the input is packed once and all weights are
// split across the threads together, so small projections (β, decay) ride along with large ones.
// Results are bit-identical to separate linear() calls.
void linear_multi(ThreadPool& pool, LinearWorkspace& ws, std::span<const LinearPart> parts, const float* x,
                  std::int64_t ldx, std::int64_t rows);

// The same with a given kernel (lowered to linear_kernel() if the CPU lacks it): for tests and
// comparisons of the kernels in one process.
void linear_multi(ThreadPool& pool, LinearWorkspace& ws, LinearKernel kernel, std::span<const LinearPart> parts,
                  const float* x, std::int64_t ldx, std::int64_t rows);

// Reads row `row` of a [n, dim] table (an embedding) as float.
void gather_row(const TensorView& table, std::int64_t row, float* out);

}  // namespace gdn::cpu
