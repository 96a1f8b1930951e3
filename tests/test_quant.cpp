// Quantised projection weights (backend/cpu/quant.hpp): the formats' rounding rules, every integer
// kernel this CPU has against a float64 product of the dequantised weights with the float
// activations (the only difference allowed: the activations' rounding, 2⁻¹⁶-level with q8_0's two
// parts, 8-bit with the 4-bit formats' high part) and with the quantised activations as quant.hpp
// states them (float32 accumulation the only difference), all kernels bit-identical to each other,
// batch invariance, fused == separate, odd shapes.

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cpu/linear.hpp"
#include "backend/cpu/prepared_weights.hpp"
#include "backend/cpu/quant.hpp"

using namespace gdn;

namespace {

struct Weight {
  std::vector<bf16> data;
  TensorView view;
  Weight(std::int64_t out, std::int64_t in, std::mt19937& rng, float sd = 0.05f) {
    std::normal_distribution<float> d(0.0f, sd);
    data.resize(static_cast<std::size_t>(out * in));
    for (auto& v : data) v = to_bf16(d(rng));
    view.dtype = DType::bf16;
    view.rank = 2;
    view.shape[0] = out;
    view.shape[1] = in;
    view.data = reinterpret_cast<const std::byte*>(data.data());
  }
  float at(std::int64_t n, std::int64_t k) const { return to_float(data[static_cast<std::size_t>(n * view.dim(1) + k)]); }
};

struct Image {
  std::vector<std::uint16_t> u16;  // the image, in the uint16 units LinearPart takes
  cpu::WeightImage layout;
  Image(cpu::WeightImage l, const TensorView& W) : layout(l) {
    u16.assign(cpu::weight_image_elements(l, W.dim(0), W.dim(1)), 0xABCD);  // garbage: every byte must be written
    cpu::pack_weight_image(l, W, 0, W.dim(0), u16.data());
  }
  const std::byte* bytes() const { return reinterpret_cast<const std::byte*>(u16.data()); }
};

cpu::QuantFormat format_of(cpu::WeightImage l) {
  switch (l) {
    case cpu::WeightImage::q8_0: return cpu::QuantFormat::q8_0;
    case cpu::WeightImage::q5_0: return cpu::QuantFormat::q5_0;
    case cpu::WeightImage::q4_0: return cpu::QuantFormat::q4_0;
    default: return cpu::QuantFormat::q4_k;
  }
}
constexpr cpu::WeightImage all_formats[] = {cpu::WeightImage::q8_0, cpu::WeightImage::q5_0, cpu::WeightImage::q4_0,
                                            cpu::WeightImage::q4_k};

const cpu::LinearKernel kernels[] = {cpu::LinearKernel::scalar, cpu::LinearKernel::avx2, cpu::linear_kernel()};

std::vector<float> run(ThreadPool& pool, cpu::LinearWorkspace& ws, cpu::LinearKernel k, const TensorView& W,
                       const Image& img, const std::vector<float>& x, std::int64_t rows) {
  const std::int64_t out = W.dim(0), in = W.dim(1);
  std::vector<float> y(static_cast<std::size_t>(rows * out), -1.0f);
  const cpu::LinearPart part{&W, y.data(), out, img.u16.data(), img.layout};
  cpu::linear_multi(pool, ws, k, std::span(&part, 1), x.data(), in, rows);
  return y;
}

// How far a block's quantised activations may stand from x, per unit of Σ|w| (quant.hpp): the
// high part alone rounds to s / 2 = max|x| / 254, the two parts to max|x| / (127 · 508).
double activation_error(cpu::QuantFormat f, double amax) {
  return cpu::uses_low_part(f) ? amax / (127.0 * 508.0) : amax / 254.0;
}

// The rows' quantised activations as quant.hpp defines them for format f: s · (h + l / 254), or s · h.
std::vector<double> quantised_activations(cpu::QuantFormat f, const std::vector<float>& x, std::int64_t in, std::int64_t rows) {
  const std::int64_t stride = cpu::quant_activation_stride(in), kp = (in + 31) / 32 * 32;
  std::vector<std::byte> buf(static_cast<std::size_t>(rows * stride) + 64);
  cpu::quantize_activations(x.data(), in, 0, rows, in, buf.data());
  std::vector<double> xq(static_cast<std::size_t>(rows * in));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* p = buf.data() + r * stride;
    for (std::int64_t j = 0; j < in; ++j) {
      float s;
      std::memcpy(&s, p + 2 * kp + 4 * (j / 32), 4);
      const double h = static_cast<std::int8_t>(p[j]), l = static_cast<std::int8_t>(p[kp + j]);
      xq[static_cast<std::size_t>(r * in + j)] = s * (h + (cpu::uses_low_part(f) ? l / 254.0 : 0.0));
    }
  }
  return xq;
}

}  // namespace

TEST_CASE("quantised formats: each block's scale and values follow the stated rounding", "[quant]") {
  std::mt19937 rng(7);
  for (auto layout : {cpu::WeightImage::q8_0, cpu::WeightImage::q5_0, cpu::WeightImage::q4_0}) {
    for (auto [out, in] : {std::pair<std::int64_t, std::int64_t>{33, 40}, {64, 96}, {7, 5}}) {
      const Weight W(out, in, rng);
      const Image img(layout, W.view);
      const auto f = format_of(layout);
      for (std::int64_t n = 0; n < out; ++n)
        for (std::int64_t b = 0; b * 32 < in; ++b) {
          float amax = 0.0f, m = 0.0f;
          for (std::int64_t j = b * 32; j < std::min(in, b * 32 + 32); ++j) {
            amax = std::max(amax, std::fabs(W.at(n, j)));
            if (std::fabs(W.at(n, j)) > std::fabs(m)) m = W.at(n, j);
          }
          const float d = layout == cpu::WeightImage::q8_0 ? amax / 127.0f : layout == cpu::WeightImage::q5_0 ? m / -16.0f : m / -8.0f;
          // The stored scale: d rounded to half (relative error ≤ 2⁻¹¹), recovered from any value.
          for (std::int64_t j = b * 32; j < std::min(in, b * 32 + 32); ++j) {
            const float w = W.at(n, j), v = cpu::quant_image_value(f, img.bytes(), out, in, n, j);
            // Within half a step of the weight (plus the scale's rounding over the range of q); for
            // q4_0 (q5_0), a value of the extreme's opposite sign beyond 7.5 (15.5) steps is clamped
            // to 7 (15), as in llama.cpp's Q4_0 (Q5_0).
            const float qmax = layout == cpu::WeightImage::q8_0 ? 127.0f : layout == cpu::WeightImage::q5_0 ? 16.0f : 8.0f;
            const float top = layout == cpu::WeightImage::q5_0 ? 15.0f : 7.0f;
            const float clamped = layout != cpu::WeightImage::q8_0 ? std::fabs(w) - top * std::fabs(d) * 0.999f : 0.0f;
            INFO(fmt::format("{} [{}, {}] n {} k {}: w {} v {} d {}", cpu::weight_image_name(layout), out, in, n, j, w, v, d));
            REQUIRE(std::fabs(w - v) <= std::max(std::fabs(d) * (0.5f + qmax * 0.0005f), clamped) + 1e-9f);
          }
          // The block's extreme is represented exactly up to the scale's rounding.
          if (m != 0.0f) {
            std::int64_t at = b * 32;
            while (W.at(n, at) != m) ++at;
            const float v = cpu::quant_image_value(f, img.bytes(), out, in, n, at);
            REQUIRE(std::fabs(v - m) <= std::fabs(m) * 0.0005f);
          }
        }
      // Padding columns and rows hold zero.
      for (std::int64_t n = 0; n < (out + 31) / 32 * 32; ++n)
        for (std::int64_t k = (n < out ? in : 0); k < (in + 31) / 32 * 32; ++k)
          REQUIRE(cpu::quant_image_value(f, img.bytes(), out, in, n, k) == 0.0f);
    }
  }
}

TEST_CASE("q4_k: every value within a step of its block's range, the squared error well below q4_0's", "[quant]") {
  std::mt19937 rng(9);
  // Rows of 300 columns: a super-block of 8 blocks and a partial one of 2 (the last block padded).
  for (auto [out, in] : {std::pair<std::int64_t, std::int64_t>{33, 300}, {64, 256}, {7, 5}}) {
    Weight W(out, in, rng);
    // Skewed blocks (all positive, all negative) where an offset pays most.
    for (std::int64_t k = 0; k < std::min<std::int64_t>(in, 32); ++k) {
      W.data[static_cast<std::size_t>(k)] = to_bf16(0.02f + std::fabs(W.at(0, k)));
      if (out > 1) W.data[static_cast<std::size_t>(in + k)] = to_bf16(-0.02f - std::fabs(W.at(1, k)));
    }
    const Image k4(cpu::WeightImage::q4_k, W.view), q4(cpu::WeightImage::q4_0, W.view);
    double err_k = 0.0, err_0 = 0.0;
    for (std::int64_t n = 0; n < out; ++n)
      for (std::int64_t b = 0; b * 32 < in; ++b) {
        const std::int64_t j1 = std::min(in, b * 32 + 32);
        float lo = 0.0f, hi = 0.0f;
        std::vector<float> vals;
        for (std::int64_t j = b * 32; j < j1; ++j) {
          lo = std::min(lo, W.at(n, j));
          hi = std::max(hi, W.at(n, j));
          vals.push_back(cpu::quant_image_value(cpu::QuantFormat::q4_k, k4.bytes(), out, in, n, j));
        }
        for (std::int64_t j = b * 32; j < j1; ++j) {
          const float w = W.at(n, j), v = vals[static_cast<std::size_t>(j - b * 32)];
          INFO(fmt::format("[{}, {}] n {} k {}: w {} v {} range [{}, {}]", out, in, n, j, w, v, lo, hi));
          REQUIRE(std::fabs(w - v) <= (hi - lo) / 15.0f + 1e-9f);
          const double e0 = w - cpu::quant_image_value(cpu::QuantFormat::q4_0, q4.bytes(), out, in, n, j);
          err_k += static_cast<double>(w - v) * (w - v);
          err_0 += e0 * e0;
        }
      }
    INFO(fmt::format("[{}, {}] squared error q4_k {} q4_0 {}", out, in, err_k, err_0));
    REQUIRE(err_k < 0.9 * err_0);
  }
}

TEST_CASE("q4_k's fit: every kernel gives the definition's bits, super-block by super-block", "[quant]") {
  // The AVX-512 fit runs a super-block's 8 blocks side by side; it must give fit_q4k_block's bits
  // for every block (so an image is the same whichever CPU packed it), including the branches: zero
  // blocks (d = 0), blocks whose offset is refitted to 0, signed zeros, tiny and large magnitudes.
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind_of(0, 9);
  const bool vector_fit = cpu::quant_kernel() >= cpu::QuantKernel::avx512vnni;
  if (!vector_fit) WARN("no AVX-512 here: the fit's vector path is not exercised (the scalar one is)");
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    float w[8][32];
    for (auto& block : w) {
      const int kind = kind_of(rng);
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 40);  // 2^-40 .. 2^19
      for (float& v : block) {
        const float g = nd(rng) * scale;
        v = kind == 0   ? 0.0f                            // all zero: flat
            : kind == 1 ? -0.0f                           // signed zeros
            : kind == 2 ? -0.75f * scale                  // all equal and negative
            : kind == 3 ? std::fabs(g) + scale            // all positive: the offset refits to 0
            : kind == 4 ? -std::fabs(g) - 0.5f * scale    // all negative
            : kind == 5 ? (rng() % 8 == 0 ? 0.0f : g)     // sparse
            : g;
      }
      if (kind == 6) block[rng() % 32] = 40.0f * scale;  // one outlier
      if (kind == 7) block[rng() % 32] = 0.5f * scale;   // one value off a flat block
      if (kind == 7)
        for (float& v : block)
          if (v != 0.5f * scale) v = 0.25f * scale;
    }
    const int n[8] = {32, 32, 32, 32, 32, 32, 32, 32};
    float d[8], m[8];
    for (auto k : {cpu::QuantKernel::scalar, cpu::quant_kernel()}) {
      cpu::fit_q4k_blocks(k, w, n, 8, d, m);
      for (int b = 0; b < 8; ++b) {
        float d1, m1;
        cpu::fit_q4k_block(w[b], 32, d1, m1);
        INFO(fmt::format("trial {} block {} kernel {}: d {} vs {}, m {} vs {}", trial, b, cpu::quant_kernel_name(k), d[b],
                         d1, m[b], m1));
        REQUIRE(std::memcmp(&d[b], &d1, 4) == 0);
        REQUIRE(std::memcmp(&m[b], &m1, 4) == 0);
        REQUIRE(d1 >= 0.0f);
        REQUIRE(m1 >= 0.0f);
        ++checked;
      }
    }
  }
  REQUIRE(checked == 400 * 8 * 2);
}

TEST_CASE("quantised formats: a non-finite weight makes its block NaN, never a saturated scale", "[quant]") {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  cpu::LinearWorkspace ws;
  for (auto layout : all_formats) {
    Weight W(40, 64, rng);
    W.data[5] = to_bf16(std::numeric_limits<float>::quiet_NaN());          // row 0, block 0
    W.data[64 * 3 + 40] = to_bf16(std::numeric_limits<float>::infinity());  // row 3, block 1
    const Image img(layout, W.view);
    const auto f = format_of(layout);
    // q4_k's scales are per super-block (here both blocks of the row): all of it is NaN.
    const bool super = layout == cpu::WeightImage::q4_k;
    for (std::int64_t k = 0; k < 64; ++k) {
      REQUIRE(std::isnan(cpu::quant_image_value(f, img.bytes(), 40, 64, 0, k)) == (super || k < 32));
      REQUIRE(std::isnan(cpu::quant_image_value(f, img.bytes(), 40, 64, 3, k)) == (super || k >= 32));
      REQUIRE(std::isfinite(cpu::quant_image_value(f, img.bytes(), 40, 64, 1, k)));
    }
    std::vector<float> x(2 * 64);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    for (const auto k : kernels) {
      const auto y = run(pool, ws, k, W.view, img, x, 2);
      for (std::int64_t r = 0; r < 2; ++r)
        for (std::int64_t n = 0; n < 40; ++n)
          REQUIRE(std::isnan(y[static_cast<std::size_t>(r * 40 + n)]) == (n == 0 || n == 3));
    }
  }
}

TEST_CASE("quantised formats: deterministic, and whole groups pack alone as together", "[quant]") {
  std::mt19937 rng(11);
  const Weight W(100, 300, rng);
  for (auto layout : all_formats) {
    const Image a(layout, W.view), b(layout, W.view);
    REQUIRE(a.u16 == b.u16);
    std::vector<std::uint16_t> parts(a.u16.size(), 0);
    for (std::int64_t r0 : {64, 0, 32, 96}) cpu::pack_weight_image(layout, W.view, r0, std::min<std::int64_t>(100, r0 + 32), parts.data());
    REQUIRE(parts == a.u16);
  }
}

TEST_CASE("quantised kernels: accurate against float64, bit-identical across kernels, batch-invariant", "[quant]") {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  cpu::LinearWorkspace ws;
  for (auto layout : all_formats) {
    // 9 and 37 rows: on an AMX-INT8 CPU the batched calls take the tile path (one partial chunk of
    // 16 rows; two full chunks and a partial one) and the single rows the VNNI one.
    // 2 and 3 rows: the VNNI kernel's R = 2 and R = 3 tiles.
    for (auto [out, in, rows] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{96, 64, 9}, {70, 100, 37}, {33, 1024, 9},
                                 {256, 32, 37}, {5, 7, 9}, {64, 384, 2}, {40, 160, 3}}) {
      const Weight W(out, in, rng);
      const Image img(layout, W.view);
      const auto f = format_of(layout);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<std::size_t>(rows * in));
      for (auto& v : x) v = nd(rng);
      x[3] = 40.0f;  // an outlier: its block's other activations are quantised on its scale
      const std::vector<double> xq = quantised_activations(f, x, in, rows);
      std::vector<float> first;
      for (auto k : kernels) {
        const auto y = run(pool, ws, k, W.view, img, x, rows);
        INFO(fmt::format("{} [{}, {}] kernel {}", cpu::weight_image_name(layout), out, in, static_cast<int>(k)));
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t n = 0; n < out; ++n) {
            // References: float64 products of the dequantised weights with the float activations
            // (the kernel's activations differ by activation_error each) and with the quantised
            // activations themselves (float32 accumulation the only difference).
            double ref = 0.0, bound = 0.0, refq = 0.0, boundq = 0.0;
            for (std::int64_t b = 0; b * 32 < in; ++b) {
              double amax = 0.0, wsum = 0.0;
              for (std::int64_t j = b * 32; j < std::min(in, b * 32 + 32); ++j) {
                const double w = cpu::quant_image_value(f, img.bytes(), out, in, n, j), xv = x[static_cast<std::size_t>(r * in + j)];
                const double xqv = xq[static_cast<std::size_t>(r * in + j)];
                ref += w * xv;
                refq += w * xqv;
                amax = std::max(amax, std::fabs(xv));
                wsum += std::fabs(w);
                bound += std::fabs(w * xv) * 1e-6;  // float32 accumulation
                boundq += std::fabs(w * xqv) * 1e-6;
              }
              bound += wsum * activation_error(f, amax) * 1.01;
            }
            const double yv = y[static_cast<std::size_t>(r * out + n)];
            REQUIRE(std::fabs(yv - ref) <= bound + 1e-7);
            REQUIRE(std::fabs(yv - refq) <= boundq + 1e-7);
          }
        if (first.empty()) first = y;
        else REQUIRE(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) == 0);
        // Each row alone gives the same bits as in the batch.
        for (std::int64_t r = 0; r < rows; ++r) {
          std::vector<float> xr(x.begin() + r * in, x.begin() + (r + 1) * in);
          const auto yr = run(pool, ws, k, W.view, img, xr, 1);
          REQUIRE(std::memcmp(yr.data(), y.data() + r * out, static_cast<std::size_t>(out) * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("quantised kernels: a fused call equals separate calls; zero and non-finite activations", "[quant]") {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  cpu::LinearWorkspace ws;
  const std::int64_t in = 160, rows = 3;
  const Weight A(64, in, rng), B(8, in, rng), C(200, in, rng);
  for (auto layout : all_formats) {
    const Image ia(layout, A.view), ib(layout, B.view), ic(layout, C.view);
    std::vector<float> x(static_cast<std::size_t>(rows * in));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    for (std::int64_t j = 0; j < 32; ++j) x[static_cast<std::size_t>(in + j)] = 0.0f;  // an all-zero block
    std::vector<float> ya(rows * 64), yb(rows * 8), yc(rows * 200);
    const cpu::LinearPart parts[] = {{&A.view, ya.data(), 64, ia.u16.data(), layout},
                                     {&B.view, yb.data(), 8, ib.u16.data(), layout},
                                     {&C.view, yc.data(), 200, ic.u16.data(), layout}};
    cpu::linear_multi(pool, ws, parts, x.data(), in, rows);
    REQUIRE(ya == run(pool, ws, cpu::linear_kernel(), A.view, ia, x, rows));
    REQUIRE(yb == run(pool, ws, cpu::linear_kernel(), B.view, ib, x, rows));
    REQUIRE(yc == run(pool, ws, cpu::linear_kernel(), C.view, ic, x, rows));
    // A NaN activation makes its row's outputs NaN (as the float kernels would), nothing else.
    x[5] = std::numeric_limits<float>::quiet_NaN();
    const auto y = run(pool, ws, cpu::linear_kernel(), A.view, ia, x, rows);
    for (std::int64_t n = 0; n < 64; ++n) {
      REQUIRE(std::isnan(y[static_cast<std::size_t>(n)]));
      REQUIRE(std::isfinite(y[static_cast<std::size_t>(64 + n)]));
    }
    // So does an infinite one; and a row so small that 127 / max|x| overflows (subnormal values)
    // still gives the dequantised product, not garbage integers.
    x[5] = std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < in; ++j) x[static_cast<std::size_t>(2 * in + j)] = 1e-38f * nd(rng);
    const auto z = run(pool, ws, cpu::linear_kernel(), A.view, ia, x, rows);
    for (std::int64_t n = 0; n < 64; ++n) {
      REQUIRE(std::isnan(z[static_cast<std::size_t>(n)]));
      double ref = 0.0, mag = 0.0, act = 0.0;
      for (std::int64_t b = 0; b * 32 < in; ++b) {
        double amax = 0.0, wsum = 0.0;
        for (std::int64_t k = 32 * b; k < std::min(in, 32 * b + 32); ++k) {
          const double w = cpu::quant_image_value(format_of(layout), ia.bytes(), 64, in, n, k);
          const double xv = x[static_cast<std::size_t>(2 * in + k)];
          ref += w * xv;
          mag += std::fabs(w * xv);
          amax = std::max(amax, std::fabs(xv));
          wsum += std::fabs(w);
        }
        act += wsum * activation_error(format_of(layout), amax) * 1.01;
      }
      INFO(fmt::format("subnormal row, output {}: {} vs {}", n, z[static_cast<std::size_t>(128 + n)], ref));
      REQUIRE(std::fabs(z[static_cast<std::size_t>(128 + n)] - ref) <= 1e-3 * mag + act);
    }
  }
}

TEST_CASE("quantised activations: the parts follow the stated rule, block by block", "[quant]") {
  // The rule of quant.hpp restated: s = max|x| / 127, u = x · (127 / max|x|) in float32,
  // h = round(u), l = round((u − h) · 254), ties to even, both clamped to ±127; a block with a
  // non-finite value has zero parts and a NaN scale. The process's own (SIMD) quantiser must give
  // exactly these bytes for full blocks, partial blocks, outliers, ties, tiny and odd values.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::int64_t in = 32 * 9 + 7, rows = 5, stride = cpu::quant_activation_stride(in), kp = 32 * 10;
  std::vector<float> x(static_cast<std::size_t>(rows * in));
  for (auto& v : x) v = nd(rng);
  x[3] = 50.0f;                                                   // an outlier
  // Ties of h: with max|x| = 127 the multiplier is 1, so u = x = j − 15.5 exactly.
  for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(32 + j)] = j == 0 ? -127.0f : static_cast<float>(j) - 15.5f;
  for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(64 + j)] = 0.0f;                                      // all zero
  for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(in + j)] = 1e-39f * nd(rng);  // 127 / max overflows
  for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(in + 32 + j)] = 1e-30f * nd(rng);  // small, normal
  x[static_cast<std::size_t>(2 * in + 70)] = std::numeric_limits<float>::quiet_NaN();
  x[static_cast<std::size_t>(3 * in + 100)] = -std::numeric_limits<float>::infinity();
  x[static_cast<std::size_t>(4 * in + 5)] = 3e38f;  // the largest finite range
  std::vector<std::byte> buf(static_cast<std::size_t>(rows * stride) + 64);
  cpu::quantize_activations(x.data(), in, 0, rows, in, buf.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* p = buf.data() + r * stride;
    for (std::int64_t b = 0; b < kp / 32; ++b) {
      float v[32] = {};
      for (std::int64_t j = 0; j < 32 && 32 * b + j < in; ++j) v[j] = x[static_cast<std::size_t>(r * in + 32 * b + j)];
      float amax = 0.0f;
      bool finite = true;
      for (float e : v) {
        finite = finite && std::isfinite(e);
        amax = std::max(amax, std::fabs(e));
      }
      float scale;
      std::memcpy(&scale, p + 2 * kp + 4 * b, 4);
      std::int32_t sums[2];
      std::memcpy(sums, p + 2 * kp + kp / 32 * 4 + 8 * b, 8);
      INFO(fmt::format("row {} block {}", r, b));
      if (!finite) {
        REQUIRE(std::isnan(scale));
      } else {
        REQUIRE(scale == amax / 127.0f);
      }
      std::int32_t sh = 0, sl = 0;
      for (int j = 0; j < 32; ++j) {
        float u = 0.0f;
        if (finite && amax > 0.0f) u = std::isinf(127.0f / amax) ? v[j] / amax * 127.0f : v[j] * (127.0f / amax);
        const float h = std::clamp(std::nearbyint(u), -127.0f, 127.0f);
        const float l = std::clamp(std::nearbyint((u - h) * 254.0f), -127.0f, 127.0f);
        REQUIRE(static_cast<std::int8_t>(p[32 * b + j]) == static_cast<int>(h));
        REQUIRE(static_cast<std::int8_t>(p[kp + 32 * b + j]) == static_cast<int>(l));
        std::int16_t a;  // the parts' int16 combination, after the scales and sums (64-aligned)
        std::memcpy(&a, p + (2 * kp + kp / 32 * 12 + 63) / 64 * 64 + 2 * (32 * b + j), 2);
        REQUIRE(a == static_cast<int>(254 * h + l));
        sh += static_cast<std::int32_t>(h);
        sl += static_cast<std::int32_t>(l);
      }
      REQUIRE(sums[0] == sh);
      REQUIRE(sums[1] == sl);
    }
  }
}
