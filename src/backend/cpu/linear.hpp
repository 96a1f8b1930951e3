#pragma once
// y = x · Wᵀ for a weight W stored row-major [out, in] as in PyTorch checkpoints (bf16, f16 or f32)
// and float activations, accumulated in float.
//
// The kernel is chosen once per process from the CPU's features (never from the number of rows):
//   amx         bf16 weights on AMX tiles (Sapphire Rapids and later)
//   avx512bf16  the avx512 kernel, plus vdpbf16ps for bf16 matmul inputs (MatmulInput::bf16)
//   avx512      bf16 weights widened to float in registers, fp32 FMA (also f16 / f32 weights)
//   avx2        the same with 8 lanes
//   scalar      portable C++
// Every kernel computes a float32 dot product of the float activations with the weights (only the
// summation order differs between kernels). The AMX kernel needs bf16 activations: each float
// activation is split exactly into three bf16 parts (hi + mid + lo, 3 × 8 significant bits =
// float's 24) whose products with the weight are exact. (Two parts, a 2⁻¹⁷ relative error per
// activation, fail the 2e-3 logits tolerance on the random fixtures.) The AVX-512 kernel widens
// the bf16 weights instead and uses FMA, which does more multiply-adds per cycle than three
// vdpbf16ps would (src/cpu_gemm_panel.cpp). Weights that are not bf16 take the avx512 / avx2 /
// scalar float path. GDN_CPU_KERNEL=amx|avx512bf16|avx512|avx2|scalar picks a lower kernel (for
// tests and comparisons). The CPU target of the other kernels follows this choice (target.hpp):
// amx and avx512bf16 also give a bf16 KV cache's attention its vdpbf16ps path.
//
// With MatmulInput::bf16 every kernel computes the exact product of the activations rounded to
// bf16: the avx512bf16 kernel on vdpbf16ps, every other one by rounding a copy of the activations
// and running its float32 arithmetic on it.
//
// Weight images. Read in place, a block of weight rows is many strided streams; the amx and avx512
// kernels read bf16 weights faster from an image of them in the order the kernel consumes them
// (pack_weight_image), which a model makes once at load. Images hold the same values and zero
// padding the kernels substitute when reading in place, and each kernel runs the same arithmetic
// either way, so results are bit-identical with and without an image.
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

#include "gdn/core/matmul_input.hpp"
#include "gdn/core/tensor.hpp"
#include "gdn/core/thread_pool.hpp"

namespace gdn::cpu {

enum class LinearKernel { scalar, avx2, avx512, avx512bf16, amx };

// The kernel this process uses for bf16 weights, and its name.
LinearKernel linear_kernel() noexcept;
const char* linear_kernel_name() noexcept;

// Packed or rounded activations (the AMX kernel's tiles, bf16 inputs). reserve() once with the
// largest call a context makes; then no call allocates.
class LinearWorkspace {
 public:
  void reserve(std::int64_t rows, std::int64_t in, MatmulInput input = MatmulInput::float32);
  // Bytes reserve(rows, in, input) allocates (memory plans).
  static std::size_t reserve_bytes(std::int64_t rows, std::int64_t in, MatmulInput input = MatmulInput::float32);
  std::uint16_t* get(std::size_t elements) {
    if (buf_.size() < elements) buf_.resize(elements);
    return buf_.data();
  }
  float* get_floats(std::size_t elements) {
    if (floats_.size() < elements) floats_.resize(elements);
    return floats_.data();
  }
  // The quantised activations of a call on quantised weights (64-byte aligned).
  std::byte* get_quantized(std::size_t bytes) {
    if (quantized_.size() < bytes + 64) quantized_.resize(bytes + 64);
    auto* p = quantized_.data();
    return p + (64 - reinterpret_cast<std::uintptr_t>(p) % 64) % 64;
  }
  // Numbers the calls made with this workspace (the AMX kernel reloads its tile configuration once
  // per call and thread, not once per block of rows).
  std::uint64_t begin_call() noexcept { return ++calls_; }

 private:
  std::vector<std::uint16_t> buf_;
  std::vector<float> floats_;
  std::vector<std::byte> quantized_;
  std::uint64_t calls_ = 0;
};

// The order a kernel wants bf16 weights in (none: it reads them in place).
//   amx_tiles  16 rows × 32 columns per 1 KiB tile, the two tiles of each block of 32 rows
//              alternating along k (src/cpu_gemm.cpp)
//   panels     blocks of 32 rows, 128 bytes per pair of columns (src/cpu_gemm_panel.cpp)
//   q8_0, q5_0, q4_0, q4_k the weights block-quantised (quant.hpp), read by the integer kernels
//              whatever the bf16 kernel is: not the checkpoint's values, so only ever asked for
//              (ModelParams::quant; q5_0 only as q4_k_m's format for rows of partial super-blocks)
// Either way a block of 32 rows is one sequential stream.
enum class WeightImage { none, amx_tiles, panels, q8_0, q5_0, q4_0, q4_k };
inline bool is_quantized(WeightImage layout) noexcept {
  return layout == WeightImage::q8_0 || layout == WeightImage::q5_0 || layout == WeightImage::q4_0 || layout == WeightImage::q4_k;
}
WeightImage weight_image_layout(LinearKernel kernel) noexcept;

// One projection of a fused call: y (rows of `ldy` floats) = x · wᵀ.
struct LinearPart {
  const TensorView* w;
  float* y;
  std::int64_t ldy;
  const std::uint16_t* image = nullptr;  // w in `image_layout` order, if the model packed it
  WeightImage image_layout = WeightImage::none;
};

// uint16 elements of a bf16 weight [out, in]'s image in `layout` (0 for none).
std::size_t weight_image_elements(WeightImage layout, std::int64_t out, std::int64_t in) noexcept;
// Writes the rows [row0, row1) of W's image (whole blocks of 32 rows, so several threads can share
// one tensor: row0 and row1 multiples of 32, or row1 == W.dim(0)), padding included.
void pack_weight_image(WeightImage layout, const TensorView& W, std::int64_t row0, std::int64_t row1,
                       std::uint16_t* image);

// Rows of x are `ldx` floats apart, rows of y `ldy`. W must be rank 2 with W.dim(1) == in.
void linear(ThreadPool& pool, LinearWorkspace& ws, const TensorView& W, const float* x, std::int64_t ldx,
            std::int64_t rows, float* y, std::int64_t ldy, MatmulInput input = MatmulInput::float32);

// Several projections of the same input in one pass: the input is packed once and all weights are
// split across the threads together, so small projections (β, decay) ride along with large ones.
// Results are bit-identical to separate linear() calls.
void linear_multi(ThreadPool& pool, LinearWorkspace& ws, std::span<const LinearPart> parts, const float* x,
                  std::int64_t ldx, std::int64_t rows, MatmulInput input = MatmulInput::float32);

// The same with a given kernel (lowered to linear_kernel() if the CPU lacks it): for tests and
// comparisons of the kernels in one process.
void linear_multi(ThreadPool& pool, LinearWorkspace& ws, LinearKernel kernel, std::span<const LinearPart> parts,
                  const float* x, std::int64_t ldx, std::int64_t rows, MatmulInput input = MatmulInput::float32);

// Reads row `row` of a [n, dim] table (an embedding) as float.
void gather_row(const TensorView& table, std::int64_t row, float* out);

}  // namespace gdn::cpu
