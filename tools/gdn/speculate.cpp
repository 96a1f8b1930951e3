// gdn speculate MODEL_DIR [--prompts FILE] [--max-tokens N] [--k K]... [--threads N] [--json]
//                [--pack | --in-place | --image FILE]
//
// Measures MTP speculative decoding against plain decoding on the same prompts, greedy: checks
// that the tokens are identical, and reports per k the draft acceptance rate, tokens per main-model
// step and the wall-clock speedup (median over prompts). Prompts are lines of text (tokenized with
// the checkpoint's tokenizer.json); without --prompts a few built-in ones are used.

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

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int speculate(int argc, char** argv) {
  if (argc < 1) {
    std::fputs("usage: gdn speculate MODEL_DIR [--prompts FILE] [--max-tokens N] [--k K]... [--threads N] [--json]\n"
               "                     [--pack | --in-place | --image FILE]\n", stderr);
    return 2;
  }
  const std::string dir = argv[0];
  std::string prompts_file;
  int max_tokens = 64, threads = 0;
  bool json = false, fixed = false;
  std::vector<int> ks;
  ModelParams load;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (parse_load_flag(argc, argv, i, load)) continue;
    if (a == "--prompts" && v) prompts_file = argv[++i];
    else if (a == "--max-tokens" && v) max_tokens = std::stoi(argv[++i]);
    else if (a == "--k" && v) ks.push_back(std::stoi(argv[++i]));
    else if (a == "--threads" && v) threads = std::stoi(argv[++i]);
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
  // Warm-up, then the plain reference per prompt.
  gen.generate(prompts[0], plain);
  std::vector<GenerationResult> ref;
  for (const auto& p : prompts) ref.push_back(gen.generate(p, plain));

  struct Row {
    int k;
    bool adaptive;
    double acceptance, tokens_per_step, speedup;
    bool identical;
  };
  std::vector<Row> rows;
  for (const int k : ks) {
    for (const bool adaptive : fixed ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
      GenerationParams gp = plain;
      gp.mtp_draft = k;
      gp.mtp_adaptive = adaptive;
      std::vector<double> speedups;
      std::int64_t drafted = 0, accepted = 0, rounds = 0, generated = 0;
      bool identical = true;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        const auto r = gen.generate(prompts[i], gp);
        identical = identical && r.tokens == ref[i].tokens;
        speedups.push_back(ref[i].decode_seconds / std::max(r.decode_seconds, 1e-9) *
                           static_cast<double>(r.tokens.size()) / static_cast<double>(std::max<std::size_t>(ref[i].tokens.size(), 1)));
        drafted += r.speculative.drafted;
        accepted += r.speculative.accepted;
        rounds += r.speculative.rounds;
        generated += r.speculative.generated;
      }
      rows.push_back(Row{k, adaptive, drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0,
                         rounds ? static_cast<double>(generated) / static_cast<double>(rounds) : 0.0, median(speedups), identical});
    }
  }
  if (json) {
    fmt::print("{{\"model\": \"{}\", \"prompts\": {}, \"max_tokens\": {}, \"results\": [", dir, prompts.size(), max_tokens);
    for (std::size_t i = 0; i < rows.size(); ++i)
      fmt::print("{}{{\"k\": {}, \"adaptive\": {}, \"acceptance\": {:.4f}, \"tokens_per_step\": {:.3f}, \"speedup\": {:.3f}, "
                 "\"identical_to_plain\": {}}}",
                 i ? ", " : "", rows[i].k, rows[i].adaptive, rows[i].acceptance, rows[i].tokens_per_step, rows[i].speedup,
                 rows[i].identical);
    fmt::print("]}}\n");
  } else {
    fmt::print("MTP speculative decoding, greedy, {} prompts x {} tokens ({})\n", prompts.size(), max_tokens, dir);
    fmt::print("{:>3} {:>9} {:>11} {:>15} {:>16} {:>10}\n", "k", "adaptive", "acceptance", "tokens/step", "speedup (median)",
               "identical");
    for (const auto& r : rows)
      fmt::print("{:>3} {:>9} {:>10.1f}% {:>15.2f} {:>15.2f}x {:>10}\n", r.k, r.adaptive ? "yes" : "no", 100 * r.acceptance,
                 r.tokens_per_step, r.speedup, r.identical ? "yes" : "NO");
  }
  for (const auto& r : rows)
    if (!r.identical) return 1;
  return 0;
}

}  // namespace gdn::cli
