#pragma once
// Block-quantised projection weights (q8_0, q5_0, q4_0, q4_k) and the integer dot-product kernels that read
// them (src/backend/cpu/gemm_quant.cpp). docs/quantization.md is the format's specification.
//
// Formats. A weight [out, in] is cut into blocks of 32 consecutive input columns of one output
// row (the last block of a row zero-padded, like llama.cpp's Q8_0 / Q4_0 but for any `in`); each
// block has one scale d (IEEE half) and 32 integers q, and stands for d · q:
//   q8_0  q ∈ [-127, 127]: d = max|w| / 127, q = round(w / d)           8.5 bits per weight
//   q4_0  q ∈ [-8, 7]:     d = m / -8 (m: the block's value of largest magnitude),
//                          q = clamp(round(w / d), -8, 7)                4.5 bits per weight
//   q5_0  q ∈ [-16, 15]:   d = m / -16, q = clamp(round(w / d), -16, 15)  5.5 bits per weight
//         (llama.cpp's Q5_0; q4_k_m's format for rows that are not whole super-blocks, as llama.cpp's
//         Q4_K_M falls back to Q5_0 there)
// rounding to nearest, ties to even, with d as stored (rounded to half) — so a block's largest
// weight is exact up to d's rounding.
//   q4_k  (K-quant-like) a block stands for d · q − m, q ∈ [0, 15], with its own d ≥ 0 and m ≥ 0
//         fitted to it: d = D · sc and m = M · mn, sc and mn 8-bit integers per block, D and M
//         halves per row and super-block of 8 blocks (256 columns; fewer in a row's last one).
//         4.625 bits per weight. The fit: a search over 21 candidate scales (15 ± 1 steps over the
//         block's range [min(w, 0), max w]), each with its q refitted by weighted least squares
//         (weights mean|w|² root + |w|, so large weights count more; m clamped at ≥ 0), the best by
//         weighted squared error; then D = max d / 255, M = max m / 255 (halves), sc = round(d / D),
//         mn = round(m / M), and q = clamp(round((w + M·mn) / (D·sc)), 0, 15) against the stored
//         values. D·sc and M·mn are exact in float (11 × 8 significant bits). The fit is
//         quant_fit.cpp's, the same bits on every CPU.
// Image layout (the order the kernels read; every kernel reads the same image). Output rows in
// groups of 32, each group's blocks in increasing k; a (group, k block) tile is the 32 rows'
// integers then their 64 bytes of scales (row order):
//   q8_0  1024 + 64 bytes: for each k quad g = 0..7, for each 16-row panel p = 0..1, 64 bytes in
//         which byte 4n + j is row 16p + n, column 4g + j (int8); then 32 half d
//   q4_0   512 + 64 bytes: for g = 0..3, p = 0..1, 64 bytes in which byte 4n + j holds row
//         16p + n's columns 4g + j (low nibble) and 16 + 4g + j (high nibble), as q + 8; then 32
//         half d
//   q5_0   640 + 64 bytes: the q4_0 layout of the low four bits of q + 16; then for g = 0..3,
//         p = 0..1, two 64-bit masks of the fifth bits (little-endian), the first of the chunk's low
//         nibbles, the second of its high ones, bit 4n + j standing for byte 4n + j; then 32 half d
//   q4_k   512 + 64 bytes: the q4_0 layout with q itself (not q + 8) in the nibbles; then 32 sc
//         bytes and 32 mn bytes; after a group's tiles, per super-block 32 half D then 32 half M
// so a 64-byte load is 16 rows × 4 columns, the operand order of vpdpbusd, and a group of rows is
// one sequential stream.
//
// Arithmetic. The activations of a call are quantised once per row and block of 32 into two int8
// parts: with s = max|x| / 127, h = round(x / s) and l = round((x / s − h) · 254), x ≈ s (h + l/254)
// (a relative error near 2⁻¹⁶ of the block's largest value: effectively 16-bit activations), and
// the parts' int16 combination a = 254·h + l (|a| ≤ 32385). q8_0 takes both parts, so its error is
// the weights' own; the 4- and 5-bit formats take h alone (x ≈ s·h, 8-bit activations as
// llama.cpp's Q8_0 ones): there a weight's rounding error (about 9% of the block's RMS for q4_0,
// half that for q5_0) dwarfs the activation's (under 1%), and one vpdpbusd per weight chunk
// instead of two is what bounds 4-bit prefill and batched decode on a machine of few cores. An
// output is then
//   y = Σ_blocks d · (s · S / 254)   q8_0:  S = Σ q·a = 254·H + L,  H = Σ q·h,  L = Σ q·l
//   y = Σ_blocks d · (s · H)         4- and 5-bit formats
// (exact int32 sums: |S| ≤ 32 · 127 · 32385 < 2³¹), evaluated per block as t = float(S) · (1/254)
// (t = float(H) at 4 and 5 bits), v = t · s, acc = fma(d, v, acc), blocks in k order; q4_k then
// takes its offset off the same block: acc = fma(−m, Σh · s, acc). Kernels with byte dot products
// (VNNI, AMX) sum H and L and combine them; AVX2, which has none without saturation, takes S from
// a with one 16-bit multiply-add (vpmaddwd) per pair of weights — the same integer either way.
// Every kernel (AVX-512 VNNI, AVX2, scalar) computes exactly these operations, so all of them give
// bit-identical results, and a row's result never depends on the other rows of the call (batch
// invariance: batched decode == single decode, bit for bit).

#include <cstddef>
#include <cstdint>

#include "gdn/core/tensor.hpp"

namespace gdn::cpu {

enum class QuantFormat { q8_0, q5_0, q4_0, q4_k };
// amx_int8: AVX-512 VNNI below 4 activation rows, AMX-INT8 tiles from 4 (bit-identical: exact sums;
// q5_0 and q4_k always run on VNNI there).
enum class QuantKernel { scalar, avx2, avx512vnni, amx_int8 };

constexpr std::int64_t quant_block = 32;  // weights per block (input columns), and rows per group

// Whether a format's kernels take the activations' low part (l) as well as the high one (h).
constexpr bool uses_low_part(QuantFormat f) { return f == QuantFormat::q8_0; }

// The kernel this process uses for quantised weights (CPU features, lowered by GDN_CPU_KERNEL:
// scalar → scalar, avx2 → avx2), and its name.
QuantKernel quant_kernel() noexcept;
const char* quant_kernel_name(QuantKernel k) noexcept;
bool quant_kernel_supported(QuantKernel k) noexcept;

// Bytes of one (32-row group, k block) tile, of a group of `in` columns (its tiles and q4_k's
// super-block scales), and of a [out, in] weight's image.
std::int64_t quant_tile_bytes(QuantFormat f) noexcept;
std::int64_t quant_group_bytes(QuantFormat f, std::int64_t in) noexcept;
std::size_t quant_image_bytes(QuantFormat f, std::int64_t out, std::int64_t in) noexcept;

// Quantises rows [row0, row1) of W (bf16, f16 or f32; row0 a multiple of 32, row1 one too or
// W.dim(0)) into their groups of the image (padding rows included). Deterministic.
void quantize_weight_image(QuantFormat f, const TensorView& W, std::int64_t row0, std::int64_t row1, std::byte* image);

// q4_k's fit (above) of `count` ≤ 8 blocks of one row's super-block, block b's first n[b] values
// (n[b] ≥ 1): d[b] ≥ 0 and m[b] ≥ 0. Kernel k picks the instructions (AVX-512 fits a whole
// super-block's 8 full blocks side by side), never the bits: every kernel gives fit_q4k_block's.
void fit_q4k_blocks(QuantKernel k, const float (*w)[32], const int* n, int count, float* d, float* m);
void fit_q4k_block(const float* w, int n, float& d, float& m);  // the definition, one block

// The value the image holds for W[n][k] (tests, and the reference).
float quant_image_value(QuantFormat f, const std::byte* image, std::int64_t out, std::int64_t in, std::int64_t n,
                        std::int64_t k) noexcept;

// A call's quantised activations: per row, kp int8 high parts, kp int8 low parts, kp/32 scales,
// kp/32 pairs of part sums (kp: `in` rounded up to 32), then from the next multiple of 64 bytes kp
// int16 combinations a = 254·h + l; rows `stride` bytes apart.
struct QuantActivations {
  const std::byte* data = nullptr;
  std::int64_t in = 0, kp = 0, stride = 0;
};
std::int64_t quant_activation_stride(std::int64_t in) noexcept;  // bytes per row
// Quantises rows [r0, r1) of x into buf (rows · quant_activation_stride(in) bytes, 64-aligned).
void quantize_activations(const float* x, std::int64_t ldx, std::int64_t r0, std::int64_t r1, std::int64_t in,
                          std::byte* buf) noexcept;

// Output rows [n0, n1) (n0 a multiple of 32) of y = x · Wᵀ for every activation row, W read from
// its image in format f by kernel k (which the CPU must support).
void quant_range(QuantKernel k, QuantFormat f, const std::byte* image, std::int64_t in, std::int64_t out,
                 std::int64_t n0, std::int64_t n1, const QuantActivations& x, std::int64_t rows, float* y,
                 std::int64_t ldy);

}  // namespace gdn::cpu
