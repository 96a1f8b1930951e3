// MTP speculative decoding: greedy output bit-identical to plain greedy decoding for every k and
// with adaptive k; identical for batch sizes 1, 4 and 16; and, with temperature > 0, a chi-square
// test (fixed seeds) that the sampled distribution is exactly the plain one.

#include <catch2/catch.hpp>

#include <map>

#include <fmt/format.h>

#include "gdn/runtime/speculative.hpp"
#include "test_util.hpp"

using namespace gdn;

namespace {

ContextParams params(int seqs) {
  ContextParams p;
  p.max_sequences = seqs;
  p.max_context = 256;
  p.threads = 2;
  p.max_rollback_tokens = 8;
  return p;
}

std::vector<Token> prompt_for(int i) {
  std::vector<Token> t;
  for (int j = 0; j < 5 + i % 7; ++j) t.push_back(static_cast<Token>((i * 53 + j * 29 + 7) % 256));
  return t;
}

// Plain decoding of several sequences together, `n` tokens each.
std::vector<std::vector<Token>> plain(const std::shared_ptr<const Model>& model, const std::vector<std::vector<Token>>& prompts,
                                      int n, const SamplingParams& sp) {
  Context ctx(model, params(static_cast<int>(prompts.size())));
  std::vector<SeqId> ids;
  std::vector<Sampler> samplers;
  Batch b;
  for (const auto& p : prompts) {
    ids.push_back(ctx.create_sequence());
    samplers.emplace_back(sp, model->config().vocab_size);
    samplers.back().observe(p);
    b.add(ids.back(), p);
  }
  ctx.step(b);
  std::vector<std::vector<Token>> out(prompts.size());
  for (int t = 0; t < n; ++t) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const Token x = samplers[i].sample(ctx.logits(static_cast<std::int64_t>(i)));
      samplers[i].observe(x);
      out[i].push_back(x);
    }
    if (t + 1 == n) break;
    b.clear();
    for (std::size_t i = 0; i < ids.size(); ++i) b.add(ids[i], out[i].back());
    ctx.step(b);
  }
  return out;
}

std::vector<std::vector<Token>> speculative(const std::shared_ptr<const Model>& model,
                                            const std::vector<std::vector<Token>>& prompts, int n, const SamplingParams& sp,
                                            const SpeculativeParams& spec, SpeculativeStats* stats = nullptr) {
  Context ctx(model, params(static_cast<int>(prompts.size())));
  SpeculativeDecoder dec(ctx, spec);
  std::vector<SeqId> ids;
  std::vector<Sampler> samplers;
  samplers.reserve(prompts.size());
  std::vector<std::vector<Token>> out(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(ctx.create_sequence());
    samplers.emplace_back(sp, model->config().vocab_size);
    out[i].push_back(dec.start(ids.back(), prompts[i], samplers.back()));
  }
  std::vector<std::vector<Token>*> outs;
  for (auto& o : out) outs.push_back(&o);
  auto done = [&] {
    for (const auto& o : out)
      if (static_cast<int>(o.size()) < n) return false;
    return true;
  };
  while (!done()) dec.advance(ids, outs);
  for (auto& o : out) o.resize(static_cast<std::size_t>(n));
  if (stats) *stats = dec.stats();
  return out;
}

}  // namespace

TEST_CASE("greedy speculative decoding is token-identical to plain greedy, for every k", "[spec]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  const std::vector<std::vector<Token>> prompts = {prompt_for(0), prompt_for(3)};
  SamplingParams greedy;
  const auto want = plain(model, prompts, 48, greedy);
  for (int k = 0; k <= 4; ++k) {
    for (const bool adaptive : {false, true}) {
      SpeculativeStats st;
      const auto got = speculative(model, prompts, 48, greedy, SpeculativeParams{k, adaptive}, &st);
      INFO(fmt::format("k={} adaptive={}: acceptance {:.2f}, tokens/round {:.2f}", k, adaptive, st.acceptance_rate(),
                       st.tokens_per_round()));
      CHECK(got == want);
    }
  }
  // With repetition and presence penalties too (they see drafted tokens as pending history).
  SamplingParams pen;
  pen.repetition_penalty = 1.3f;
  pen.presence_penalty = 0.5f;
  CHECK(speculative(model, prompts, 40, pen, SpeculativeParams{3, false}) == plain(model, prompts, 40, pen));
}

TEST_CASE("greedy output is identical for batch sizes 1, 4 and 16", "[spec][batch]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  std::vector<std::vector<Token>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(prompt_for(i));
  SamplingParams greedy;
  const int n = 24;
  std::vector<std::vector<Token>> alone;
  for (const auto& p : prompts) alone.push_back(plain(model, {p}, n, greedy)[0]);
  std::vector<std::vector<Token>> by4;
  for (int g = 0; g < 4; ++g) {
    const auto r = plain(model, std::vector<std::vector<Token>>(prompts.begin() + g * 4, prompts.begin() + g * 4 + 4), n, greedy);
    by4.insert(by4.end(), r.begin(), r.end());
  }
  const auto by16 = plain(model, prompts, n, greedy);
  CHECK(by4 == alone);
  CHECK(by16 == alone);
  CHECK(speculative(model, prompts, n, greedy, SpeculativeParams{3, false}) == alone);
  const auto spec4 = speculative(model, std::vector<std::vector<Token>>(prompts.begin(), prompts.begin() + 4), n, greedy,
                                 SpeculativeParams{2, true});
  CHECK(spec4 == std::vector<std::vector<Token>>(alone.begin(), alone.begin() + 4));
}

TEST_CASE("speculative sampling leaves the output distribution unchanged (chi-square)", "[spec][stat]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  const int V = model->config().vocab_size;
  const auto prompt = prompt_for(5);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 3;  // 27 outcomes for three tokens
  // Exact joint distribution of the first three tokens from the main model.
  std::map<std::vector<Token>, double> exact;
  {
    Context ctx(model, params(1));
    Sampler s(sp, V);
    s.observe(prompt);
    std::vector<float> p1(static_cast<std::size_t>(V)), p2(p1.size()), p3(p1.size());
    const SeqId q = ctx.create_sequence();
    Batch b;
    b.add(q, prompt);
    ctx.step(b);
    s.distribution(ctx.logits(0), p1);
    const SnapshotId base = ctx.snapshot(q);
    for (Token a = 0; a < V; ++a) {
      if (p1[static_cast<std::size_t>(a)] == 0.0f) continue;
      ctx.restore(q, base);
      b.clear();
      b.add(q, a);
      ctx.step(b);
      const Token pa[] = {a};
      s.distribution(ctx.logits(0), p2, pa);
      const SnapshotId second = ctx.snapshot(q);
      for (Token c = 0; c < V; ++c) {
        if (p2[static_cast<std::size_t>(c)] == 0.0f) continue;
        ctx.restore(q, second);
        b.clear();
        b.add(q, c);
        ctx.step(b);
        const Token pac[] = {a, c};
        s.distribution(ctx.logits(0), p3, pac);
        for (Token d = 0; d < V; ++d)
          if (p3[static_cast<std::size_t>(d)] > 0.0f)
            exact[{a, c, d}] = static_cast<double>(p1[static_cast<std::size_t>(a)]) * p2[static_cast<std::size_t>(c)] *
                               p3[static_cast<std::size_t>(d)];
      }
      ctx.free_snapshot(second);
    }
  }
  REQUIRE(exact.size() == 27);
  // Samples from speculative decoding with k = 2, one seed per sample.
  const int N = 2000;
  std::map<std::vector<Token>, int> counts;
  Context ctx(model, params(1));
  SpeculativeDecoder dec(ctx, SpeculativeParams{2, false});
  for (int i = 0; i < N; ++i) {
    SamplingParams si = sp;
    si.seed = 1000 + static_cast<std::uint64_t>(i);
    Sampler s(si, V);
    const SeqId q = ctx.create_sequence();
    std::vector<Token> out = {dec.start(q, prompt, s)};
    std::vector<Token>* o[] = {&out};
    const SeqId ids[] = {q};
    while (out.size() < 3) dec.advance(ids, o);
    out.resize(3);
    ++counts[out];
    dec.finish(q);
    ctx.free_sequence(q);
  }
  // Pearson chi-square over the 27 cells (all expected counts are large enough here).
  double chi2 = 0.0;
  double min_expected = 1e9;
  for (const auto& [key, p] : exact) {
    const double e = p * N;
    min_expected = std::min(min_expected, e);
    const double o = counts.count(key) ? counts[key] : 0;
    chi2 += (o - e) * (o - e) / e;
  }
  const auto& st = dec.stats();
  WARN(fmt::format("speculative sampling, {} samples: chi2 = {:.1f} on 26 dof (p = 0.001 critical value 54.1); "
                   "min expected count {:.1f}; draft acceptance {:.2f}",
                   N, chi2, min_expected, st.acceptance_rate()));
  CHECK(min_expected >= 5.0);
  CHECK(chi2 < 54.1);
  CHECK(st.drafted > 0);
  CHECK(st.accepted < st.drafted);  // the residual path ran end to end (the rule itself is tested below)
}

TEST_CASE("the speculative sampling rule reproduces the target distribution exactly", "[spec][stat]") {
  // Overlapping but different target p and draft q over 12 tokens, with one token q never drafts
  // and one p never emits: both the accept and the resample paths carry mass.
  const std::vector<float> p = {0.20f, 0.15f, 0.12f, 0.10f, 0.09f, 0.08f, 0.07f, 0.06f, 0.05f, 0.04f, 0.04f, 0.0f};
  const std::vector<float> q = {0.05f, 0.25f, 0.02f, 0.15f, 0.10f, 0.0f, 0.13f, 0.05f, 0.05f, 0.05f, 0.05f, 0.10f};
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 7;
  Sampler rng(sp, 12);
  std::vector<float> residual(12);
  std::vector<int> counts(12, 0);
  const int N = 40000;
  int accepted = 0;
  for (int i = 0; i < N; ++i) {
    const Token d = rng.draw(q);
    if (accept_draft(p, q, d, rng.uniform(), residual)) {
      ++counts[static_cast<std::size_t>(d)];
      ++accepted;
    } else {
      ++counts[static_cast<std::size_t>(rng.draw(residual))];
    }
  }
  double chi2 = 0.0;
  for (std::size_t v = 0; v < 11; ++v) {
    const double e = p[v] * N;
    chi2 += (counts[v] - e) * (counts[v] - e) / e;
  }
  WARN(fmt::format("accept/resample rule: {} draws, {:.0f}% accepted, chi2 = {:.1f} on 10 dof (p = 0.001: 29.6)", N,
                   100.0 * accepted / N, chi2));
  CHECK(counts[11] == 0);
  CHECK(chi2 < 29.6);
  CHECK(accepted > N / 4);
  CHECK(accepted < N);
}
