#pragma once
// Text generation on top of a Context: prompt ids in, streamed text out, with per-sequence
// sampling, stop tokens (the model's eos ids from config.json and generation_config.json, plus any
// extra), stop strings that may span several tokens (nothing after a stop string is emitted), a
// token limit, the finish reason, and optional MTP speculative decoding. Several prompts may be
// generated together: each step advances all unfinished sequences at once.
// Thread safety: a Generator drives one Context and has its Context's rule: one thread at a time.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/context.hpp"
#include "gdn/runtime/sampling.hpp"
#include "gdn/runtime/speculative.hpp"

namespace gdn {

enum class FinishReason : int { none = 0, stop_token = 1, stop_string = 2, length = 3, cancelled = 4 };

std::string_view finish_reason_name(FinishReason r) noexcept;

struct GenerationParams {
  SamplingParams sampling;
  int max_tokens = 256;
  bool stop_on_eos = true;                // the model's eos ids
  std::vector<Token> stop_tokens;         // in addition to eos
  std::vector<std::string> stop_strings;  // matched in the decoded text, across token boundaries
  int mtp_draft = 0;                      // > 0: MTP speculative decoding with up to this many drafts
  bool mtp_adaptive = true;               // let the decoder lower k (to 0) when drafting does not pay
};

struct GenerationResult {
  std::vector<Token> tokens;  // generated ids (a stop token included)
  std::string text;           // the emitted text: special tokens skipped, cut before a stop string
  FinishReason finish = FinishReason::none;
  std::int64_t prompt_tokens = 0;
  double prefill_seconds = 0.0;  // prompt processing (shared by all sequences of a batch)
  double decode_seconds = 0.0;   // everything after the first token
  SpeculativeStats speculative;  // when mtp_draft > 0
};

// Receives each piece of text as soon as it is final (never half a UTF-8 character, never a
// prefix of a stop string that might still complete). Return false to stop that sequence.
using TextCallback = std::function<bool(std::size_t sequence, std::string_view text)>;

// eos ids of a checkpoint directory: config.json (top level and text_config) and
// generation_config.json, deduplicated.
std::vector<Token> load_eos_token_ids(const std::string& model_dir);

class Generator {
 public:
  // The context must have room for the sequences (max_sequences) and their lengths; for MTP it
  // needs max_rollback_tokens >= mtp_draft + 1. `eos` usually comes from load_eos_token_ids().
  Generator(Context& ctx, const Tokenizer& tokenizer, std::vector<Token> eos);

  GenerationResult generate(std::span<const Token> prompt, const GenerationParams& params, const TextCallback& on_text = {});
  std::vector<GenerationResult> generate(std::span<const std::vector<Token>> prompts, std::span<const GenerationParams> params,
                                         const TextCallback& on_text = {});

 private:
  Context& ctx_;
  const Tokenizer& tok_;
  std::vector<Token> eos_;
};

}  // namespace gdn
