// The gdn command-line tool.
//
//   gdn info MODEL_DIR [...]                             architecture, parameters, memory plan (info.cpp)
//   gdn logits MODEL_DIR --tokens 1,2,3 [--out F.npy]    logits of every prompt position
//   gdn pack MODEL_DIR [--out FILE]                      the packed weight image loading maps (pack.cpp)
//   gdn make-checkpoint --shape S [--sparse] DIR         a checkpoint of a real model's shapes (checkpoints.cpp)
//   gdn generate MODEL_DIR --prompt TEXT [...]           streamed text (see generate.cpp)
//   gdn speculate MODEL_DIR [...]                        MTP speculative decoding figures (speculate.cpp)
//   gdn doctor MODEL_DIR [--json] [--quick]              self-check; exit status 1 on any FAIL (see doctor.cpp)
//   gdn serve MODEL_DIR [--port N] [...]                 OpenAI-compatible HTTP server (see serve.cpp)
//   gdn bench [...]                                      CPU benchmark vs roofline and llama.cpp (bench.cpp;
//                                                        runs the gdn-bench program installed next to gdn)
//
// `gdn logits` is a stable contract used by external checks: without --out it prints one line per
// prompt position with vocab_size space-separated values; with --out it writes a float32 .npy of
// shape [T, vocab_size].

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "gdn/gdn.hpp"
#include "gdn/io/npy.hpp"
#include "checkpoints.hpp"
#include "commands.hpp"
#include "context_flags.hpp"
#include "load_flags.hpp"
#include "run_stats.hpp"

namespace {

int usage() {
  std::fputs(
      "usage:\n"
      "  gdn info MODEL_DIR [--max-sequences N] [--max-context N] [--state-dtype f32|bf16] [--kv-dtype f32|bf16]\n"
      "                    [--backend cpu|cuda] [--json]\n"
      "  gdn logits MODEL_DIR --tokens ID,ID,... [--out FILE.npy] [--threads N] [--state-dtype f32|bf16] [--kv-dtype f32|bf16]\n"
      "                      [--stats] [--backend cpu|cuda]\n"
      "  gdn pack MODEL_DIR [--out FILE]   the packed weight image (then mapped by every load)\n"
      "  gdn make-checkpoint --shape 0.8b|2b|27b|tiny [--sparse] [--shards N] DIR\n"
      "  (every command that loads a model takes --pack | --in-place | --image FILE: the CPU backend's weights,\n"
      "   and --quant q8_0|q4_0|q4_k|q4_k_m [--lm-head-quant auto|q8_0|q4_0|q4_k]: block-quantised projections, the lm_head at q8_0\n"
      "   under the 4-bit quants unless told; --backend cuda uploads its own copy to the device and ignores them)\n"
      "  gdn generate MODEL_DIR --prompt TEXT [--chat] [--temp T] [--top-p P] [--seed S] [--max-tokens N] [--mtp K]\n"
      "                        [--backend cpu|cuda]\n"
      "  gdn speculate MODEL_DIR [--prompts FILE] [--k K]...   MTP acceptance and speedup vs plain decoding\n"
      "  gdn doctor MODEL_DIR [--json] [--quick] [--threads N] [--backend cpu|cuda]\n"
      "  gdn serve MODEL_DIR [--host H] [--port N] [--api-key K] [--max-sequences N] [--cache-bytes B] [--mtp K]\n"
      "                    [--backend cpu|cuda]\n"
      "  gdn bench [--shape 0.8b|2b|27b | --model DIR] [--backend cpu|cuda] [--quick] [--json FILE] (see bench.cpp)\n",
      stderr);
  return 2;
}

std::vector<gdn::Token> parse_tokens(std::string_view s) {
  std::vector<gdn::Token> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    const std::string_view part = s.substr(0, comma);
    gdn::Token v = 0;
    const auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || p != part.data() + part.size())
      throw gdn::Error(gdn::Status::invalid_argument, fmt::format("--tokens: '{}' is not an integer", part));
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  if (out.empty()) throw gdn::Error(gdn::Status::invalid_argument, "--tokens: no token ids given");
  return out;
}

int cmd_logits(const std::string& dir, int argc, char** argv) {
  std::vector<gdn::Token> tokens;
  std::string out;
  gdn::ContextParams p;
  p.max_sequences = 1;
  gdn::ModelParams load;
  bool stats = false;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    if (gdn::cli::parse_load_flag(argc, argv, i, load)) continue;
    if (a == "--stats") stats = true;
    else if (a == "--tokens" && has_value) tokens = parse_tokens(argv[++i]);
    else if (a == "--out" && has_value) out = argv[++i];
    else if (a == "--threads" && has_value) p.threads = std::atoi(argv[++i]);
    else if (a == "--backend" && has_value) load.backend = p.backend = gdn::cli::parse_backend(argv[++i]);
    else if (gdn::cli::parse_context_flag(argc, argv, i, p)) continue;
    else return usage();
  }
  if (tokens.empty()) return usage();
  const auto t0 = std::chrono::steady_clock::now();
  auto model = gdn::Model::load(dir, load);
  const auto t1 = std::chrono::steady_clock::now();
  p.max_context = static_cast<int>(tokens.size());
  p.max_logits_rows = static_cast<int>(tokens.size());
  gdn::Context ctx(model, p);
  const gdn::SeqId seq = ctx.create_sequence();
  gdn::Batch batch;
  batch.add(seq, tokens, gdn::LogitsFor::all);
  const auto t2 = std::chrono::steady_clock::now();
  ctx.step(batch);
  if (stats) gdn::cli::print_run_stats(*model, t0, t1, t2, std::chrono::steady_clock::now());
  const auto V = static_cast<std::size_t>(model->config().vocab_size);
  if (!out.empty()) {
    std::vector<float> all;
    all.reserve(tokens.size() * V);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      const auto row = ctx.logits(static_cast<std::int64_t>(t));
      all.insert(all.end(), row.begin(), row.end());
    }
    gdn::io::write_npy(out, all, {static_cast<std::int64_t>(tokens.size()), static_cast<std::int64_t>(V)});
    fmt::print(stderr, "wrote {} x {} logits to {}\n", tokens.size(), V, out);
    return 0;
  }
  std::string line;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    line.clear();
    for (const float v : ctx.logits(static_cast<std::int64_t>(t))) fmt::format_to(std::back_inserter(line), "{}{:.6g}", line.empty() ? "" : " ", v);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
  }
  return 0;
}

// `gdn bench` is the gdn-bench program (bench_main.cpp), found next to this one and executed in its
// place: it counts heap allocations with a replacement operator new, which must not be linked into
// the commands above (alloc_count.cpp says why).
int exec_bench(char** argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string bench = (ec ? std::filesystem::path(argv[0]) : self).parent_path() / "gdn-bench";
  std::vector<char*> args = {const_cast<char*>(bench.c_str())};
  for (char** a = argv + 2; *a != nullptr; ++a) args.push_back(*a);
  args.push_back(nullptr);
  ::execv(bench.c_str(), args.data());
  fmt::print(stderr, "gdn bench: cannot run {}: {} (it is built and installed with gdn)\n", bench, std::strerror(errno));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 && !(argc == 2 && std::string_view(argv[1]) == "bench")) return usage();
  const std::string_view cmd = argv[1];
  try {
    if (cmd == "info") return gdn::cli::info(argc - 2, argv + 2);
    if (cmd == "pack") return gdn::cli::pack(argc - 2, argv + 2);
    if (cmd == "make-checkpoint") return gdn::cli::make_checkpoint_command(argc - 2, argv + 2);
    if (cmd == "logits") return cmd_logits(argv[2], argc - 3, argv + 3);
    if (cmd == "generate") return gdn::cli::generate(argc - 2, argv + 2);
    if (cmd == "speculate") return gdn::cli::speculate(argc - 2, argv + 2);
    if (cmd == "doctor") return gdn::cli::doctor(argc - 2, argv + 2);
    if (cmd == "serve") return gdn::cli::serve(argc - 2, argv + 2);
    if (cmd == "bench") return exec_bench(argv);
    return usage();
  } catch (const gdn::Error& e) {
    fmt::print(stderr, "gdn {}: error ({}): {}\n", cmd, gdn::status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdn {}: error: {}\n", cmd, e.what());
    return 1;
  }
}
