// gdn doctor, part 1: what the files say. config.json against what libgdn reads, the tensors against
// what the config implies, and the fingerprints a checkpoint's conventions leave in its weights.

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include "doctor_impl.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/io/safetensors.hpp"

namespace gdn::detail {
namespace {

using nlohmann::json;
namespace lim = doctor_limits;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Status::io_error, fmt::format("cannot read '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Config keys, by what libgdn does with them (src/config.cpp is the authority on "read").
const std::set<std::string, std::less<>> read_top = {"architectures", "model_type", "text_config",
                                                     "tie_word_embeddings", "eos_token_id"};
const std::set<std::string, std::less<>> read_text_keys = {
    "model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "rms_norm_eps", "max_position_embeddings",
    "mtp_num_hidden_layers", "tie_word_embeddings", "num_experts", "decoder_sparse_step", "mlp_only_layers",
    "hidden_act", "attention_bias", "attn_output_gate", "layer_types", "full_attention_interval",
    "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor", "mamba_ssm_dtype", "eos_token_id"};
// Keys known to have no effect on text inference (metadata, training, the vision tower, MoE
// sizes of a dense model). Listed as "ignored"; everything else is "unknown".
const std::set<std::string, std::less<>> harmless = {
    "transformers_version", "dtype", "torch_dtype", "_name_or_path", "use_cache", "bos_token_id", "pad_token_id",
    "initializer_range", "attention_dropout", "vision_config", "image_token_id", "video_token_id",
    "vision_start_token_id", "vision_end_token_id", "vision_token_id", "output_router_logits",
    "router_aux_loss_coef", "norm_topk_prob", "moe_intermediate_size", "shared_expert_intermediate_size",
    "num_experts_per_tok", "mtp_use_dedicated_embeddings", "use_sliding_window", "sliding_window",
    "max_window_layers", "tokenizer_class", "output_attentions", "output_hidden_states", "return_dict",
    "is_encoder_decoder", "tie_encoder_decoder", "id2label", "label2id", "problem_type", "chunk_size_feed_forward",
    "torchscript", "pruned_heads", "add_cross_attention", "cross_attention_hidden_size", "task_specific_params",
    "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id", "layer_norm_eps"};
const std::set<std::string, std::less<>> read_rope = {"rope_type", "type", "rope_theta", "partial_rotary_factor",
                                                      "mrope_interleaved", "mrope_section"};

bool truthy(const json& obj, const char* key) {
  return obj.contains(key) && obj[key].is_boolean() && obj[key].get<bool>();
}

// One tensor as float32 (F32/BF16/F16); empty for other dtypes.
std::vector<float> floats(const TensorView& t) {
  std::vector<float> v;
  if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16) return v;
  v.resize(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::byte* p = t.data + i * dtype_size(t.dtype);
    if (t.dtype == DType::f32) std::memcpy(&v[i], p, 4);
    else if (t.dtype == DType::bf16) { bf16 h; std::memcpy(&h, p, 2); v[i] = to_float(h); }
    else { f16 h; std::memcpy(&h, p, 2); v[i] = to_float(h); }
  }
  return v;
}

double mean_of(const std::vector<float>& v) {
  double s = 0.0;
  for (const float x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool is_vision(std::string_view name) { return starts_with(name, "model.visual.") || starts_with(name, "visual."); }

// The tensor names bind_weights() reads for this config (src/weights.cpp), so that everything
// else in the checkpoint can be listed as unused.
std::set<std::string> expected_tensors(const ModelConfig& c, const std::string& prefix, bool mtp) {
  std::set<std::string> n;
  const auto attention = [&](const std::string& p) {
    for (const char* t : {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}) n.insert(p + "self_attn." + t + ".weight");
  };
  const auto layer = [&](const std::string& p, LayerKind kind) {
    for (const char* t : {"input_layernorm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      n.insert(p + t + ".weight");
    if (kind == LayerKind::full_attention) {
      attention(p);
      return;
    }
    const std::string g = p + "linear_attn.";
    if (c.gdn_layout == GdnProjectionLayout::separate)
      for (const char* t : {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"}) n.insert(g + t + ".weight");
    else
      for (const char* t : {"in_proj_qkvz", "in_proj_ba"}) n.insert(g + t + ".weight");
    for (const char* t : {"conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight"}) n.insert(g + t);
  };
  n.insert(prefix + "embed_tokens.weight");
  n.insert(prefix + "norm.weight");
  if (!c.tie_word_embeddings) n.insert("lm_head.weight");
  for (int i = 0; i < c.num_layers; ++i) layer(fmt::format("{}layers.{}.", prefix, i), c.layer_types[static_cast<std::size_t>(i)]);
  if (mtp) {
    for (const char* t : {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"})
      n.insert(t);
    layer("mtp.layers.0.", LayerKind::full_attention);
  }
  return n;
}

std::string lm_prefix(const io::Checkpoint& ck) {
  for (const char* p : {"model.language_model.", "model.", ""})
    if (ck.contains(std::string(p) + "embed_tokens.weight")) return p;
  return "model.language_model.";
}

// ---------------------------------------------------------------------------------------------

void check_config(DoctorSubject& s, CheckRecorder& rec, json& root, std::string& config_error) {
  rec.run("config.architecture", [&](DoctorCheck& c) {
    const std::string path = (std::filesystem::path(s.dir) / "config.json").string();
    std::string text;
    try {
      text = read_text(path);
      root = json::parse(text);
    } catch (const json::exception& e) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("{} is not valid JSON: {}", path, e.what());
      config_error = c.message;
      return;
    } catch (const Error& e) {
      c.verdict = Verdict::fail;
      c.message = e.what();
      config_error = c.message;
      return;
    }
    try {
      s.config = parse_model_config(text, path);
    } catch (const Error& e) {
      c.verdict = Verdict::fail;
      c.message = e.what();
      config_error = c.message;
      return;
    }
    const ModelConfig& cfg = *s.config;
    c.verdict = Verdict::pass;
    c.message = fmt::format("{} (model_type {}): dense, {} GDN + {} attention layers, {} GDN projections; supported",
                            cfg.architecture, cfg.model_type, cfg.count_layers(LayerKind::linear_attention),
                            cfg.count_layers(LayerKind::full_attention),
                            cfg.gdn_layout == GdnProjectionLayout::separate ? "separate" : "fused (Qwen3-Next)");
  });

  if (!s.config) {
    rec.skip("config.fields", "config.json did not parse: " + config_error);
    return;
  }
  rec.run("config.fields", [&](DoctorCheck& c) {
    const bool nested = root.contains("text_config") && root["text_config"].is_object();
    const json& text = nested ? root["text_config"] : root;
    const std::string tp = nested ? "text_config." : "";
    std::vector<std::string> unknown, ignored, defaulted, warnings;
    const auto sort_key = [&](const std::string& key, const std::string& path, bool text_level) {
      const bool read = text_level ? read_text_keys.count(key) > 0 : read_top.count(key) > 0;
      if (read) return;
      (harmless.count(key) ? ignored : unknown).push_back(path);
    };
    for (const auto& [k, v] : root.items()) {
      if (nested) sort_key(k, k, false);
      else if (!read_top.count(k)) sort_key(k, k, true);
    }
    if (nested)
      for (const auto& [k, v] : text.items()) sort_key(k, tp + k, true);
    for (const char* rk : {"rope_parameters", "rope_scaling"})
      if (text.contains(rk) && text[rk].is_object())
        for (const auto& [k, v] : text[rk].items())
          if (!read_rope.count(k)) unknown.push_back(tp + rk + "." + k);

    // Fields whose default would be silently wrong for this family, and that no tensor shape
    // can confirm: the rotary fraction and theta.
    const json* rope = nullptr;
    for (const char* rk : {"rope_parameters", "rope_scaling"})
      if (!rope && text.contains(rk) && text[rk].is_object()) rope = &text[rk];
    const auto rope_has = [&](const char* k) { return (rope && rope->contains(k)) || text.contains(k); };
    if (!rope_has("rope_theta")) warnings.push_back("rope_theta absent: default 10000 used (Qwen3.5/3.6 use 1e7)");
    if (!rope_has("partial_rotary_factor"))
      warnings.push_back("partial_rotary_factor absent: RoPE over the whole head (Qwen3.5/3.6 rotate 25%)");
    for (const char* k : {"rms_norm_eps", "linear_conv_kernel_dim", "mamba_ssm_dtype", "head_dim", "eos_token_id"})
      if (!text.contains(k) && !(k == std::string_view("eos_token_id") && root.contains(k))) defaulted.push_back(tp + k);
    if (!text.contains("layer_types")) defaulted.push_back(tp + "layer_types (from full_attention_interval)");
    // Two spellings of one fact that disagree: libgdn reads the first, say so.
    const ModelConfig& cfg = *s.config;
    if (text.contains("layer_types") && text.contains("full_attention_interval") && text["full_attention_interval"].is_number_integer()) {
      const auto n = text["full_attention_interval"].get<std::int64_t>();
      for (int i = 0; n > 0 && i < cfg.num_layers; ++i)
        if ((((i + 1) % n) == 0) != (cfg.layer_types[static_cast<std::size_t>(i)] == LayerKind::full_attention)) {
          warnings.push_back(fmt::format("layer_types and full_attention_interval={} disagree at layer {}; "
                                         "layer_types is used (as transformers does)", n, i));
          break;
        }
    }
    if (rope && rope->contains("partial_rotary_factor") && text.contains("partial_rotary_factor") &&
        (*rope)["partial_rotary_factor"].is_number() && text["partial_rotary_factor"].is_number() &&
        (*rope)["partial_rotary_factor"].get<double>() != text["partial_rotary_factor"].get<double>())
      warnings.push_back("partial_rotary_factor differs between the rope parameters and the top level; "
                         "the rope parameters' value is used");
    if (truthy(text, "use_sliding_window")) warnings.push_back("use_sliding_window is true; libgdn attends to the whole context");
    if (truthy(text, "mtp_use_dedicated_embeddings"))
      warnings.push_back("mtp_use_dedicated_embeddings is true; libgdn's MTP head shares the main embedding");

    measure(c, "unknown fields", static_cast<double>(unknown.size()), "");
    for (const auto& w : warnings) c.details.push_back("warning: " + w);
    for (const auto& k : unknown) c.details.push_back("unknown (not read by libgdn): " + k);
    for (const auto& k : ignored) c.details.push_back("ignored (no effect on text inference): " + k);
    for (const auto& k : defaulted) c.details.push_back("absent, default used: " + k);
    c.verdict = warnings.empty() ? Verdict::pass : Verdict::warn;
    c.message = warnings.empty()
                    ? fmt::format("every field libgdn relies on is present; {} unknown, {} ignored, {} defaulted",
                                  unknown.size(), ignored.size(), defaulted.size())
                    : warnings.front() + (warnings.size() > 1 ? fmt::format(" (+{} more)", warnings.size() - 1) : "");
    if (warnings.empty() && !unknown.empty()) c.message += ": " + name_list(unknown, 3);
  });
}

void check_state_dtype(DoctorSubject& s, CheckRecorder& rec) {
  rec.run("config.state_dtype", [&](DoctorCheck& c) {
    const ModelConfig& cfg = *s.config;
    s.state_dtype = s.options.state_dtype.value_or(cfg.ssm_state_dtype);
    const bool forced = s.options.state_dtype.has_value();
    if (s.state_dtype == DType::bf16) {
      c.verdict = Verdict::fail;
      c.message = forced ? "the recurrent state is forced to bf16: a known cause of silent degeneration "
                           "(\"prime prime prime\"); keep it float32"
                         : "config asks for a bf16 recurrent state (mamba_ssm_dtype = \"bfloat16\"), which libgdn "
                           "would use by default: a known cause of silent degeneration; set mamba_ssm_dtype to "
                           "\"float32\" or ContextParams::state_dtype = f32";
    } else {
      c.verdict = Verdict::pass;
      c.message = cfg.ssm_state_dtype == DType::bf16
                      ? "config asks for bf16 (mamba_ssm_dtype) but the state is overridden to float32"
                      : "recurrent state float32 (mamba_ssm_dtype float32 or absent)";
    }
  });
}

void check_tokenizer(DoctorSubject& s, CheckRecorder& rec) {
  const std::string path = (std::filesystem::path(s.dir) / "tokenizer.json").string();
  s.text_vocab = s.config->vocab_size;
  if (!std::filesystem::exists(path)) {
    rec.skip("config.tokenizer", "no tokenizer.json; probes use fixed token ids");
    return;
  }
  rec.run("config.tokenizer", [&](DoctorCheck& c) {
    const json t = json::parse(read_text(path));
    std::int64_t max_id = -1, base = 0;
    if (t.contains("model") && t["model"].contains("vocab") && t["model"]["vocab"].is_object())
      for (const auto& [k, v] : t["model"]["vocab"].items())
        if (v.is_number_integer()) {
          max_id = std::max<std::int64_t>(max_id, v.get<std::int64_t>());
          ++base;
        }
    if (t.contains("added_tokens") && t["added_tokens"].is_array())
      for (const auto& a : t["added_tokens"])
        if (a.contains("id") && a["id"].is_number_integer()) {
          const auto id = a["id"].get<std::int64_t>();
          max_id = std::max(max_id, id);
          if (id >= 0 && id < (1 << 30)) s.added_ids.insert(static_cast<std::int32_t>(id));
        }
    const int V = s.config->vocab_size;
    measure(c, "largest token id", static_cast<double>(max_id), fmt::format("< vocab_size {}", V));
    if (max_id >= V) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("tokenizer.json has ids up to {} but the model's vocab_size is {}: those tokens "
                              "index past the embedding", max_id, V);
      return;
    }
    s.text_vocab = static_cast<std::int32_t>(std::clamp<std::int64_t>(base, 1, V));
    try {
      s.tokenizer = Tokenizer::load(path);
    } catch (const Error& e) {
      c.verdict = Verdict::warn;
      c.message = fmt::format("ids fit the vocabulary, but libgdn's tokenizer cannot load it ({}); probes use "
                              "token ids", e.what());
      return;
    }
    c.verdict = Verdict::pass;
    c.message = fmt::format("{} vocabulary + {} added tokens, all ids < vocab_size {}{}", base, s.added_ids.size(), V,
                            s.tokenizer ? "; probes use text" : "; probes use token ids");
  });
}

void check_tensors(DoctorSubject& s, CheckRecorder& rec, const io::Checkpoint* ck) {
  rec.run("config.weights", [&](DoctorCheck& c) {
    try {
      ModelParams mp = s.options.load;
      mp.backend = s.options.backend;  // a CUDA doctor uploads the weights instead of packing them
      s.model = Model::load(s.dir, mp);
    } catch (const Error& e) {
      s.not_loaded = e.what();
      c.verdict = Verdict::fail;
      c.message = fmt::format("config and tensors disagree: {}", e.what());
      return;
    }
    const ModelConfig& cfg = s.model->config();
    const std::string prefix = s.model->weights().prefix;
    const auto expected = expected_tensors(cfg, prefix, s.model->has_mtp());
    std::vector<std::string> unused_lm, unused_other, vision, mtp_ignored;
    bool tied_head_differs = false;
    for (const auto& name : ck->names()) {
      if (expected.count(name)) continue;
      if (is_vision(name)) vision.push_back(name);
      else if (starts_with(name, "mtp.") && !s.model->has_mtp()) mtp_ignored.push_back(name);
      else if (name == "lm_head.weight" && cfg.tie_word_embeddings) {
        const TensorView h = ck->get(name), e = s.model->weights().embed_tokens;
        tied_head_differs = h.nbytes() != e.nbytes() || h.dtype != e.dtype || std::memcmp(h.data, e.data, h.nbytes()) != 0;
        if (tied_head_differs) unused_lm.push_back(name);
      } else if (starts_with(name, prefix) || starts_with(name, "mtp.") || name == "lm_head.weight") unused_lm.push_back(name);
      else unused_other.push_back(name);
    }
    measure(c, "unused language-model tensors", static_cast<double>(unused_lm.size()), "0");
    for (const auto& n : unused_lm) c.details.push_back("unused: " + n);
    for (const auto& n : unused_other) c.details.push_back("unknown tensor, unused: " + n);
    if (!mtp_ignored.empty())
      c.details.push_back(fmt::format("ignored: {} mtp.* tensors (mtp_num_hidden_layers = {})", mtp_ignored.size(),
                                      cfg.mtp_num_hidden_layers));
    if (!vision.empty()) c.details.push_back(fmt::format("ignored: {} vision-tower tensors", vision.size()));
    if (!unused_lm.empty()) {
      c.verdict = Verdict::fail;
      c.message = tied_head_differs
                      ? "tie_word_embeddings is true but the checkpoint's lm_head.weight differs from the embedding: "
                        "its own output head would be ignored"
                      : fmt::format("the checkpoint has language-model tensors the config does not use (config "
                                    "truncates the model, or layer_types is wrong): {}", name_list(unused_lm));
    } else {
      c.verdict = unused_other.empty() ? Verdict::pass : Verdict::warn;
      c.message = fmt::format("{} tensors bound with the shapes the config implies{}{}{}", expected.size(),
                              s.model->has_mtp() ? " (MTP head included)" : "",
                              vision.empty() ? "" : fmt::format("; {} vision tensors ignored", vision.size()),
                              unused_other.empty() ? "" : fmt::format("; unknown tensors: {}", name_list(unused_other)));
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Weight fingerprints.

// Whether a tensor's elements are all finite, and whether they are all zero. Exponent-bit tests, so
// a multi-gigabyte tensor is read at memory speed.
template <typename U>
std::pair<bool, bool> finite_and_zero(const std::byte* p, std::size_t n, U exp_mask, U abs_mask) {
  U any_inf_nan = 0, any_nonzero = 0;
  for (std::size_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, p + sizeof(U) * i, sizeof(U));
    any_inf_nan |= static_cast<U>((u & exp_mask) == exp_mask);
    any_nonzero |= static_cast<U>(u & abs_mask);
  }
  return {any_inf_nan == 0, any_nonzero == 0};
}

void check_finite(DoctorSubject& s, CheckRecorder& rec, const io::Checkpoint& ck) {
  rec.run("weights.finite", [&](DoctorCheck& c) {
    std::vector<std::pair<std::string, TensorView>> todo;
    std::int64_t skipped = 0, large = 0;
    const std::int64_t quick_limit = std::int64_t{1} << 22;  // --quick: small tensors and one in 16 large ones
    for (const auto& name : ck.names()) {
      if (is_vision(name)) continue;
      const TensorView t = ck.get(name);
      if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16) continue;
      if (s.options.quick && t.numel() > quick_limit && (large++ % 16) != 0) {
        ++skipped;
        continue;
      }
      todo.emplace_back(name, t);
    }
    std::vector<std::pair<bool, bool>> result(todo.size());
    ThreadPool pool(s.options.threads);
    pool.parallel_for(static_cast<std::int64_t>(todo.size()), 1, [&](std::int64_t b, std::int64_t e, int) {
      for (std::int64_t i = b; i < e; ++i) {
        const TensorView& t = todo[static_cast<std::size_t>(i)].second;
        const auto n = static_cast<std::size_t>(t.numel());
        result[static_cast<std::size_t>(i)] =
            t.dtype == DType::f32 ? finite_and_zero<std::uint32_t>(t.data, n, 0x7f800000u, 0x7fffffffu)
            : t.dtype == DType::bf16 ? finite_and_zero<std::uint16_t>(t.data, n, 0x7f80, 0x7fff)
                                     : finite_and_zero<std::uint16_t>(t.data, n, 0x7c00, 0x7fff);
      }
    });
    std::vector<std::string> bad, zero;
    for (std::size_t i = 0; i < todo.size(); ++i) {
      if (!result[i].first) bad.push_back(todo[i].first);
      // Freshly initialised (1+w) norms are exactly 0; an all-zero matrix is a failed conversion.
      else if (result[i].second && todo[i].second.rank >= 2) zero.push_back(todo[i].first);
    }
    measure(c, "tensors with NaN/Inf", static_cast<double>(bad.size()), "0");
    for (const auto& n : bad) c.details.push_back("NaN or Inf: " + n);
    for (const auto& n : zero) c.details.push_back("all zero: " + n);
    const std::string scope = skipped ? fmt::format(" ({} large tensors not scanned: quick)", skipped) : "";
    if (!bad.empty()) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("{} tensors hold NaN or Inf: {}", bad.size(), name_list(bad));
    } else if (!zero.empty()) {
      c.verdict = Verdict::warn;
      c.message = fmt::format("{} matrices are all zero: {}", zero.size(), name_list(zero));
    } else {
      c.verdict = Verdict::pass;
      c.message = fmt::format("{} tensors finite, no all-zero matrix{}", todo.size(), scope);
    }
  });
}

void check_norms(CheckRecorder& rec, const io::Checkpoint& ck) {
  std::vector<std::pair<std::string, double>> zc, gated;  // (name, mean(w))
  const std::string prefix = lm_prefix(ck);
  for (const auto& name : ck.names()) {
    if (is_vision(name)) continue;
    const bool gated_norm = ends_with(name, "linear_attn.norm.weight");
    const bool zero_centred = !gated_norm && (ends_with(name, "layernorm.weight") || ends_with(name, "q_norm.weight") ||
                                             ends_with(name, "k_norm.weight") || ends_with(name, "pre_fc_norm_embedding.weight") ||
                                             ends_with(name, "pre_fc_norm_hidden.weight") || name == prefix + "norm.weight" ||
                                             name == "mtp.norm.weight");
    if (!gated_norm && !zero_centred) continue;
    const auto v = floats(ck.get(name));
    if (v.empty()) continue;
    (gated_norm ? gated : zc).emplace_back(name, mean_of(v));
  }

  rec.run("weights.norm_convention", [&](DoctorCheck& c) {
    std::vector<double> means;
    std::vector<std::string> shifted;
    for (const auto& [n, m] : zc) {
      means.push_back(m);
      if (std::fabs(m - 1.0) < lim::zero_centred_norm_max_mean) shifted.push_back(fmt::format("{} (mean {:.3f})", n, m));
    }
    if (means.empty()) {
      c.verdict = Verdict::skip;
      c.message = "no (1+w) norm tensors found";
      return;
    }
    const double med = median(means);
    measure(c, "median mean(w)", med, fmt::format("|.| < {}", lim::zero_centred_norm_max_mean));
    c.details = shifted;
    if (2 * shifted.size() >= zc.size()) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("{} of {} (1+w) norms have mean(w) near 1: the +1 looks baked in (a converter stored "
                              "1+w), so the engine would scale by 2+w: {}", shifted.size(), zc.size(), name_list(shifted, 3));
    } else if (!shifted.empty()) {
      c.verdict = Verdict::warn;
      c.message = fmt::format("{} of {} (1+w) norms have mean(w) near 1: {}", shifted.size(), zc.size(), name_list(shifted, 3));
    } else {
      c.verdict = Verdict::pass;
      c.message = fmt::format("{} (1+w) norms (input/post-attention/final/q/k/MTP) stored zero-centred", zc.size());
    }
  });

  rec.run("weights.gated_norm", [&](DoctorCheck& c) {
    if (gated.empty()) {
      c.verdict = Verdict::skip;
      c.message = "no GDN gated norm tensors (linear_attn.norm.weight)";
      return;
    }
    std::vector<double> means;
    std::vector<std::string> names;
    for (const auto& [n, m] : gated) {
      means.push_back(m);
      names.push_back(fmt::format("{} (mean {:.3f})", n, m));
    }
    const double med = median(means);
    measure(c, "median mean(w)", med, fmt::format(">= {}", lim::gated_norm_min_mean));
    if (med < lim::gated_norm_min_mean) {
      c.verdict = Verdict::fail;
      c.details = names;
      c.message = fmt::format("the GDN gated norms (linear_attn.norm.weight) look zero-centred or zeroed (median "
                              "mean {:.3f}); this norm multiplies by w as stored, so GDN outputs would be scaled "
                              "by about {:.2f}: {}", med, med, name_list(names, 3));
    } else if (std::fabs(med - 2.0) < 0.5) {
      c.verdict = Verdict::warn;
      c.details = names;
      c.message = fmt::format("the GDN gated norms have mean(w) near 2 (median {:.3f}): a +1 added to a norm that "
                              "is stored as w?", med);
    } else {
      c.verdict = Verdict::pass;
      c.message = fmt::format("{} GDN gated norms stored as w (near 1)", gated.size());
    }
  });
}

void check_decay_params(CheckRecorder& rec, const io::Checkpoint& ck) {
  std::vector<std::pair<std::string, std::vector<float>>> a_log, dt_bias;
  for (const auto& name : ck.names()) {
    if (ends_with(name, "linear_attn.A_log")) a_log.emplace_back(name, floats(ck.get(name)));
    else if (ends_with(name, "linear_attn.dt_bias")) dt_bias.emplace_back(name, floats(ck.get(name)));
  }
  rec.run("weights.A_log", [&](DoctorCheck& c) {
    if (a_log.empty()) {
      c.verdict = Verdict::skip;
      c.message = "no GDN layers";
      return;
    }
    double lo = INFINITY, hi = 0.0;
    std::vector<std::string> bad;
    for (const auto& [n, v] : a_log) {
      double tlo = INFINITY, thi = 0.0;
      bool finite = true;
      for (const float x : v) {
        const double a = std::exp(static_cast<double>(x));
        finite = finite && std::isfinite(x);
        tlo = std::min(tlo, a);
        thi = std::max(thi, a);
      }
      lo = std::min(lo, tlo);
      hi = std::max(hi, thi);
      if (!finite || !(thi <= lim::max_exp_A_log) || !(tlo > 0.0))
        bad.push_back(fmt::format("{} (exp range [{}, {}])", n, figure(tlo), figure(thi)));
    }
    measure(c, "max exp(A_log)", hi, fmt::format("<= {}", figure(lim::max_exp_A_log)));
    c.details = bad;
    if (!bad.empty()) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("A = exp(A_log) out of range in {} tensors (A itself stored instead of its log?): the "
                              "state would be wiped every token: {}", bad.size(), name_list(bad, 3));
    } else {
      c.verdict = Verdict::pass;
      c.message = fmt::format("decay rates exp(A_log) in [{}, {}] over {} layers", figure(lo), figure(hi), a_log.size());
    }
  });
  rec.run("weights.dt_bias", [&](DoctorCheck& c) {
    if (dt_bias.empty()) {
      c.verdict = Verdict::skip;
      c.message = "no GDN layers";
      return;
    }
    double worst = 0.0;
    std::vector<std::string> nonfinite, large;
    for (const auto& [n, v] : dt_bias) {
      double m = 0.0;
      bool finite = true;
      for (const float x : v) {
        finite = finite && std::isfinite(x);
        m = std::max(m, static_cast<double>(std::fabs(x)));
      }
      if (!finite) nonfinite.push_back(n);
      else if (m > lim::max_abs_dt_bias) large.push_back(fmt::format("{} (max |.| {})", n, figure(m)));
      if (finite) worst = std::max(worst, m);
    }
    measure(c, "max |dt_bias|", worst, fmt::format("<= {}", figure(lim::max_abs_dt_bias)));
    for (const auto& n : nonfinite) c.details.push_back("NaN or Inf: " + n);
    for (const auto& n : large) c.details.push_back(n);
    if (!nonfinite.empty()) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("dt_bias holds NaN or Inf: {}", name_list(nonfinite));
    } else if (!large.empty()) {
      c.verdict = Verdict::warn;
      c.message = fmt::format("dt_bias unusually large (softplus(dt_bias) sets the step size): {}", name_list(large, 3));
    } else {
      c.verdict = Verdict::pass;
      c.message = fmt::format("dt_bias finite, |.| <= {} over {} layers", figure(worst), dt_bias.size());
    }
  });
}

}  // namespace

void check_checkpoint(DoctorSubject& s, CheckRecorder& rec) {
  json root;
  std::string config_error;
  check_config(s, rec, root, config_error);

  std::unique_ptr<io::Checkpoint> ck;
  std::string ck_error;
  try {
    ck = std::make_unique<io::Checkpoint>(s.dir);
  } catch (const Error& e) {
    ck_error = e.what();
  }

  if (s.config) {
    check_state_dtype(s, rec);
    check_tokenizer(s, rec);
  } else {
    for (const char* n : {"config.state_dtype", "config.tokenizer"}) rec.skip(n, "config.json did not parse");
  }
  if (s.config && ck) {
    check_tensors(s, rec, ck.get());
  } else {
    s.not_loaded = ck ? "config.json did not parse" : ck_error;
    if (!ck) rec.run("config.weights", [&](DoctorCheck& c) {
      c.verdict = Verdict::fail;
      c.message = "the safetensors cannot be read: " + ck_error;
    });
    else rec.skip("config.weights", s.not_loaded);
  }
  if (!ck) {
    for (const char* n : {"weights.finite", "weights.norm_convention", "weights.gated_norm", "weights.A_log", "weights.dt_bias"})
      rec.skip(n, "the safetensors cannot be read");
    return;
  }
  check_finite(s, rec, *ck);
  check_norms(rec, *ck);
  check_decay_params(rec, *ck);
}

}  // namespace gdn::detail
