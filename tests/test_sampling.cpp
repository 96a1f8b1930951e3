// Sampling parameters, each checked for its effect against the formula transformers uses.

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <numeric>

#include "gdn/core/error.hpp"
#include "gdn/runtime/sampling.hpp"

using namespace gdn;

namespace {

std::vector<float> logits_fixture() { return {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 3.0f, -2.0f}; }

std::vector<float> softmax(std::vector<float> x, float t) {
  const float mx = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (auto& v : x) z += v = std::exp((v - mx) / t);
  for (auto& v : x) v = static_cast<float>(v / z);
  return x;
}

std::vector<float> dist(const SamplingParams& sp, const std::vector<float>& logits, std::span<const Token> pending = {}) {
  Sampler s(sp, static_cast<int>(logits.size()));
  std::vector<float> p(logits.size());
  s.distribution(logits, p, pending);
  return p;
}

}  // namespace

TEST_CASE("greedy and top-k 1 pick the argmax", "[sampling]") {
  const auto l = logits_fixture();
  Sampler g(SamplingParams{}, 8);
  CHECK(g.sample(l) == 6);
  SamplingParams k1;
  k1.temperature = 0.7f;
  k1.top_k = 1;
  k1.seed = 3;
  Sampler s(k1, 8);
  for (int i = 0; i < 50; ++i) CHECK(s.sample(l) == 6);
}

TEST_CASE("temperature gives softmax(logits / T)", "[sampling]") {
  const auto l = logits_fixture();
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    SamplingParams sp;
    sp.temperature = t;
    const auto p = dist(sp, l);
    const auto want = softmax(l, t);
    for (std::size_t i = 0; i < l.size(); ++i) CHECK(p[i] == Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("top-k, top-p and min-p keep the documented sets", "[sampling]") {
  const auto l = logits_fixture();  // sorted ids by logit: 6, 0, 1, 2, 3, 4, 5, 7
  const auto full = softmax(l, 1.0f);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 3;
  auto p = dist(sp, l);
  CHECK(std::count_if(p.begin(), p.end(), [](float v) { return v > 0; }) == 3);
  CHECK(p[6] > 0);
  CHECK(p[0] > 0);
  CHECK(p[1] > 0);
  CHECK(p[6] == Approx(full[6] / (full[6] + full[0] + full[1])));
  // top-p: smallest prefix with mass >= p.
  sp.top_k = 0;
  sp.top_p = (full[6] + full[0]) / 1.0f - 1e-4f;
  p = dist(sp, l);
  CHECK(std::count_if(p.begin(), p.end(), [](float v) { return v > 0; }) == 2);
  sp.top_p = full[6] + full[0] + 1e-4f;
  p = dist(sp, l);
  CHECK(std::count_if(p.begin(), p.end(), [](float v) { return v > 0; }) == 3);
  // min-p: keep p >= min_p * p_max.
  sp.top_p = 1.0f;
  sp.min_p = full[1] / full[6] - 1e-4f;
  p = dist(sp, l);
  CHECK(std::count_if(p.begin(), p.end(), [](float v) { return v > 0; }) == 3);
  for (const float v : p) CHECK(v >= 0.0f);
  CHECK(std::accumulate(p.begin(), p.end(), 0.0) == Approx(1.0));
}

TEST_CASE("repetition and presence penalties follow transformers' formulas", "[sampling]") {
  const auto l = logits_fixture();
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.repetition_penalty = 2.0f;
  const Token seen[] = {6, 5};  // a positive logit is divided, a negative one multiplied
  auto p = dist(sp, l, seen);
  std::vector<float> want_l = l;
  want_l[6] = 3.0f / 2.0f;
  want_l[5] = -1.0f * 2.0f;
  auto want = softmax(want_l, 1.0f);
  for (std::size_t i = 0; i < l.size(); ++i) CHECK(p[i] == Approx(want[i]).epsilon(1e-5));
  // Observed history and pending tokens count alike, each token once.
  Sampler s(sp, 8);
  s.observe(6);
  s.observe(6);
  std::vector<float> q(8);
  const Token pend[] = {5, 5};
  s.distribution(l, q, pend);
  for (std::size_t i = 0; i < l.size(); ++i) CHECK(q[i] == Approx(want[i]).epsilon(1e-5));
  // Presence: subtract once.
  SamplingParams pres;
  pres.temperature = 1.0f;
  pres.presence_penalty = 1.5f;
  p = dist(pres, l, seen);
  want_l = l;
  want_l[6] -= 1.5f;
  want_l[5] -= 1.5f;
  want = softmax(want_l, 1.0f);
  for (std::size_t i = 0; i < l.size(); ++i) CHECK(p[i] == Approx(want[i]).epsilon(1e-5));
  // Frequency: subtract once per occurrence, whether observed or pending.
  SamplingParams freq;
  freq.temperature = 1.0f;
  freq.frequency_penalty = 0.75f;
  Sampler fs(freq, 8);
  fs.observe(6);
  fs.observe(6);
  fs.observe(5);
  const Token fpend[] = {5, 6, 3, 3, 3};
  fs.distribution(l, q, fpend);
  want_l = l;
  want_l[6] -= 3 * 0.75f;
  want_l[5] -= 2 * 0.75f;
  want_l[3] -= 3 * 0.75f;
  want = softmax(want_l, 1.0f);
  for (std::size_t i = 0; i < l.size(); ++i) CHECK(q[i] == Approx(want[i]).epsilon(1e-5));
  freq.frequency_penalty = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(Sampler(freq, 8), Error);
  // Greedy honours penalties: the argmax moves from 6 to 0.
  SamplingParams g;
  g.repetition_penalty = 3.0f;
  Sampler gs(g, 8);
  gs.observe(6);
  CHECK(gs.sample(l) == 0);
}

TEST_CASE("a seeded sampler repeats exactly; draws follow the distribution", "[sampling]") {
  const auto l = logits_fixture();
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 42;
  Sampler a(sp, 8), b(sp, 8);
  std::vector<Token> ra, rb;
  for (int i = 0; i < 200; ++i) {
    ra.push_back(a.sample(l));
    rb.push_back(b.sample(l));
  }
  CHECK(ra == rb);
  sp.seed = 43;
  Sampler c(sp, 8);
  std::vector<Token> rc;
  for (int i = 0; i < 200; ++i) rc.push_back(c.sample(l));
  CHECK(rc != ra);
  // Chi-square of 50,000 draws against softmax(l) (fixed seed: deterministic).
  sp.seed = 5;
  Sampler d(sp, 8);
  std::vector<int> counts(8, 0);
  const int N = 50000;
  for (int i = 0; i < N; ++i) ++counts[static_cast<std::size_t>(d.sample(l))];
  const auto p = softmax(l, 1.0f);
  double chi2 = 0;
  for (std::size_t i = 0; i < 8; ++i) chi2 += (counts[i] - p[i] * N) * (counts[i] - p[i] * N) / (p[i] * N);
  CHECK(chi2 < 24.3);  // 7 dof, p = 0.001
}

TEST_CASE("a batch with different settings is sampled in one pass", "[sampling]") {
  const auto l = logits_fixture();
  std::vector<float> rows;
  for (int i = 0; i < 3; ++i) rows.insert(rows.end(), l.begin(), l.end());
  SamplingParams greedy, hot, penal;
  hot.temperature = 1.5f;
  hot.seed = 9;
  penal.repetition_penalty = 5.0f;
  Sampler s0(greedy, 8), s1(hot, 8), s2(penal, 8);
  s2.observe(6);
  Sampler* samplers[] = {&s0, &s1, &s2};
  Token out[3];
  ThreadPool pool(2);
  sample_batch(pool, samplers, rows, 8, out);
  CHECK(out[0] == 6);
  CHECK(out[2] == 0);
  Sampler again(hot, 8);
  CHECK(out[1] == again.sample(l));
}

TEST_CASE("bad sampling parameters are refused", "[sampling]") {
  SamplingParams sp;
  sp.top_p = 0.0f;
  CHECK_THROWS_AS(Sampler(sp, 8), gdn::Error);
  sp = {};
  sp.temperature = -1.0f;
  CHECK_THROWS_AS(Sampler(sp, 8), gdn::Error);
  sp = {};
  sp.top_k = -2;
  CHECK_THROWS_AS(Sampler(sp, 8), gdn::Error);
  Sampler ok(SamplingParams{}, 8);
  std::vector<float> wrong(5, 0.0f);
  CHECK_THROWS_AS(ok.sample(wrong), Error);
}
