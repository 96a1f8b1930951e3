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

// Output rows per block of a panel image (two 16-row panels; see cpu_gemm_panel.cpp), and the
// activation rows one pass over a block serves.
constexpr std::int64_t panel_block_rows = 32;
constexpr std::int64_t panel_tile_rows = 6;

std::int64_t panel_image_elements(std::int64_t out, std::int64_t in) noexcept;
// Blocks of 32 rows [row0, row1) of W's panel image (row0, row1 multiples of 32 or row1 == out).
void pack_panel_image(const bf16* w, std::int64_t out, std::int64_t in, std::int64_t row0, std::int64_t row1,
                      std::uint16_t* image);

// Rows [n0, n1) of y = x · Wᵀ (n0 a multiple of 32) for every activation row, reading W from its
// panel image when there is one, else in place (each block transposed into a small buffer on the
// way). Same arithmetic either way. AVX-512 only.
void panel_range(const bf16* w, const std::uint16_t* image, std::int64_t in, std::int64_t out, std::int64_t n0,
                 std::int64_t n1, const float* x, std::int64_t ldx, std::int64_t rows, float* y, std::int64_t ldy);

}  // namespace gdn::cpu::detail
