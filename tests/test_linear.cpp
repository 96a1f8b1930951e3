// The projection kernels (backend/cpu/linear.hpp), each one this CPU has: results against a
// float64 reference, and the batch invariance the engine's bit-exact tests rely on — a row's
// output is identical whatever the number of rows in the call, and a fused call equals separate
// calls.

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/linear.hpp"

using namespace gdn;

namespace {

struct Matrix {
  std::vector<bf16> bf;
  std::vector<float> f32;
  TensorView view;
  Matrix(std::int64_t out, std::int64_t in, DType dt, std::mt19937& rng) {
    std::normal_distribution<float> d(0.0f, 0.05f);
    view.dtype = dt;
    view.rank = 2;
    view.shape[0] = out;
    view.shape[1] = in;
    if (dt == DType::bf16) {
      bf.resize(static_cast<std::size_t>(out * in));
      for (auto& v : bf) v = to_bf16(d(rng));
      view.data = reinterpret_cast<const std::byte*>(bf.data());
    } else {
      f32.resize(static_cast<std::size_t>(out * in));
      for (auto& v : f32) v = d(rng);
      view.data = reinterpret_cast<const std::byte*>(f32.data());
    }
  }
  double at(std::int64_t n, std::int64_t k) const {
    const std::int64_t in = view.dim(1);
    return view.dtype == DType::bf16 ? to_float(bf[static_cast<std::size_t>(n * in + k)]) : f32[static_cast<std::size_t>(n * in + k)];
  }
};

const cpu::LinearKernel all_kernels[] = {cpu::LinearKernel::scalar, cpu::LinearKernel::avx2, cpu::LinearKernel::avx512,
                                         cpu::LinearKernel::avx512bf16, cpu::LinearKernel::amx};
const char* names[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx"};

// The worst error of y (R rows of `out`) relative to Σ|w·x| against a float64 product of W with x,
// or with x rounded to bf16 first (MatmulInput::bf16: the exact product of the rounded values).
double worst_relative_error(const Matrix& W, const std::vector<float>& x, const std::vector<float>& y, std::int64_t R,
                            MatmulInput input) {
  const std::int64_t out = W.view.dim(0), in = W.view.dim(1);
  double worst = 0.0;
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t n = 0; n < out; ++n) {
      double ref = 0.0, mag = 0.0;
      for (std::int64_t j = 0; j < in; ++j) {
        float xv = x[static_cast<std::size_t>(r * in + j)];
        if (input == MatmulInput::bf16) xv = to_float(to_bf16(xv));
        ref += W.at(n, j) * xv;
        mag += std::fabs(W.at(n, j) * xv);
      }
      worst = std::max(worst, std::fabs(y[static_cast<std::size_t>(r * out + n)] - ref) / (mag + 1e-30));
    }
  return worst;
}

const char* input_name(MatmulInput m) { return m == MatmulInput::bf16 ? "bf16" : "float32"; }

}  // namespace

TEST_CASE("every kernel, float32 and bf16 inputs: accurate, batch-invariant, fused = separate", "[linear]") {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  cpu::LinearWorkspace ws;
  // Shapes with every kind of tail: rows not a multiple of 16, in not a multiple of 32 or 16.
  const std::int64_t shapes[][2] = {{37, 100}, {64, 64}, {16, 1024}, {129, 48}, {5, 7}};
  for (int ki = 0; ki < 5; ++ki) {
    const auto k = all_kernels[ki];
    if (k > cpu::linear_kernel()) continue;
    for (const MatmulInput input : {MatmulInput::float32, MatmulInput::bf16}) {
      for (const auto& sh : shapes) {
        for (const DType dt : {DType::bf16, DType::f32}) {
          const std::int64_t out = sh[0], in = sh[1];
          Matrix W(out, in, dt, rng), W2(11, in, dt, rng);
          const std::int64_t R = 40;
          std::vector<float> x(static_cast<std::size_t>(R * in));
          std::normal_distribution<float> d(0.0f, 1.0f);
          for (auto& v : x) v = d(rng);
          std::vector<float> all(static_cast<std::size_t>(R * out)), one(static_cast<std::size_t>(out));
          const cpu::LinearPart p{&W.view, all.data(), out};
          cpu::linear_multi(pool, ws, k, std::span(&p, 1), x.data(), in, R, input);
          INFO(fmt::format("kernel {} inputs {} dtype {} out {} in {}", names[ki], input_name(input), dtype_name(dt), out, in));
          // Accuracy against float64 (of the rounded activations for bf16 inputs).
          CHECK(worst_relative_error(W, x, all, R, input) < 2e-5);
          if (input == MatmulInput::bf16)  // the rounding happened: float32 inputs land measurably elsewhere
            CHECK(worst_relative_error(W, x, all, R, MatmulInput::float32) > 1e-4);
          // Each row alone, and in sub-batches of several sizes: bit-identical.
          bool same = true;
          for (const std::int64_t B : {std::int64_t{1}, std::int64_t{3}, std::int64_t{9}, std::int64_t{16}, std::int64_t{17}}) {
            std::vector<float> part(static_cast<std::size_t>(B * out));
            for (std::int64_t r0 = 0; r0 + B <= R; r0 += B) {
              const cpu::LinearPart q{&W.view, part.data(), out};
              cpu::linear_multi(pool, ws, k, std::span(&q, 1), x.data() + r0 * in, in, B, input);
              same &= std::memcmp(part.data(), all.data() + r0 * out, part.size() * sizeof(float)) == 0;
            }
          }
          CHECK(same);
          // Fused with a second weight: each output equals its separate call.
          std::vector<float> fa(static_cast<std::size_t>(R * out)), fb(static_cast<std::size_t>(R * 11)), sb(fb.size());
          const cpu::LinearPart two[2] = {{&W.view, fa.data(), out}, {&W2.view, fb.data(), 11}};
          cpu::linear_multi(pool, ws, k, std::span(two, 2), x.data(), in, R, input);
          const cpu::LinearPart b1{&W2.view, sb.data(), 11};
          cpu::linear_multi(pool, ws, k, std::span(&b1, 1), x.data(), in, R, input);
          CHECK(std::memcmp(fa.data(), all.data(), fa.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(fb.data(), sb.data(), fb.size() * sizeof(float)) == 0);
        }
      }
    }
  }
  WARN(fmt::format("kernel in use: {}", cpu::linear_kernel_name()));
}

TEST_CASE("weight images: bit-identical to the weights read in place", "[linear]") {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  cpu::LinearWorkspace ws;
  // Row counts around the 16- and 32-row blocks of the images, k tails (odd, not a multiple of
  // 32), rows around the AVX-512 kernel's groups of 6, k beyond its 256-column in-place chunks,
  // and prefill-sized calls (> 32 activation rows switch the AMX kernel to ranges of up to 1024
  // weight rows).
  const std::int64_t shapes[][2] = {{37, 100}, {16, 64}, {48, 1024}, {129, 48}, {5, 7}, {1100, 96}, {70, 301}};
  int tested = 0;
  for (int ki = 0; ki < 5; ++ki) {
    const auto k = all_kernels[ki];
    const auto layout = cpu::weight_image_layout(k);
    if (k > cpu::linear_kernel() || layout == cpu::WeightImage::none) continue;
    ++tested;
    for (const auto& sh : shapes) {
      const std::int64_t out = sh[0], in = sh[1];
      Matrix W(out, in, DType::bf16, rng);
      std::vector<std::uint16_t> image(cpu::weight_image_elements(layout, out, in), 0xFFFF);  // padding must be written
      // Packed in two pieces, as the loader's threads do.
      const std::int64_t split = std::min<std::int64_t>(out, 32);
      cpu::pack_weight_image(layout, W.view, 0, split, image.data());
      if (split < out) cpu::pack_weight_image(layout, W.view, split, out, image.data());
      for (const std::int64_t R : {std::int64_t{1}, std::int64_t{3}, std::int64_t{7}, std::int64_t{40}, std::int64_t{101}})
      for (const MatmulInput input : {MatmulInput::float32, MatmulInput::bf16}) {
        std::vector<float> x(static_cast<std::size_t>(R * in));
        std::normal_distribution<float> d(0.0f, 1.0f);
        for (auto& v : x) v = d(rng);
        std::vector<float> in_place(static_cast<std::size_t>(R * out)), packed(in_place.size());
        const cpu::LinearPart a{&W.view, in_place.data(), out};
        const cpu::LinearPart b{&W.view, packed.data(), out, image.data(), layout};
        cpu::linear_multi(pool, ws, k, std::span(&a, 1), x.data(), in, R, input);
        cpu::linear_multi(pool, ws, k, std::span(&b, 1), x.data(), in, R, input);
        INFO(fmt::format("kernel {} inputs {} out {} in {} rows {}", names[ki], input_name(input), out, in, R));
        CHECK(std::memcmp(in_place.data(), packed.data(), packed.size() * sizeof(float)) == 0);
        CHECK(worst_relative_error(W, x, packed, R, input) < 2e-5);  // and against float64
      }
    }
  }
  if (tested == 0) WARN("SKIPPED: this CPU runs no kernel that reads a weight image (AMX or AVX-512)");
}
