#include "gdn/runtime/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

namespace gdn {
namespace {

std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::int32_t argmax(const std::vector<float>& v) {
  return static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, int vocab_size) : params_(params), vocab_(vocab_size), state_(params.seed) {
  if (vocab_size <= 0) throw Error(Status::invalid_argument, "Sampler: vocab_size must be positive");
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    throw Error(Status::invalid_argument, fmt::format("sampling: temperature must be >= 0, got {}", params.temperature));
  if (params.top_k < 0) throw Error(Status::invalid_argument, fmt::format("sampling: top_k must be >= 0, got {}", params.top_k));
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    throw Error(Status::invalid_argument, fmt::format("sampling: top_p must be in (0, 1], got {}", params.top_p));
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f))
    throw Error(Status::invalid_argument, fmt::format("sampling: min_p must be in [0, 1], got {}", params.min_p));
  if (!std::isfinite(params.presence_penalty) || !std::isfinite(params.frequency_penalty))
    throw Error(Status::invalid_argument, fmt::format("sampling: presence_penalty and frequency_penalty must be finite, got {} and {}",
                                                      params.presence_penalty, params.frequency_penalty));
  if (!(params.repetition_penalty > 0.0f))
    throw Error(Status::invalid_argument,
                fmt::format("sampling: repetition_penalty must be > 0, got {}", params.repetition_penalty));
  scratch_.resize(static_cast<std::size_t>(vocab_size));
  order_.resize(static_cast<std::size_t>(vocab_size));
  probs_.resize(static_cast<std::size_t>(vocab_size));
}

void Sampler::observe(Token t) {
  if (t >= 0 && t < vocab_) ++seen_[t];
}

double Sampler::uniform() { return static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53; }

void Sampler::penalised(std::span<const float> logits, std::span<const Token> pending, std::vector<float>& out) const {
  if (static_cast<int>(logits.size()) != vocab_)
    throw Error(Status::invalid_argument, fmt::format("sampling: {} logits for a vocabulary of {}", logits.size(), vocab_));
  std::copy(logits.begin(), logits.end(), out.begin());
  const bool rep = params_.repetition_penalty != 1.0f, pres = params_.presence_penalty != 0.0f;
  const bool freq = params_.frequency_penalty != 0.0f;
  if (!rep && !pres && !freq) return;
  // Repetition and presence penalties apply once per seen token, whatever its count (as transformers
  // does); the frequency penalty once per occurrence (as OpenAI's API does).
  const auto penalise = [&](Token t, int count) {
    float& l = out[static_cast<std::size_t>(t)];
    if (rep) l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    if (pres) l -= params_.presence_penalty;
    if (freq) l -= params_.frequency_penalty * static_cast<float>(count);
  };
  const auto in_pending = [&](Token t, std::size_t from) {
    return static_cast<int>(std::count(pending.begin() + static_cast<std::ptrdiff_t>(from), pending.end(), t));
  };
  for (const auto& [t, n] : seen_) penalise(t, pending.empty() ? n : n + in_pending(t, 0));
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const Token t = pending[i];
    if (t < 0 || t >= vocab_ || seen_.count(t)) continue;
    if (std::find(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(i), t) != pending.begin() + static_cast<std::ptrdiff_t>(i)) continue;
    penalise(t, in_pending(t, i));
  }
}

void Sampler::distribution(std::span<const float> logits, std::span<float> probs, std::span<const Token> pending) const {
  penalised(logits, pending, scratch_);
  std::fill(probs.begin(), probs.end(), 0.0f);
  if (greedy()) {
    probs[static_cast<std::size_t>(argmax(scratch_))] = 1.0f;
    return;
  }
  const std::size_t V = scratch_.size();
  const double inv_t = 1.0 / params_.temperature;
  const double mx = *std::max_element(scratch_.begin(), scratch_.end());
  const auto weight = [&](std::int32_t t) { return std::exp((scratch_[static_cast<std::size_t>(t)] - mx) * inv_t); };
  const auto by_logit = [&](std::int32_t a, std::int32_t b) {
    const float la = scratch_[static_cast<std::size_t>(a)], lb = scratch_[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  // top-k: the first K entries of order_ become the K largest logits (unordered).
  std::iota(order_.begin(), order_.end(), 0);
  const std::size_t K = params_.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(params_.top_k), V) : V;
  if (K < V) std::nth_element(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(K - 1), order_.end(), by_logit);
  double Z = 0.0;
  for (std::size_t i = 0; i < K; ++i) Z += weight(order_[i]);
  // top-p keeps the smallest most-likely prefix whose mass (renormalised over the top-k set)
  // reaches top_p; min-p keeps tokens with p >= min_p · p_max. Both need only a sorted prefix,
  // grown until both cuts fall inside it.
  std::size_t n = K;
  if (params_.top_p < 1.0f || params_.min_p > 0.0f) {
    std::size_t sorted = std::min<std::size_t>(K, 64);
    for (;;) {
      std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(sorted),
                        order_.begin() + static_cast<std::ptrdiff_t>(K), by_logit);
      std::size_t cut_p = K;
      bool found_p = params_.top_p >= 1.0f;
      double cum = 0.0;
      for (std::size_t i = 0; !found_p && i < sorted; ++i) {
        cum += weight(order_[i]) / Z;
        if (cum >= params_.top_p) {
          cut_p = i + 1;
          found_p = true;
        }
      }
      const double floor = params_.min_p * weight(order_[0]);  // weight(order_[0]) == 1
      std::size_t cut_m = 1;
      while (cut_m < sorted && weight(order_[cut_m]) >= floor) ++cut_m;
      const bool found_m = params_.min_p <= 0.0f || cut_m < sorted;
      if ((found_p && found_m) || sorted == K) {
        n = std::min(found_p ? cut_p : K, params_.min_p > 0.0f ? cut_m : K);
        break;
      }
      sorted = std::min(K, sorted * 4);
    }
  }
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) total += weight(order_[i]);
  for (std::size_t i = 0; i < n; ++i)
    probs[static_cast<std::size_t>(order_[i])] = static_cast<float>(weight(order_[i]) / total);
}

Token Sampler::draw(std::span<const float> probs) {
  const double u = uniform();
  double cum = 0.0;
  Token last = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    last = static_cast<Token>(i);
    if (u < cum) return last;
  }
  return last;  // rounding left u past the total: the last token with mass
}

Token Sampler::sample(std::span<const float> logits, std::span<const Token> pending) {
  if (greedy()) {
    penalised(logits, pending, scratch_);
    return argmax(scratch_);
  }
  distribution(logits, probs_, pending);
  return draw(probs_);
}

void sample_batch(ThreadPool& pool, std::span<Sampler* const> samplers, std::span<const float> logits, int vocab,
                  std::span<Token> out) {
  pool.parallel_for(static_cast<std::int64_t>(samplers.size()), 1, [&](std::int64_t b, std::int64_t e, int) {
    for (std::int64_t i = b; i < e; ++i)
      out[static_cast<std::size_t>(i)] =
          samplers[static_cast<std::size_t>(i)]->sample(logits.subspan(static_cast<std::size_t>(i * vocab), static_cast<std::size_t>(vocab)));
  });
}

}  // namespace gdn
