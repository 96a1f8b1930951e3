// gdn info MODEL_DIR [--max-sequences N] [--max-context N] [--state-dtype f32|bf16] [--kv-dtype f32|bf16] [--backend cpu|cuda]
//                   [--max-batch-tokens N] [--max-rollback-tokens N] [--threads N]
//                   [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k] [--json]
//
// The architecture, the parameters and bytes by dtype, and the memory plan for the given context
// parameters (gdn/model/memory_plan.hpp), from config.json and the safetensors headers alone: no
// weight is mapped, read or packed, so it answers in well under a second for a 27B checkpoint on a
// machine that could not hold it.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "gdn/core/error.hpp"
#include "gdn/model/memory_plan.hpp"
#include "context_flags.hpp"
#include "load_flags.hpp"

namespace gdn::cli {
namespace {

std::string count(std::int64_t n) {
  const double v = static_cast<double>(n);
  if (v >= 1e9) return fmt::format("{:.2f} B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f} k", v / 1e3);
  return fmt::format("{}", n);
}

}  // namespace

int info(int argc, char** argv) {
  const auto usage = [] {
    std::fputs("usage: gdn info MODEL_DIR [--max-sequences N] [--max-context N] [--state-dtype f32|bf16] [--kv-dtype f32|bf16]\n"
               "                [--backend cpu|cuda] [--max-batch-tokens N] [--max-rollback-tokens N] [--threads N]\n"
               "                [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k] [--json]\n",
               stderr);
    return 2;
  };
  if (argc < 1) return usage();
  const std::string dir = argv[0];
  ContextParams cp;
  cp.max_sequences = 1;
  ModelParams mp;
  bool json_out = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (parse_load_flag(argc, argv, i, mp)) continue;
    if (a == "--max-sequences" && v) cp.max_sequences = std::atoi(argv[++i]);
    else if (a == "--max-context" && v) cp.max_context = std::atoi(argv[++i]);
    else if (a == "--max-batch-tokens" && v) cp.max_batch_tokens = std::atoi(argv[++i]);
    else if (a == "--max-rollback-tokens" && v) cp.max_rollback_tokens = std::atoi(argv[++i]);
    else if (a == "--threads" && v) cp.threads = std::atoi(argv[++i]);
    else if (a == "--json") json_out = true;
    else if (parse_context_flag(argc, argv, i, cp)) continue;
    else if (a == "--backend" && v) {
      const std::string_view s = argv[++i];
      if (s == "cpu") cp.backend = Backend::cpu;
      else if (s == "cuda") cp.backend = Backend::cuda;
      else throw Error(Status::invalid_argument, fmt::format("--backend: '{}' is not cpu or cuda", s));
    } else {
      return usage();
    }
  }
  const ModelInfo mi = inspect_model(dir, mp.load_mtp);
  const MemoryPlan plan = plan_memory(mi, cp, mp);
  const ModelConfig& c = mi.config;
  const CheckpointSummary& k = mi.checkpoint;
  if (json_out) {
    nlohmann::json dt = nlohmann::json::array();
    for (const auto& d : k.by_dtype)
      dt.push_back({{"dtype", std::string(dtype_name(d.dtype))}, {"tensors", d.tensors}, {"parameters", d.parameters}, {"bytes", d.bytes}});
    const nlohmann::json j = {{"architecture", c.architecture},
                              {"layers", c.num_layers},
                              {"gdn_layers", c.count_layers(LayerKind::linear_attention)},
                              {"attention_layers", c.count_layers(LayerKind::full_attention)},
                              {"hidden_size", c.hidden_size},
                              {"vocab_size", c.vocab_size},
                              {"mtp", k.has_mtp},
                              {"files", k.files.size()},
                              {"file_bytes", k.file_bytes},
                              {"tensors", k.tensors},
                              {"parameters", k.parameters},
                              {"bytes", k.bytes},
                              {"by_dtype", dt},
                              {"model_parameters", k.model_parameters},
                              {"model_bytes", k.model_bytes},
                              {"other_parameters", k.other_parameters},
                              {"plan", nlohmann::json::parse(plan.to_json())}};
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("architecture      {} ({})\n", c.architecture, c.model_type);
  fmt::print("layers            {} ({} gated deltanet, {} full attention)\n", c.num_layers,
             c.count_layers(LayerKind::linear_attention), c.count_layers(LayerKind::full_attention));
  fmt::print("hidden / ffn      {} / {}\n", c.hidden_size, c.intermediate_size);
  fmt::print("attention         {} q heads, {} kv heads, head_dim {}, rotary_dim {}, theta {}\n", c.num_attention_heads,
             c.num_key_value_heads, c.head_dim, c.rotary_dim, c.rope_theta);
  fmt::print("gated deltanet    {} key heads x {}, {} value heads x {}, conv kernel {}\n", c.linear_num_key_heads,
             c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim, c.linear_conv_kernel_dim);
  fmt::print("vocab             {} ({})\n", c.vocab_size, c.tie_word_embeddings ? "tied lm_head" : "untied lm_head");
  fmt::print("mtp head          {}\n", k.has_mtp ? "yes" : "no");
  fmt::print("checkpoint        {} file{}, {} tensors, {}\n", k.files.size(), k.files.size() == 1 ? "" : "s", k.tensors,
             format_bytes(k.file_bytes));
  std::string by;
  for (const auto& d : k.by_dtype)
    by += fmt::format("{}{} {} ({}, {} tensors)", by.empty() ? "" : "; ", dtype_name(d.dtype), count(d.parameters),
                      format_bytes(d.bytes), d.tensors);
  fmt::print("parameters        {} in all: {}\n", count(k.parameters), by);
  fmt::print("                  {} ({}) read by the model{}\n", count(k.model_parameters), format_bytes(k.model_bytes),
             k.other_tensors > 0 ? fmt::format("; {} in {} other tensors never read", count(k.other_parameters), k.other_tensors)
                                 : std::string());
  fmt::print("{}", plan.to_text());
  return 0;
}

}  // namespace gdn::cli
