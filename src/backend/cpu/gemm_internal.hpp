#pragma once
// What the projection kernels' files share (src/cpu_gemm*.cpp): the target attributes, and the
// entry points of the kernel families that linear_multi dispatches to.

#include <cstdint>

#include "gdn/core/dtype.hpp"

#if defined(__x86_64__)
#define GDN_X86 1
#define GDN_T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define GDN_T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define GDN_T_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))
#define GDN_T_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,f16c")))
#else
#define GDN_X86 0
#endif

namespace gdn::cpu::detail {

#if GDN_X86
// AMX: whether the OS gives this process the tile data state (each call asks again; Linux grants
// it per process, so callers cache the answer), and the tile configuration ldtilecfg takes.
bool amx_permitted() noexcept;
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
#endif

// Round to nearest, ties to even, for |v| < 2²² (float32 arithmetic, so the same in every build):
// the quantisers' rounding (quant.hpp), in gemm_quant.cpp and quant_fit.cpp alike.
inline float round_even(float v) {
  constexpr float magic = 12582912.0f;  // 1.5 · 2²³
  return v >= 0.0f ? (v + magic) - magic : -((-v + magic) - magic);
}

// Output rows per block of a panel image (two 16-row panels; see cpu_gemm_panel.cpp).
constexpr std::int64_t panel_block_rows = 32;

std::int64_t panel_image_elements(std::int64_t out, std::int64_t in) noexcept;
// Blocks of 32 rows [row0, row1) of W's panel image (row0, row1 multiples of 32 or row1 == out).
void pack_panel_image(const bf16* w, std::int64_t out, std::int64_t in, std::int64_t row0, std::int64_t row1,
                      std::uint16_t* image);

// The activations of a panel call: float rows (float32 FMA), or bf16 pairs from pack_bf16_pairs
// (vdpbf16ps, AVX-512-BF16 only) when `pairs` is set.
struct PanelInput {
  const float* x = nullptr;
  std::int64_t ldx = 0;
  const std::uint32_t* pairs = nullptr;  // bf16_pairs_per_row(in) per row
};
std::int64_t bf16_pairs_per_row(std::int64_t in) noexcept;
// Rows [r0, r1) of x rounded to bf16 (nearest even) into `xp`, two columns per uint32, zero past `in`.
void pack_bf16_pairs(const float* x, std::int64_t ldx, std::int64_t r0, std::int64_t r1, std::int64_t in,
                     std::uint32_t* xp);

// Rows [n0, n1) of y = x · Wᵀ (n0 a multiple of 32) for every activation row, reading W from its
// panel image when there is one, else in place (each block transposed into a small buffer on the
// way). Same arithmetic either way. AVX-512 only.
void panel_range(const bf16* w, const std::uint16_t* image, std::int64_t in, std::int64_t out, std::int64_t n0,
                 std::int64_t n1, const PanelInput& x, std::int64_t rows, float* y, std::int64_t ldy);

}  // namespace gdn::cpu::detail
