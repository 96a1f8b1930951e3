#include "gdn/runtime/generator.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/core/error.hpp"

namespace gdn {
namespace {

using Clock = std::chrono::steady_clock;

// One sequence's text pipeline: stream-decode, hold back what might be the start of a stop
// string, cut at the first stop string.
class TextTracker {
 public:
  TextTracker(const Tokenizer& tok, const std::vector<std::string>& stops) : decoder_(tok, true, true), stops_(stops) {
    for (const auto& s : stops_) longest_ = std::max(longest_, s.size());
  }

  // Adds a token's text; returns true when a stop string completed. `out` gets the newly final text.
  bool push(Token t, std::string& out) { return feed(decoder_.push(t), out, false); }
  // The end: everything still held is final.
  void finish(std::string& out) { feed(decoder_.flush(), out, true); }

 private:
  bool feed(const std::string& piece, std::string& out, bool final) {
    all_ += piece;
    out.clear();
    if (!stops_.empty()) {
      const std::size_t from = emitted_ > longest_ ? emitted_ - longest_ : 0;
      std::size_t hit = std::string::npos;
      for (const auto& s : stops_) {
        if (s.empty()) continue;
        const std::size_t p = all_.find(s, from);
        if (p != std::string::npos && p + s.size() > emitted_) hit = std::min(hit, p);
      }
      if (hit != std::string::npos) {
        if (hit > emitted_) out = all_.substr(emitted_, hit - emitted_);
        emitted_ = all_.size();
        return true;
      }
    }
    std::size_t end = all_.size();
    if (!final) {
      // Hold back the longest suffix that is a proper prefix of a stop string.
      for (const auto& s : stops_)
        for (std::size_t n = std::min(s.size() - 1, all_.size()); n > 0; --n)
          if (all_.compare(all_.size() - n, n, s, 0, n) == 0) {
            end = std::min(end, all_.size() - n);
            break;
          }
    }
    if (end > emitted_) {
      out = all_.substr(emitted_, end - emitted_);
      emitted_ = end;
    }
    return false;
  }

  StreamDecoder decoder_;
  const std::vector<std::string>& stops_;
  std::size_t longest_ = 0;
  std::string all_;
  std::size_t emitted_ = 0;
};

struct Active {
  SeqId seq = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextTracker> text;
  const GenerationParams* params = nullptr;
  GenerationResult* result = nullptr;
  bool done = false;
};

void collect_eos(const nlohmann::json& v, std::vector<Token>& out) {
  if (v.is_number_integer()) out.push_back(v.get<Token>());
  else if (v.is_array())
    for (const auto& e : v)
      if (e.is_number_integer()) out.push_back(e.get<Token>());
}

}  // namespace

std::string_view finish_reason_name(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop_token: return "stop_token";
    case FinishReason::stop_string: return "stop_string";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

std::vector<Token> load_eos_token_ids(const std::string& model_dir) {
  std::vector<Token> eos;
  for (const char* name : {"config.json", "generation_config.json"}) {
    const auto path = std::filesystem::path(model_dir) / name;
    std::ifstream in(path);
    if (!in) continue;
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    if (j.contains("eos_token_id")) collect_eos(j["eos_token_id"], eos);
    if (j.contains("text_config") && j["text_config"].is_object() && j["text_config"].contains("eos_token_id"))
      collect_eos(j["text_config"]["eos_token_id"], eos);
  }
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());
  return eos;
}

Generator::Generator(Context& ctx, const Tokenizer& tokenizer, std::vector<Token> eos)
    : ctx_(ctx), tok_(tokenizer), eos_(std::move(eos)) {}

GenerationResult Generator::generate(std::span<const Token> prompt, const GenerationParams& params, const TextCallback& on_text) {
  const std::vector<Token> p(prompt.begin(), prompt.end());
  return generate(std::span(&p, 1), std::span(&params, 1), on_text).front();
}

std::vector<GenerationResult> Generator::generate(std::span<const std::vector<Token>> prompts,
                                                  std::span<const GenerationParams> params, const TextCallback& on_text) {
  if (prompts.size() != params.size())
    throw Error(Status::invalid_argument, "generate: one GenerationParams per prompt");
  const int V = ctx_.model().config().vocab_size;
  const int k = params.empty() ? 0 : params[0].mtp_draft;
  for (const auto& gp : params) {
    if (gp.max_tokens < 1) throw Error(Status::invalid_argument, fmt::format("generate: max_tokens must be >= 1, got {}", gp.max_tokens));
    if (gp.mtp_draft != k) throw Error(Status::invalid_argument, "generate: all sequences of one call share mtp_draft");
  }
  for (const auto& pr : prompts)
    if (pr.empty()) throw Error(Status::invalid_argument, "generate: a prompt is empty");

  std::vector<GenerationResult> results(prompts.size());
  std::vector<Active> act(prompts.size());
  // Create every sequence first, so running out of slots fails before any work.
  std::vector<SeqId> created;
  try {
    for (std::size_t i = 0; i < prompts.size(); ++i) created.push_back(ctx_.create_sequence());
  } catch (...) {
    for (const SeqId s : created) ctx_.free_sequence(s);
    throw;
  }
  struct Cleanup {
    Context& ctx;
    std::vector<SeqId>& ids;
    ~Cleanup() {
      for (const SeqId s : ids) ctx.free_sequence(s);
    }
  } cleanup{ctx_, created};

  for (std::size_t i = 0; i < prompts.size(); ++i) {
    act[i].seq = created[i];
    act[i].sampler = std::make_unique<Sampler>(params[i].sampling, V);
    act[i].text = std::make_unique<TextTracker>(tok_, params[i].stop_strings);
    act[i].params = &params[i];
    act[i].result = &results[i];
    results[i].prompt_tokens = static_cast<std::int64_t>(prompts[i].size());
  }

  std::string piece;
  // Takes one generated token; returns true when the sequence is finished.
  const auto take = [&](std::size_t i, Token t) {
    Active& a = act[i];
    GenerationResult& r = *a.result;
    r.tokens.push_back(t);
    const bool is_stop = (a.params->stop_on_eos && std::find(eos_.begin(), eos_.end(), t) != eos_.end()) ||
                         std::find(a.params->stop_tokens.begin(), a.params->stop_tokens.end(), t) != a.params->stop_tokens.end();
    FinishReason fin = FinishReason::none;
    if (is_stop) {
      fin = FinishReason::stop_token;
      a.text->finish(piece);
    } else if (a.text->push(t, piece)) {
      fin = FinishReason::stop_string;
    } else if (static_cast<int>(r.tokens.size()) >= a.params->max_tokens) {
      fin = FinishReason::length;
      std::string rest;
      a.text->finish(rest);
      piece += rest;
    }
    if (!piece.empty()) {
      r.text += piece;
      if (on_text && !on_text(i, piece) && fin == FinishReason::none) fin = FinishReason::cancelled;
    }
    if (fin != FinishReason::none) {
      r.finish = fin;
      a.done = true;
    }
    return a.done;
  };

  const auto t0 = Clock::now();
  std::vector<Token> first(prompts.size());
  std::unique_ptr<SpeculativeDecoder> spec;
  if (k > 0) {
    spec = std::make_unique<SpeculativeDecoder>(ctx_, SpeculativeParams{k, params[0].mtp_adaptive});
    for (std::size_t i = 0; i < prompts.size(); ++i) first[i] = spec->start(act[i].seq, prompts[i], *act[i].sampler);
  } else {
    Batch b;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      act[i].sampler->observe(prompts[i]);
      b.add(act[i].seq, prompts[i], LogitsFor::last);
    }
    ctx_.step(b);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      first[i] = act[i].sampler->sample(ctx_.logits(b.last_row(i)));
      act[i].sampler->observe(first[i]);
    }
  }
  const auto t1 = Clock::now();
  for (std::size_t i = 0; i < prompts.size(); ++i) take(i, first[i]);

  std::vector<SeqId> live;
  std::vector<std::size_t> index;
  std::vector<std::vector<Token>> produced(prompts.size());
  std::vector<std::vector<Token>*> outs;
  Batch b;
  for (;;) {
    live.clear();
    index.clear();
    for (std::size_t i = 0; i < act.size(); ++i)
      if (!act[i].done) {
        live.push_back(act[i].seq);
        index.push_back(i);
      }
    if (live.empty()) break;
    if (spec) {
      outs.clear();
      for (const std::size_t i : index) {
        produced[i].clear();
        outs.push_back(&produced[i]);
      }
      spec->advance(live, outs);
      for (const std::size_t i : index)
        for (const Token t : produced[i])
          if (take(i, t)) break;
    } else {
      b.clear();
      for (const std::size_t i : index) b.add(act[i].seq, act[i].result->tokens.back(), LogitsFor::last);
      ctx_.step(b);
      for (std::size_t j = 0; j < index.size(); ++j) {
        const std::size_t i = index[j];
        const Token t = act[i].sampler->sample(ctx_.logits(b.last_row(j)));
        act[i].sampler->observe(t);
        take(i, t);
      }
    }
  }
  const auto t2 = Clock::now();
  for (auto& r : results) {
    r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    r.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
    if (spec) r.speculative = spec->stats();
  }
  return results;
}

}  // namespace gdn
