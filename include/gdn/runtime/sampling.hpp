#pragma once
// Token sampling, per sequence. A Sampler turns a row of logits into the distribution the
// sequence samples from — penalties on tokens already seen, then temperature, top-k, top-p and
// min-p, in the order transformers' generate() applies them — and draws from it with its own
// seeded RNG, so the same seed gives the same text on every machine. temperature == 0 is greedy
// (argmax after penalties). sample_batch() samples many sequences, each with its own settings, in
// one parallel pass.
// Thread safety: a Sampler (its history and RNG) is used by one thread at a time; keep one per sequence.

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "gdn/core/thread_pool.hpp"
#include "gdn/runtime/batch.hpp"

namespace gdn {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off; keeps tokens with p >= min_p · p_max
  float repetition_penalty = 1.0f;  // > 1 discourages seen tokens (logit > 0: / penalty, else · penalty)
  float presence_penalty = 0.0f;    // subtracted once from the logit of every seen token
  std::uint64_t seed = 0;
  float frequency_penalty = 0.0f;   // subtracted from a seen token's logit once per time it was seen (OpenAI's)
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int vocab_size);

  const SamplingParams& params() const noexcept { return params_; }
  bool greedy() const noexcept { return params_.temperature <= 0.0f; }

  // Tokens the penalties see (prompt and generated). Order does not matter to the penalties.
  void observe(Token t);
  void observe(std::span<const Token> ts) {
    for (const Token t : ts) observe(t);
  }

  // The distribution over the vocabulary (sums to 1; zero outside the kept set) for `logits`, with
  // `pending` counted as seen in addition to the observed history. For greedy sampling it is
  // one-hot at the argmax.
  void distribution(std::span<const float> logits, std::span<float> probs, std::span<const Token> pending = {}) const;

  // distribution() then a draw.
  Token sample(std::span<const float> logits, std::span<const Token> pending = {});
  // A draw from a distribution over the vocabulary.
  Token draw(std::span<const float> probs);
  // Uniform in [0, 1), from the sequence's RNG.
  double uniform();

 private:
  void penalised(std::span<const float> logits, std::span<const Token> pending, std::vector<float>& out) const;

  SamplingParams params_;
  int vocab_;
  std::unordered_map<Token, int> seen_;
  std::uint64_t state_;                 // splitmix64: tiny, fast and identical everywhere
  mutable std::vector<float> scratch_;  // penalised logits
  mutable std::vector<std::int32_t> order_;
  std::vector<float> probs_;
};

// Samples row i of `logits` (one row per sampler, `vocab` wide) with samplers[i]; results in out.
void sample_batch(ThreadPool& pool, std::span<Sampler* const> samplers, std::span<const float> logits, int vocab,
                  std::span<Token> out);

}  // namespace gdn
