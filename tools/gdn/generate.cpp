// gdn generate MODEL_DIR --prompt TEXT [--chat] [--think] [--system TEXT] [--temp T] [--top-k K]
//              [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [--max-tokens N]
//              [--stop STRING]... [--mtp K] [--threads N] [--bf16-inputs] [--state-dtype f32|bf16]
//              [--kv-dtype f32|bf16] [--backend cpu|cuda]
//              [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]   (the CPU backend's weights; CUDA uploads its own copy)
//
// Streams the generated text to stdout as it is produced; the model-loading progress bar and the
// prefill / decode speeds go to stderr, so stdout is clean text.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "commands.hpp"
#include "context_flags.hpp"
#include "load_flags.hpp"
#include "gdn/gdn.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/generator.hpp"
#include "gdn/text/chat_template.hpp"

namespace gdn::cli {
namespace {

int usage() {
  std::fputs(
      "usage: gdn generate MODEL_DIR --prompt TEXT [--chat] [--think] [--system TEXT]\n"
      "                    [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
      "                    [--seed S] [--max-tokens N] [--stop STRING]... [--mtp K] [--threads N]\n"
      "                    [--bf16-inputs] [--state-dtype f32|bf16] [--kv-dtype f32|bf16] [--backend cpu|cuda]\n"
      "                    [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]\n"
      "  --chat      wrap the prompt in the model's chat template (stops at <|im_end|>)\n"
      "  --think     with --chat, leave thinking on (default: off)\n"
      "  --temp 0    greedy (the default); > 0 samples\n"
      "  --mtp K     speculative decoding with the checkpoint's MTP head, up to K drafts per step\n"
      "  --bf16-inputs  round activations to bf16 before each projection (faster prefill on AVX-512-BF16)\n"
      "  --kv-dtype  the KV cache's element type (CPU default f32; bf16 halves it and its read at long context)\n"
      "  --backend   cpu (default) or cuda (an NVIDIA GPU: bf16 activations, see docs/cuda.md)\n",
      stderr);
  return 2;
}

void progress_bar(std::size_t done, std::size_t total) {
  if (total == 0 || !::isatty(STDERR_FILENO)) return;
  const int width = 30;
  const int filled = static_cast<int>(width * static_cast<double>(done) / static_cast<double>(total));
  fmt::print(stderr, "\rloading [{}{}] {:5.1f}% of {:.1f} MiB", std::string(static_cast<std::size_t>(filled), '#'),
             std::string(static_cast<std::size_t>(width - filled), ' '), 100.0 * static_cast<double>(done) / static_cast<double>(total),
             static_cast<double>(total) / (1 << 20));
  if (done == total) fmt::print(stderr, "\n");
}

}  // namespace

int generate(int argc, char** argv) {
  if (argc < 1) return usage();
  const std::string dir = argv[0];
  std::string prompt, system;
  bool chat = false, think = false;
  GenerationParams gp;
  gp.max_tokens = 128;
  int threads = 0;
  MatmulInput matmul_input = MatmulInput::float32;
  ModelParams load_flags;
  std::optional<DType> state_dtype, kv_dtype;
  Backend backend = Backend::cpu;
  for (int i = 1; i < argc; ++i) {
    if (parse_load_flag(argc, argv, i, load_flags)) continue;
    if (parse_context_flag(argc, argv, i, state_dtype, kv_dtype)) continue;
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--prompt" && v) prompt = argv[++i];
    else if (a == "--system" && v) system = argv[++i];
    else if (a == "--chat") chat = true;
    else if (a == "--think") think = true;
    else if (a == "--temp" && v) gp.sampling.temperature = std::stof(argv[++i]);
    else if (a == "--top-k" && v) gp.sampling.top_k = std::stoi(argv[++i]);
    else if (a == "--top-p" && v) gp.sampling.top_p = std::stof(argv[++i]);
    else if (a == "--min-p" && v) gp.sampling.min_p = std::stof(argv[++i]);
    else if (a == "--repeat-penalty" && v) gp.sampling.repetition_penalty = std::stof(argv[++i]);
    else if (a == "--seed" && v) gp.sampling.seed = std::stoull(argv[++i]);
    else if (a == "--max-tokens" && v) gp.max_tokens = std::stoi(argv[++i]);
    else if (a == "--stop" && v) gp.stop_strings.emplace_back(argv[++i]);
    else if (a == "--mtp" && v) gp.mtp_draft = std::stoi(argv[++i]);
    else if (a == "--threads" && v) threads = std::stoi(argv[++i]);
    else if (a == "--bf16-inputs") matmul_input = MatmulInput::bf16;
    else if (a == "--backend" && v) backend = parse_backend(argv[++i]);
    else return usage();
  }
  if (prompt.empty()) return usage();

  const std::string tok_path = (std::filesystem::path(dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(tok_path))
    throw Error(Status::io_error, fmt::format("'{}' has no tokenizer.json; gdn generate needs one", dir));
  const Tokenizer tok = Tokenizer::load(tok_path);
  ModelParams mp = load_flags;  // --pack / --in-place / --image / --quant
  mp.backend = backend;
  mp.progress = progress_bar;  // packing (or uploading) the weights reads them all
  auto model = Model::load(dir, mp);
  if (backend == Backend::cpu) model->prefetch(progress_bar);  // reads them when they were not packed

  std::string text = prompt;
  if (chat) {
    std::vector<ChatMessage> msgs;
    if (!system.empty()) msgs.push_back({"system", system, std::nullopt});
    msgs.push_back({"user", prompt, std::nullopt});
    ChatOptions opt;
    opt.add_generation_prompt = true;
    opt.enable_thinking = think;
    text = render_chat(msgs, opt);
    if (const auto im_end = tok.token_to_id("<|im_end|>")) gp.stop_tokens.push_back(*im_end);
  }
  const std::vector<Token> ids = tok.encode(text);
  for (const Token t : ids)
    if (t >= model->config().vocab_size)
      throw Error(Status::invalid_token, fmt::format("the tokenizer produced id {} outside the model's vocabulary of {}", t,
                                                     model->config().vocab_size));

  ContextParams cp;
  cp.max_sequences = 1;
  cp.max_context = static_cast<int>(ids.size()) + gp.max_tokens + gp.mtp_draft + 2;
  cp.threads = threads;
  cp.matmul_input = matmul_input;
  cp.state_dtype = state_dtype;
  cp.kv_dtype = kv_dtype;
  cp.backend = backend;
  cp.max_rollback_tokens = gp.mtp_draft > 0 ? gp.mtp_draft + 1 : 0;
  cp.max_batch_tokens = std::max(256, cp.max_rollback_tokens);
  Context ctx(model, cp);
  Generator gen(ctx, tok, load_eos_token_ids(dir));
  const GenerationResult r = gen.generate(ids, gp, [](std::size_t, std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double prefill_tps = static_cast<double>(r.prompt_tokens) / std::max(r.prefill_seconds, 1e-9);
  const double decode_tps = static_cast<double>(r.tokens.size() > 1 ? r.tokens.size() - 1 : 0) / std::max(r.decode_seconds, 1e-9);
  fmt::print(stderr, "[{} prompt tokens, {:.1f} tokens/s prefill | {} generated, {:.1f} tokens/s decode | finish: {}",
             r.prompt_tokens, prefill_tps, r.tokens.size(), decode_tps, finish_reason_name(r.finish));
  if (gp.mtp_draft > 0)
    fmt::print(stderr, " | mtp: {:.0f}% of drafts accepted, {:.2f} tokens/step, k now {}", 100.0 * r.speculative.acceptance_rate(),
               r.speculative.tokens_per_round(), r.speculative.k);
  fmt::print(stderr, "]\n");
  return 0;
}

}  // namespace gdn::cli
