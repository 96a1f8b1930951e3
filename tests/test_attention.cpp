// The attention kernel on its own, against a double-precision reference written from the
// equations: o = sigmoid(gate) · Σ_j softmax_j(scale · q·k_j) v_j over positions 0..p, with the
// keys and values as the cache holds them (a bf16 cache's roundings included). The kernel is the
// one the engine runs, called through the CPU backend's table for every target this CPU supports
// and for both KV dtypes. Shapes: the head dim of every supported model (256) and the fixtures'
// (32), one with a 32-wide tail (96) and one off the vector path (48); 1 to 8 query heads per kv
// head (the 27B's 6 runs as 4 + 2); lengths on both sides of the 64-position blocks, pages in a
// shuffled order. And the property prefill, decode and MTP verification rest on: a row computed
// alone equals the same row computed inside a multi-row segment, bit for bit.
//
// The avx512bf16 target's bf16-cache path (vdpbf16ps) rounds the queries and the softmax weights
// to bf16 too: its reference takes the rounded queries, and each output may differ from it by the
// weights' rounding, at most 2^-8 of Σ p_j·|v_j| / Σ p_j (round to nearest even, 8 significant
// bits), on top of the float32 tolerance.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/target.hpp"
#include "cpu_targets.hpp"
#include "gdn/core/dtype.hpp"

using gdn::DType;
using gdn::cpu::AttentionRows;
using gdn::cpu::KvStore;
using gdn::cpu::Target;

namespace {

constexpr int kHkv = 2, kLayers = 2, kLayer = 1, kPageSize = 16;

// A cache holding `len` random positions of one sequence in layer kLayer, its pages shuffled among
// spare ones, and the positions as stored, in float.
struct Cache {
  KvStore kv;
  std::vector<std::int32_t> pages;
  std::vector<float> keys, values;  // [kv head][position][hd], as stored
};

template <typename T>
void fill(Cache& c, int len, int hd, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  c.keys.assign(static_cast<std::size_t>(kHkv) * len * hd, 0.0f);
  c.values.assign(c.keys.size(), 0.0f);
  for (int g = 0; g < kHkv; ++g)
    for (int p = 0; p < len; ++p) {
      T* k = c.kv.keys<T>(c.pages[static_cast<std::size_t>(p / kPageSize)], kLayer, g) + (p % kPageSize) * hd;
      T* v = c.kv.values<T>(c.pages[static_cast<std::size_t>(p / kPageSize)], kLayer, g) + (p % kPageSize) * hd;
      for (int i = 0; i < hd; ++i) {
        const std::size_t at = (static_cast<std::size_t>(g) * len + p) * hd + i;
        if constexpr (std::is_same_v<T, float>) {
          k[i] = nd(rng);
          v[i] = nd(rng);
        } else {
          k[i] = gdn::to_bf16(nd(rng));
          v[i] = gdn::to_bf16(nd(rng));
        }
        c.keys[at] = gdn::to_float(k[i]);
        c.values[at] = gdn::to_float(v[i]);
      }
    }
}

Cache make_cache(DType dtype, int len, int hd, unsigned seed) {
  std::mt19937 rng(seed);
  const int used = (len + kPageSize - 1) / kPageSize;
  Cache c{KvStore(used + 3, kPageSize, kLayers, kHkv, hd, dtype), {}, {}, {}};
  std::vector<std::int32_t> all(static_cast<std::size_t>(used + 3));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  c.pages.assign(all.begin(), all.begin() + used);
  if (dtype == DType::bf16) fill<gdn::bf16>(c, len, hd, rng);
  else fill<float>(c, len, hd, rng);
  return c;
}

// Random queries [n][Hq·hd] and q_proj rows [n][2·Hq·hd] (the gates in each head's second half).
std::pair<std::vector<float>, std::vector<float>> queries_and_gates(std::int64_t n, int Hq, int hd, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> q(static_cast<std::size_t>(n) * Hq * hd), gate(static_cast<std::size_t>(n) * 2 * Hq * hd);
  for (auto& x : q) x = nd(rng);
  for (auto& x : gate) x = nd(rng);
  return {std::move(q), std::move(gate)};
}

// Rows [0, n) of a segment starting at position pos, every kv head, in tasks of up to 16 rows as
// the engine splits them — or, `split`, one task per chunk of positions and kv head, then
// attention_merge per row and head, as the engine spreads a decode over more threads than kv heads.
std::vector<float> run(const gdn::cpu::TargetKernels& K, const Cache& c, std::int64_t pos, std::int64_t n, int Hq, int hd,
                       const std::vector<float>& q, const std::vector<float>& gate, std::int64_t row0 = 0, bool split = false) {
  const int group = Hq / kHkv;
  const std::vector<float> qc(q.begin() + row0 * Hq * hd, q.begin() + (row0 + n) * Hq * hd);
  std::vector<float> core(static_cast<std::size_t>(n) * Hq * hd, -1.0f);
  std::vector<float> scratch(static_cast<std::size_t>(gdn::cpu::attention_scratch_floats(group, hd)), NAN);
  const AttentionRows rows{qc.data(), gate.data() + row0 * 2LL * Hq * hd, 2LL * Hq * hd, core.data()};
  const gdn::PassSegment seg{0, 0, n, pos, false};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (!split) {
    for (int g = 0; g < kHkv; ++g)
      for (std::int64_t r0 = 0; r0 < n; r0 += 16)
        K.attention(c.kv, kLayer, g, c.pages, seg, r0, std::min(n, r0 + 16), Hq, hd, group, scale, rows, scratch.data(), {});
    return core;
  }
  const std::int64_t chunks = gdn::cpu::attention_chunks(pos + n);
  std::vector<float> partials(static_cast<std::size_t>(n * Hq * (chunks + 1) * (hd + 2)), NAN);
  for (std::int64_t ch = chunks - 1; ch >= 0; --ch)  // any order: each task writes its own chunk
    for (int g = 0; g < kHkv; ++g)
      K.attention(c.kv, kLayer, g, c.pages, seg, 0, n, Hq, hd, group, scale, rows, scratch.data(),
                  gdn::cpu::AttentionSplit{ch, partials.data(), chunks + 1});
  for (std::int64_t t = 0; t < n; ++t)
    for (int h = 0; h < Hq; ++h)
      K.attention_merge(c.kv.dtype(), seg, t, h, Hq, hd, rows, gdn::cpu::AttentionSplit{-1, partials.data(), chunks + 1});
  return core;
}

}  // namespace

TEST_CASE("attention matches the double-precision equations; a row alone equals it inside a segment", "[attention]") {
  struct Shape {
    int hd, group, len, n;  // len positions in all; the last n are the segment's rows
  };
  const Shape shapes[] = {{256, 4, 200, 9},  {256, 6, 129, 3}, {256, 1, 65, 65}, {32, 2, 63, 17}, {32, 4, 1, 1},
                          {96, 3, 130, 20}, {48, 2, 70, 5},   {64, 8, 64, 2},   {256, 4, 300, 1},
                          {64, 4, 4200, 3}};  // three chunks of positions (attention_chunk)
  for (const Target target : gdn::test::supported_targets()) {
    const auto& K = gdn::cpu::target_kernels(target);
    for (const DType dtype : {DType::f32, DType::bf16})
      for (const Shape& sh : shapes) {
        INFO("target " << K.name << ", KV " << gdn::dtype_name(dtype) << ", head dim " << sh.hd << ", group " << sh.group
                       << ", length " << sh.len << ", rows " << sh.n);
        const int Hq = sh.group * kHkv, hd = sh.hd;
        const Cache c = make_cache(dtype, sh.len, hd, static_cast<unsigned>(sh.hd * 131 + sh.len));
        const auto [q, gate] = queries_and_gates(sh.n, Hq, hd, static_cast<unsigned>(sh.group + 7));
        const std::int64_t pos = sh.len - sh.n;
        const std::vector<float> core = run(K, c, pos, sh.n, Hq, hd, q, gate);
        const bool bf16_dot = target == Target::avx512bf16 && dtype == DType::bf16 && hd % 32 == 0;
        std::vector<float> q_ref = q;
        if (bf16_dot)
          for (auto& x : q_ref) x = gdn::to_float(gdn::to_bf16(x));

        double worst = 0.0, worst_excess = -1.0;
        const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
        for (int t = 0; t < sh.n; ++t)
          for (int h = 0; h < Hq; ++h) {
            const int g = h / sh.group, len = static_cast<int>(pos) + t + 1;
            const float* qv = q_ref.data() + (static_cast<std::size_t>(t) * Hq + h) * hd;
            std::vector<double> s(static_cast<std::size_t>(len));
            double m = -INFINITY;
            for (int j = 0; j < len; ++j) {
              const float* k = c.keys.data() + (static_cast<std::size_t>(g) * sh.len + j) * hd;
              double d = 0.0;
              for (int i = 0; i < hd; ++i) d += static_cast<double>(qv[i]) * k[i];
              s[static_cast<std::size_t>(j)] = d * scale;
              m = std::max(m, d * scale);
            }
            double z = 0.0;
            for (auto& x : s) z += (x = std::exp(x - m));
            for (int i = 0; i < hd; ++i) {
              double o = 0.0, o_abs = 0.0;
              for (int j = 0; j < len; ++j) {
                const double v = c.values[(static_cast<std::size_t>(g) * sh.len + j) * hd + i];
                o += s[static_cast<std::size_t>(j)] * v;
                o_abs += s[static_cast<std::size_t>(j)] * std::abs(v);
              }
              const double gt = gate[static_cast<std::size_t>(t) * 2 * Hq * hd + 2 * h * hd + hd + i];
              const double sig = 1.0 / (1.0 + std::exp(-gt)), ref = o / z * sig;
              const double diff = std::abs(ref - core[(static_cast<std::size_t>(t) * Hq + h) * hd + i]);
              // Float32 sums of up to 300 products of unit-scale terms: a few ulp of the result's scale.
              const double allowed = 2e-5 + (bf16_dot ? std::ldexp(o_abs / z * sig, -8) : 0.0);
              worst = std::max(worst, diff);
              worst_excess = std::max(worst_excess, diff - allowed);
            }
          }
        INFO("worst difference " << worst);
        CHECK(worst_excess < 0.0);

        // Each row alone (a decode step, or one row of an MTP verification) == inside the segment.
        for (const int t : {0, sh.n / 2, sh.n - 1}) {
          const std::vector<float> alone = run(K, c, pos + t, 1, Hq, hd, q, gate, t);
          CHECK(std::equal(alone.begin(), alone.end(), core.begin() + static_cast<std::ptrdiff_t>(t) * Hq * hd));
        }
      }
  }
}

TEST_CASE("attention split by chunk over tasks, then merged, equals one task per row, bit for bit", "[attention]") {
  // The engine splits a decode whose tasks would leave threads idle (few rows, more cores than kv
  // heads): one task per chunk of positions, then attention_merge. Rows of one to three chunks,
  // with a row ending exactly on a chunk boundary; decode (1 row) and MTP verification (3 rows).
  constexpr std::int64_t C = gdn::cpu::attention_chunk;
  struct Shape {
    int hd, group;
    std::int64_t len, n;
  };
  const Shape shapes[] = {{256, 4, 2 * C + 70, 1}, {64, 3, C + 1, 3}, {96, 2, 2 * C, 1}, {48, 2, C + 40, 2}, {32, 1, 3 * C, 3}};
  for (const Target target : gdn::test::supported_targets()) {
    const auto& K = gdn::cpu::target_kernels(target);
    for (const DType dtype : {DType::f32, DType::bf16})
      for (const Shape& sh : shapes) {
        INFO("target " << K.name << ", KV " << gdn::dtype_name(dtype) << ", head dim " << sh.hd << ", length " << sh.len << ", rows " << sh.n);
        const int Hq = sh.group * kHkv, hd = sh.hd;
        const Cache c = make_cache(dtype, static_cast<int>(sh.len), hd, static_cast<unsigned>(sh.len + hd));
        const auto [q, gate] = queries_and_gates(sh.n, Hq, hd, static_cast<unsigned>(sh.group + 11));
        const std::int64_t pos = sh.len - sh.n;
        const auto whole = run(K, c, pos, sh.n, Hq, hd, q, gate);
        const auto split = run(K, c, pos, sh.n, Hq, hd, q, gate, 0, true);
        CHECK(std::equal(whole.begin(), whole.end(), split.begin()));
        CHECK(std::all_of(whole.begin(), whole.end(), [](float x) { return std::isfinite(x); }));
      }
  }
}
