#include "gdn/runtime/speculative.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

namespace gdn {
namespace {

using Clock = std::chrono::steady_clock;

Token argmax(std::span<const float> p) {
  return static_cast<Token>(std::max_element(p.begin(), p.end()) - p.begin());
}

// Expected tokens per round with k drafts when each draft is accepted with probability a.
double expected_tokens(int k, double a) {
  double e = 0.0, term = 1.0;
  for (int i = 0; i <= k; ++i, term *= a) e += term;
  return e;
}

}  // namespace

bool accept_draft(std::span<const float> p, std::span<const float> q, Token d, double u, std::span<float> residual) {
  const auto di = static_cast<std::size_t>(d);
  if (q[di] > 0.0f && u < static_cast<double>(p[di]) / static_cast<double>(q[di])) return true;
  double z = 0.0;
  for (std::size_t v = 0; v < p.size(); ++v) z += std::max(0.0f, p[v] - q[v]);
  for (std::size_t v = 0; v < p.size(); ++v)
    residual[v] = z > 0.0 ? static_cast<float>(std::max(0.0f, p[v] - q[v]) / z) : p[v];
  return false;
}

SpeculativeDecoder::SpeculativeDecoder(Context& ctx, const SpeculativeParams& params) : ctx_(ctx), params_(params) {
  const Model& m = ctx.model();
  if (!m.has_mtp())
    throw Error(Status::unsupported_model, fmt::format("speculative decoding: '{}' has no MTP head", m.dir()));
  if (params.max_draft < 0 || params.max_draft > 16)
    throw Error(Status::invalid_argument, fmt::format("speculative decoding: max_draft must be in [0, 16], got {}", params.max_draft));
  if (ctx.params().max_rollback_tokens < params.max_draft + 1)
    throw Error(Status::invalid_argument,
                fmt::format("speculative decoding with k = {} needs a context with max_rollback_tokens >= {} (it has {})",
                            params.max_draft, params.max_draft + 1, ctx.params().max_rollback_tokens));
  V_ = m.config().vocab_size;
  H_ = m.config().hidden_size;
  round_seconds_.assign(static_cast<std::size_t>(params.max_draft + 1), -1.0);
  probs_.resize(static_cast<std::size_t>(V_));
  stats_.k = params.max_draft;
}

Token SpeculativeDecoder::start(SeqId seq, std::span<const Token> prompt, Sampler& sampler) {
  if (prompt.empty()) throw Error(Status::invalid_argument, "speculative decoding: the prompt is empty");
  if (ctx_.sequence_length(seq) != 0 || ctx_.mtp_length(seq) != 0)
    throw Error(Status::invalid_argument, "speculative decoding: start() needs a fresh sequence");
  sampler.observe(prompt);
  batch_.clear();
  batch_.add(seq, prompt, LogitsFor::last, /*hidden_all=*/true);
  ctx_.step(batch_);
  const auto L = static_cast<std::int64_t>(prompt.size());
  const Token first = sampler.sample(ctx_.logits(L - 1));
  sampler.observe(first);

  SeqState& st = seqs_[seq];
  st = SeqState{};
  st.sampler = &sampler;
  st.pending = first;
  for (std::int64_t t = 0; t < L; ++t) {
    const auto h = ctx_.hidden(t);
    st.pair_hidden.insert(st.pair_hidden.end(), h.begin(), h.end());
    st.pair_tokens.push_back(t + 1 < L ? prompt[static_cast<std::size_t>(t + 1)] : first);
  }
  // Catch the MTP layer up on the prompt now (all but the last pair, which starts the first draft).
  const SeqId one[] = {seq};
  flush_mtp(one, 1, false);
  return first;
}

void SpeculativeDecoder::finish(SeqId seq) { seqs_.erase(seq); }

// Feeds each sequence's pending MTP pairs, all but the last, once more than `min_pairs` are queued.
void SpeculativeDecoder::flush_mtp(std::span<const SeqId> seqs, std::size_t min_pairs, bool want_logits) {
  batch_.clear();
  hidden_in_.clear();
  for (const SeqId s : seqs) {
    SeqState& st = seqs_.at(s);
    if (st.pair_tokens.size() <= min_pairs) continue;
    const std::size_t n = st.pair_tokens.size() - 1;
    batch_.add(s, std::span(st.pair_tokens).first(n), want_logits ? LogitsFor::last : LogitsFor::none);
    hidden_in_.insert(hidden_in_.end(), st.pair_hidden.begin(), st.pair_hidden.begin() + static_cast<std::ptrdiff_t>(n * H_));
  }
  if (batch_.entries().empty()) return;
  ctx_.step_mtp(batch_, hidden_in_);
  for (const SeqId s : seqs) {
    SeqState& st = seqs_.at(s);
    if (st.pair_tokens.size() <= min_pairs) continue;
    const std::size_t n = st.pair_tokens.size() - 1;
    st.pair_tokens.erase(st.pair_tokens.begin(), st.pair_tokens.begin() + static_cast<std::ptrdiff_t>(n));
    st.pair_hidden.erase(st.pair_hidden.begin(), st.pair_hidden.begin() + static_cast<std::ptrdiff_t>(n * H_));
  }
}

int SpeculativeDecoder::choose_k() {
  const int K = params_.max_draft;
  if (!params_.adaptive || K == 0) return K;
  // Seconds per round at k: measured, else extrapolated from any measured k with a linear model
  // in which each draft adds a quarter of a plain step (drafting + verifying one more token).
  constexpr double per_draft = 0.25;
  double base = -1.0;
  for (int k = 0; k <= K; ++k)
    if (round_seconds_[static_cast<std::size_t>(k)] > 0) {
      base = round_seconds_[static_cast<std::size_t>(k)] / (1.0 + per_draft * k);
      break;
    }
  if (base < 0) return K;
  int best = 0;
  double best_rate = 0.0;
  for (int k = 0; k <= K; ++k) {
    const double measured = round_seconds_[static_cast<std::size_t>(k)];
    const double t = measured > 0 ? measured : base * (1.0 + per_draft * k);
    const double rate = expected_tokens(k, alpha_) / t;
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  // Now and then try a neighbour, so a change in acceptance (or an unmeasured k) is noticed.
  if (++rounds_since_explore_ >= 16) {
    rounds_since_explore_ = 0;
    return best == K ? best - 1 : best + 1;
  }
  return best;
}

void SpeculativeDecoder::record_round(int k, double seconds, std::int64_t trials, std::int64_t accepted) {
  double& t = round_seconds_[static_cast<std::size_t>(k)];
  t = t < 0 ? seconds : 0.8 * t + 0.2 * seconds;
  // Each draft is tried until the first rejection: accepted / trials estimates the per-draft rate.
  if (trials > 0) alpha_ = 0.8 * alpha_ + 0.2 * static_cast<double>(accepted) / static_cast<double>(trials);
}

void SpeculativeDecoder::advance(std::span<const SeqId> seqs, std::span<std::vector<Token>* const> out) {
  if (seqs.size() != out.size()) throw Error(Status::invalid_argument, "speculative decoding: one output per sequence");
  for (const SeqId s : seqs)
    if (!seqs_.count(s)) throw Error(Status::invalid_sequence, fmt::format("speculative decoding: sequence {:#x} was not started", s));
  const auto t0 = Clock::now();
  const int k = choose_k();
  stats_.k = k;
  const auto n = seqs.size();

  if (k == 0) {
    // Plain decoding; the MTP layer is caught up in batches, off the critical path.
    batch_.clear();
    for (const SeqId s : seqs) batch_.add(s, std::span(&seqs_.at(s).pending, 1), LogitsFor::last, true);
    ctx_.step(batch_);
    for (std::size_t i = 0; i < n; ++i) {
      SeqState& st = seqs_.at(seqs[i]);
      const std::int64_t row = batch_.last_row(i);
      const Token x = st.sampler->sample(ctx_.logits(row));
      st.sampler->observe(x);
      out[i]->push_back(x);
      const auto h = ctx_.hidden(row);
      st.pair_hidden.insert(st.pair_hidden.end(), h.begin(), h.end());
      st.pair_tokens.push_back(x);
      st.pending = x;
    }
    flush_mtp(seqs, 64, false);
    stats_.rounds += 1;
    stats_.generated += static_cast<std::int64_t>(n);
    record_round(0, std::chrono::duration<double>(Clock::now() - t0).count(), 0, 0);
    return;
  }

  // Draft 1: the queued pairs, the last of which is (h of the last position, pending token).
  std::vector<std::int64_t> mtp_valid(n);
  batch_.clear();
  hidden_in_.clear();
  for (const SeqId s : seqs) {
    SeqState& st = seqs_.at(s);
    batch_.add(s, st.pair_tokens, LogitsFor::last);
    hidden_in_.insert(hidden_in_.end(), st.pair_hidden.begin(), st.pair_hidden.end());
  }
  for (int d = 0; d < k; ++d) {
    ctx_.step_mtp(batch_, hidden_in_);
    for (std::size_t i = 0; i < n; ++i) {
      SeqState& st = seqs_.at(seqs[i]);
      if (d == 0) {
        st.pair_tokens.clear();
        st.pair_hidden.clear();
        st.drafts.clear();
        st.draft_probs.resize(static_cast<std::size_t>(k) * static_cast<std::size_t>(V_));
        mtp_valid[i] = ctx_.mtp_length(seqs[i]);
      }
      const std::int64_t row = batch_.last_row(i);
      std::span<float> q(st.draft_probs.data() + static_cast<std::size_t>(d) * static_cast<std::size_t>(V_), static_cast<std::size_t>(V_));
      st.sampler->distribution(ctx_.logits(row), q, st.drafts);
      st.drafts.push_back(st.sampler->greedy() ? argmax(q) : st.sampler->draw(q));
      const auto h = ctx_.hidden(row);
      st.chain_hidden.assign(h.begin(), h.end());
    }
    if (d + 1 == k) break;
    // Next draft step: (post-mtp.norm hidden, drafted token) at the next position.
    batch_.clear();
    hidden_in_.clear();
    for (const SeqId s : seqs) {
      SeqState& st = seqs_.at(s);
      batch_.add(s, std::span(&st.drafts.back(), 1), LogitsFor::last);
      hidden_in_.insert(hidden_in_.end(), st.chain_hidden.begin(), st.chain_hidden.end());
    }
  }

  // Verify [pending, d1..dk] in one main-model step.
  batch_.clear();
  std::vector<Token> verify;
  std::vector<std::vector<Token>> verify_tokens(n);
  for (std::size_t i = 0; i < n; ++i) {
    SeqState& st = seqs_.at(seqs[i]);
    verify_tokens[i].push_back(st.pending);
    verify_tokens[i].insert(verify_tokens[i].end(), st.drafts.begin(), st.drafts.end());
    batch_.add(seqs[i], verify_tokens[i], LogitsFor::all);
  }
  ctx_.step(batch_);

  std::int64_t trials = 0, accepted = 0, generated = 0;
  for (std::size_t i = 0; i < n; ++i) {
    SeqState& st = seqs_.at(seqs[i]);
    const std::int64_t row0 = batch_.entries()[i].output_begin;
    int a = 0;
    Token next = 0;
    for (;; ++a) {
      // p_a: the target distribution after pending and a accepted drafts.
      st.sampler->distribution(ctx_.logits(row0 + a), probs_, std::span(st.drafts).first(static_cast<std::size_t>(a)));
      if (a == k) {
        next = st.sampler->greedy() ? argmax(probs_) : st.sampler->draw(probs_);
        break;
      }
      const Token d = st.drafts[static_cast<std::size_t>(a)];
      const std::span<const float> q(st.draft_probs.data() + static_cast<std::size_t>(a) * static_cast<std::size_t>(V_),
                                     static_cast<std::size_t>(V_));
      ++trials;
      // Greedy: p and q are one-hot, so this accepts exactly when d is the target's argmax.
      const double u = st.sampler->greedy() ? 0.0 : st.sampler->uniform();
      if (accept_draft(probs_, q, d, u, probs_)) {
        ++accepted;
        continue;
      }
      next = st.sampler->greedy() ? argmax(probs_) : st.sampler->draw(probs_);
      break;
    }
    // Keep pending + a drafts; everything after leaves no trace.
    ctx_.rollback(seqs[i], a + 1);
    ctx_.truncate_mtp(seqs[i], mtp_valid[i]);
    for (int j = 0; j <= a; ++j) {
      const Token t = j < a ? st.drafts[static_cast<std::size_t>(j)] : next;
      st.sampler->observe(t);
      out[i]->push_back(t);
      const auto h = ctx_.hidden(row0 + j);
      st.pair_hidden.insert(st.pair_hidden.end(), h.begin(), h.end());
      st.pair_tokens.push_back(t);
    }
    st.pending = next;
    generated += a + 1;
  }
  stats_.rounds += 1;
  stats_.draft_rounds += 1;
  stats_.drafted += static_cast<std::int64_t>(k) * static_cast<std::int64_t>(n);
  stats_.accepted += accepted;
  stats_.generated += generated;
  record_round(k, std::chrono::duration<double>(Clock::now() - t0).count(), trials, accepted);
}

}  // namespace gdn
