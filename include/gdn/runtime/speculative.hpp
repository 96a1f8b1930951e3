#pragma once
// MTP speculative decoding on top of a Context.
//
// Each round, per sequence: the MTP head drafts k tokens (chained: every draft step feeds the
// previous step's post-mtp.norm hidden state and the drafted token, at the next position; the MTP
// layer keeps its own KV cache); one main-model step verifies [pending, d1..dk]; the longest
// agreeing prefix is accepted (greedy), or each draft is accepted with probability min(1, p/q) and
// the first rejection resampled from max(0, p − q) (temperature > 0: the output distribution is
// exactly that of plain sampling); the rejected tokens are rolled back exactly (Context::rollback),
// and the MTP layer is caught up on the accepted positions with the main model's hidden states.
//
// Greedy speculative decoding yields bit-identical tokens to plain greedy decoding with a float32
// state: verification runs the same per-token code as single-token steps.
//
// Adaptive k: acceptance and the wall time of rounds at each k are measured as decoding goes, and
// k is chosen to maximise tokens per second — down to k = 0, plain decoding, when drafting does not
// pay (the MTP layer is then caught up in batches, which costs almost nothing).
// Thread safety: a SpeculativeDecoder drives one Context and has its Context's rule: one thread at a time.

#include <chrono>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "gdn/runtime/context.hpp"
#include "gdn/runtime/sampling.hpp"

namespace gdn {

struct SpeculativeParams {
  int max_draft = 3;     // k: drafted tokens per round, at most
  bool adaptive = true;  // choose k in [0, max_draft] by measured speed; else always max_draft
};

struct SpeculativeStats {
  std::int64_t rounds = 0;      // verify steps (and plain steps when k = 0)
  std::int64_t drafted = 0;     // draft tokens proposed
  std::int64_t accepted = 0;    // draft tokens accepted
  std::int64_t generated = 0;   // tokens produced
  std::int64_t draft_rounds = 0;
  int k = 0;                    // the current draft length
  double acceptance_rate() const { return drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0; }
  double tokens_per_round() const { return rounds ? static_cast<double>(generated) / static_cast<double>(rounds) : 0.0; }
};

// The speculative sampling rule for one draft token d drawn from the draft distribution q, against
// the target distribution p: accepted when u < p(d)/q(d) (u uniform in [0, 1)); otherwise
// `residual` receives max(0, p − q), renormalised (p itself if that is empty), from which the
// replacement is drawn. Whatever q is, the token that results is distributed exactly as p.
bool accept_draft(std::span<const float> p, std::span<const float> q, Token d, double u, std::span<float> residual);

class SpeculativeDecoder {
 public:
  // The context's model must have an MTP head and its max_rollback_tokens must be >= max_draft + 1.
  SpeculativeDecoder(Context& ctx, const SpeculativeParams& params);

  // Prefills `prompt` on a fresh sequence, catches the MTP layer up on it, and samples the first
  // token with `sampler` (which must outlive the sequence's use here). The returned token is
  // pending: the next advance() feeds it to the model.
  Token start(SeqId seq, std::span<const Token> prompt, Sampler& sampler);

  // One round for every sequence in `seqs` (all started): appends 1..k+1 new tokens per sequence
  // to out[i]. The last appended token is the new pending one.
  void advance(std::span<const SeqId> seqs, std::span<std::vector<Token>* const> out);

  // Stops tracking `seq` (the sequence itself stays in the context).
  void finish(SeqId seq);

  const SpeculativeStats& stats() const noexcept { return stats_; }

 private:
  struct SeqState {
    Sampler* sampler = nullptr;
    Token pending = 0;
    // MTP inputs not yet fed: (hidden of position t, token at t + 1) for consecutive t.
    std::vector<float> pair_hidden;
    std::vector<Token> pair_tokens;
    // This round's drafts and their distributions.
    std::vector<Token> drafts;
    std::vector<float> draft_probs;  // k × V
    std::vector<float> chain_hidden; // H
  };

  int choose_k();
  void record_round(int k, double seconds, std::int64_t drafted, std::int64_t accepted);
  void flush_mtp(std::span<const SeqId> seqs, std::size_t min_pairs, bool want_logits);

  Context& ctx_;
  SpeculativeParams params_;
  int V_ = 0, H_ = 0;
  std::unordered_map<SeqId, SeqState> seqs_;
  SpeculativeStats stats_;
  // Adaptive k: acceptance rate per draft token, and round time per k (exponential averages).
  double alpha_ = 0.7;
  std::vector<double> round_seconds_;  // per k; < 0: not measured yet
  std::int64_t rounds_since_explore_ = 0;
  Batch batch_;
  std::vector<float> hidden_in_, probs_;
};

}  // namespace gdn
