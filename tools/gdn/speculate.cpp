// gdn speculate MODEL_DIR [--prompts FILE] [--max-tokens N] [--k K]... [--repeats R] [--no-eos] [--fixed]
//                         [--threads N] [--json] [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]
//
// Measures MTP speculative decoding against plain decoding on the same prompts, greedy: checks that
// the tokens are identical, and reports per k the draft acceptance rate, tokens per main-model step
// and the decode speedup. Plain and speculative runs are interleaved — every speculative run has its
// own plain run right before or after it (alternating), on the same prompt — so that a machine whose
// speed drifts (other work on it, frequency changes) affects both alike; the speedup is the median of
// those paired ratios, with the interquartile range. A speculative round costs at least one
// main-model step, so a speedup above the tokens per step means the measurement is noise; it is
// flagged. Prompts are lines of text (tokenized with the checkpoint's tokenizer.json); without
// --prompts a few built-in ones are used.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "load_flags.hpp"
#include "gdn/gdn.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/generator.hpp"

namespace gdn::cli {
namespace {

// The q-quantile of v (linear between order statistics).
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto i = static_cast<std::size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

}  // namespace

int speculate(int argc, char** argv) {
  if (argc < 1) {
    std::fputs("usage: gdn speculate MODEL_DIR [--prompts FILE] [--max-tokens N] [--k K]... [--repeats R] [--no-eos] [--fixed]\n"
               "                     [--threads N] [--json] [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]\n",
               stderr);
    return 2;
  }
  const std::string dir = argv[0];
  std::string prompts_file;
  int max_tokens = 64, threads = 0, repeats = 5;
  bool json = false, fixed = false, no_eos = false;
  std::vector<int> ks;
  ModelParams load;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (parse_load_flag(argc, argv, i, load)) continue;
    if (a == "--prompts" && v) prompts_file = argv[++i];
    else if (a == "--max-tokens" && v) max_tokens = std::stoi(argv[++i]);
    else if (a == "--k" && v) ks.push_back(std::stoi(argv[++i]));
    else if (a == "--repeats" && v) repeats = std::max(1, std::stoi(argv[++i]));
    else if (a == "--threads" && v) threads = std::stoi(argv[++i]);
    else if (a == "--no-eos") no_eos = true;
    else if (a == "--fixed") fixed = true;
    else if (a == "--json") json = true;
    else {
      fmt::print(stderr, "gdn speculate: unknown argument '{}'\n", a);
      return 2;
    }
  }
  if (ks.empty()) ks = {1, 2, 3};
  std::vector<std::string> texts;
  if (!prompts_file.empty()) {
    std::ifstream in(prompts_file);
    if (!in) throw Error(Status::io_error, fmt::format("cannot read '{}'", prompts_file));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) texts.push_back(line);
  } else {
    texts = {"The capital of France is", "1 2 3 4 5 6 7 8", "Once upon a time", "def fibonacci(n):"};
  }
  const Tokenizer tok = Tokenizer::load((std::filesystem::path(dir) / "tokenizer.json").string());
  auto model = Model::load(dir, load);
  if (!model->has_mtp()) throw Error(Status::unsupported_model, fmt::format("'{}' has no MTP head", dir));
  const int max_k = *std::max_element(ks.begin(), ks.end());
  ContextParams cp;
  cp.max_sequences = 1;
  cp.max_context = 4096;
  cp.threads = threads;
  cp.max_rollback_tokens = max_k + 1;
  Context ctx(model, cp);
  Generator gen(ctx, tok, load_eos_token_ids(dir));

  std::vector<std::vector<Token>> prompts;
  for (const auto& t : texts) prompts.push_back(tok.encode(t));
  GenerationParams plain;
  plain.max_tokens = max_tokens;
  plain.stop_on_eos = !no_eos;
  gen.generate(prompts[0], plain);  // warm-up

  struct Row {
    int k;
    bool adaptive;
    double acceptance, tokens_per_step, median, p25, p75;
    std::size_t pairs;
    bool identical;
  };
  std::vector<Row> rows;
  for (const int k : ks) {
    for (const bool adaptive : fixed ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
      GenerationParams gp = plain;
      gp.mtp_draft = k;
      gp.mtp_adaptive = adaptive;
      std::vector<double> ratios;
      std::int64_t drafted = 0, accepted = 0, rounds = 0, generated = 0;
      bool identical = true;
      for (int rep = 0; rep < repeats; ++rep)
        for (std::size_t i = 0; i < prompts.size(); ++i) {
          // Alternate which of the pair runs first, so neither always gets the warmer machine.
          GenerationResult p, s;
          if ((rep + i) % 2 == 0) {
            p = gen.generate(prompts[i], plain);
            s = gen.generate(prompts[i], gp);
          } else {
            s = gen.generate(prompts[i], gp);
            p = gen.generate(prompts[i], plain);
          }
          identical = identical && s.tokens == p.tokens;
          if (p.tokens.size() > 1 && s.decode_seconds > 0) ratios.push_back(p.decode_seconds / s.decode_seconds);
          drafted += s.speculative.drafted;
          accepted += s.speculative.accepted;
          rounds += s.speculative.rounds;
          generated += s.speculative.generated;
        }
      rows.push_back(Row{k, adaptive, drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0,
                         rounds ? static_cast<double>(generated) / static_cast<double>(rounds) : 0.0, quantile(ratios, 0.5),
                         quantile(ratios, 0.25), quantile(ratios, 0.75), ratios.size(), identical});
    }
  }
  // A round is at least one main step: a median speedup above the tokens per step is noise.
  const auto plausible = [](const Row& r) { return r.median <= std::max(1.0, r.tokens_per_step) * 1.05; };
  if (json) {
    fmt::print("{{\"model\": \"{}\", \"prompts\": {}, \"max_tokens\": {}, \"repeats\": {}, \"results\": [", dir, prompts.size(),
               max_tokens, repeats);
    for (std::size_t i = 0; i < rows.size(); ++i)
      fmt::print("{}{{\"k\": {}, \"adaptive\": {}, \"acceptance\": {:.4f}, \"tokens_per_step\": {:.3f}, \"speedup\": {:.3f}, "
                 "\"speedup_p25\": {:.3f}, \"speedup_p75\": {:.3f}, \"pairs\": {}, \"plausible\": {}, \"identical_to_plain\": {}}}",
                 i ? ", " : "", rows[i].k, rows[i].adaptive, rows[i].acceptance, rows[i].tokens_per_step, rows[i].median,
                 rows[i].p25, rows[i].p75, rows[i].pairs, plausible(rows[i]), rows[i].identical);
    fmt::print("]}}\n");
  } else {
    fmt::print("MTP speculative decoding, greedy, {} prompts x {} tokens x {} repeats, plain and speculative interleaved ({})\n",
               prompts.size(), max_tokens, repeats, dir);
    fmt::print("{:>3} {:>9} {:>11} {:>12} {:>17} {:>17} {:>10}\n", "k", "adaptive", "acceptance", "tokens/step",
               "decode speedup", "(p25 - p75)", "identical");
    for (const auto& r : rows)
      fmt::print("{:>3} {:>9} {:>10.1f}% {:>12.2f} {:>16.2f}x {:>8.2f} - {:<6.2f} {:>10}{}\n", r.k, r.adaptive ? "yes" : "no",
                 100 * r.acceptance, r.tokens_per_step, r.median, r.p25, r.p75, r.identical ? "yes" : "NO",
                 plausible(r) ? "" : "   (above tokens/step: timing noise, rerun on a quiet machine)");
    fmt::print("speedup: median over {} paired runs of plain decode time / speculative decode time (same prompt, same tokens)\n",
               rows.empty() ? 0 : rows.front().pairs);
  }
  for (const auto& r : rows)
    if (!r.identical) return 1;
  return 0;
}

}  // namespace gdn::cli
