#include "gdn/model/config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/core/error.hpp"

namespace gdn {
namespace {

using nlohmann::json;

// A value for an error message: scalars as written (long strings cut short), containers by type
// only. Never dump() an untrusted container: dump() recurses, and a deeply nested value (a few MB of
// '[') would overflow the stack while the error is being reported.
std::string describe(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  std::string s = v.dump();
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

// Field access with messages that name the field and what was wrong with it.
class Fields {
 public:
  Fields(const json& obj, std::string_view what, std::string prefix)
      : obj_(obj), what_(what), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  const json& raw(const char* key) const { return obj_[key]; }
  std::string path(const char* key) const { return prefix_ + key; }

  [[noreturn]] void fail(Status s, const char* key, const std::string& why) const {
    throw Error(s, fmt::format("{}: field '{}' {}", what_, path(key), why));
  }

  std::int64_t integer(const char* key) const {
    if (!has(key)) fail(Status::invalid_file, key, "is missing");
    return integer_value(key, obj_[key]);
  }
  std::int64_t integer_or(const char* key, std::int64_t fallback) const {
    return has(key) ? integer_value(key, obj_[key]) : fallback;
  }
  // An optional field stored as int: a value past int's range is refused, not truncated.
  int int_or(const char* key, int fallback) const {
    const auto v = integer_or(key, fallback);
    if (v < -(std::int64_t{1} << 31) || v >= (std::int64_t{1} << 31))
      fail(Status::invalid_file, key, fmt::format("is {}, outside the range of a 32-bit integer", v));
    return static_cast<int>(v);
  }
  int positive(const char* key) const {
    const auto v = integer(key);
    if (v <= 0 || v > (1 << 30)) fail(Status::invalid_file, key, fmt::format("must be a positive size, got {}", v));
    return static_cast<int>(v);
  }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!obj_[key].is_number()) fail(Status::invalid_file, key, fmt::format("must be a number, got {}", describe(obj_[key])));
    return obj_[key].get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!obj_[key].is_boolean()) fail(Status::invalid_file, key, fmt::format("must be true or false, got {}", describe(obj_[key])));
    return obj_[key].get<bool>();
  }
  std::string string_or(const char* key, std::string fallback) const {
    if (!has(key)) return fallback;
    if (!obj_[key].is_string()) fail(Status::invalid_file, key, fmt::format("must be a string, got {}", describe(obj_[key])));
    return obj_[key].get<std::string>();
  }

 private:
  std::int64_t integer_value(const char* key, const json& v) const {
    if (!v.is_number_integer()) fail(Status::invalid_file, key, fmt::format("must be an integer, got {}", describe(v)));
    return v.get<std::int64_t>();
  }

  const json& obj_;
  std::string_view what_;
  std::string prefix_;
};

bool is_known_dense_architecture(std::string_view a) {
  return a == "Qwen3_5ForConditionalGeneration" || a == "Qwen3_5ForCausalLM" || a == "Qwen3NextForCausalLM";
}

// Kept 64-bit until checked against the vocabulary: 2^32 + 5 must not become id 5.
void collect_eos(const json& v, std::vector<std::int64_t>& out) {
  if (v.is_number_integer()) {
    out.push_back(v.get<std::int64_t>());
  } else if (v.is_array()) {
    for (const auto& e : v)
      if (e.is_number_integer()) out.push_back(e.get<std::int64_t>());
  }
}

}  // namespace

int ModelConfig::count_layers(LayerKind k) const noexcept {
  return static_cast<int>(std::count(layer_types.begin(), layer_types.end(), k));
}

ModelConfig parse_model_config(std::string_view json_text, std::string_view what) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(Status::invalid_file, fmt::format("{}: not valid JSON ({})", what, e.what()));
  }
  if (!root.is_object()) throw Error(Status::invalid_file, fmt::format("{}: the top level is not an object", what));

  ModelConfig c;
  const Fields top(root, what, "");
  if (top.has("architectures")) {
    const json& a = top.raw("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      top.fail(Status::invalid_file, "architectures", "must be a non-empty list of names");
    c.architecture = a[0].get<std::string>();
  }
  const std::string top_type = top.string_or("model_type", "");

  // The text model's fields are nested for the multimodal wrapper.
  const bool nested = top.has("text_config");
  if (nested && !top.raw("text_config").is_object()) top.fail(Status::invalid_file, "text_config", "must be an object");
  const json& text = nested ? top.raw("text_config") : root;
  const Fields f(text, what, nested ? "text_config." : "");
  c.model_type = f.string_or("model_type", top_type);

  // Refuse what we do not run, by name, before reading sizes.
  const auto moe_name = [](std::string_view s) {
    return s.find("Moe") != std::string_view::npos || s.find("moe") != std::string_view::npos;
  };
  if (moe_name(c.architecture))
    top.fail(Status::unsupported_model, "architectures",
             fmt::format("names '{}', a mixture-of-experts model; libgdn runs dense models only", c.architecture));
  if (moe_name(c.model_type) || moe_name(top_type))
    throw Error(Status::unsupported_model,
                fmt::format("{}: field 'model_type' is '{}', a mixture-of-experts model; libgdn runs dense models only",
                            what, moe_name(c.model_type) ? c.model_type : top_type));
  if (c.architecture.empty()) {
    // Infer from model_type when architectures is absent.
    if (c.model_type == "qwen3_5_text") c.architecture = "Qwen3_5ForCausalLM";
    else if (c.model_type == "qwen3_5") c.architecture = "Qwen3_5ForConditionalGeneration";
    else if (c.model_type == "qwen3_next") c.architecture = "Qwen3NextForCausalLM";
  }
  if (!is_known_dense_architecture(c.architecture))
    top.fail(Status::unsupported_model, "architectures",
             fmt::format("names '{}'; libgdn runs Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM and "
                         "Qwen3NextForCausalLM (dense)",
                         c.architecture.empty() ? std::string("nothing") : c.architecture));
  c.gdn_layout = c.architecture == "Qwen3NextForCausalLM" ? GdnProjectionLayout::fused_per_key_group
                                                           : GdnProjectionLayout::separate;

  c.hidden_size = f.positive("hidden_size");
  c.num_layers = f.positive("num_hidden_layers");
  c.vocab_size = f.positive("vocab_size");
  c.intermediate_size = f.positive("intermediate_size");
  c.num_attention_heads = f.positive("num_attention_heads");
  c.num_key_value_heads = f.positive("num_key_value_heads");
  c.head_dim = f.has("head_dim") ? f.positive("head_dim") : c.hidden_size / c.num_attention_heads;
  if (c.head_dim <= 0)
    f.fail(Status::invalid_file, "head_dim",
           fmt::format("is missing, and hidden_size / num_attention_heads ({} / {}) is 0", c.hidden_size, c.num_attention_heads));
  c.linear_num_key_heads = f.positive("linear_num_key_heads");
  c.linear_num_value_heads = f.positive("linear_num_value_heads");
  c.linear_key_head_dim = f.positive("linear_key_head_dim");
  c.linear_value_head_dim = f.positive("linear_value_head_dim");
  c.linear_conv_kernel_dim = f.int_or("linear_conv_kernel_dim", 4);
  c.rms_norm_eps = static_cast<float>(f.number_or("rms_norm_eps", 1e-6));
  c.max_position_embeddings = f.int_or("max_position_embeddings", 0);
  c.mtp_num_hidden_layers = f.int_or("mtp_num_hidden_layers", 0);
  c.tie_word_embeddings = f.has("tie_word_embeddings") ? f.boolean_or("tie_word_embeddings", false)
                                                        : top.boolean_or("tie_word_embeddings", false);

  if (f.integer_or("num_experts", 0) > 0) {
    // Qwen3-Next makes layer i a mixture of experts unless it is listed in mlp_only_layers.
    const auto step = f.integer_or("decoder_sparse_step", 1);
    std::vector<std::int64_t> dense_layers;
    if (f.has("mlp_only_layers") && f.raw("mlp_only_layers").is_array())
      for (const auto& v : f.raw("mlp_only_layers"))
        if (v.is_number_integer()) dense_layers.push_back(v.get<std::int64_t>());
    for (int i = 0; i < c.num_layers; ++i) {
      const bool dense = std::find(dense_layers.begin(), dense_layers.end(), i) != dense_layers.end();
      if (!dense && step > 0 && (i + 1) % step == 0)
        f.fail(Status::unsupported_model, "num_experts",
               fmt::format("is {}, so layer {} is a mixture of experts; libgdn runs dense MLPs only",
                           f.integer("num_experts"), i));
    }
  }
  if (const auto act = f.string_or("hidden_act", "silu"); act != "silu")
    f.fail(Status::unsupported_model, "hidden_act", fmt::format("is '{}'; only 'silu' is supported", act));
  if (f.boolean_or("attention_bias", false))
    f.fail(Status::unsupported_model, "attention_bias", "is true; Qwen3.5-family attention has no biases");
  if (f.has("attn_output_gate") && !f.boolean_or("attn_output_gate", true))
    f.fail(Status::unsupported_model, "attn_output_gate", "is false; libgdn runs the gated attention of Qwen3.5/Next");

  // Layer pattern: explicit list, else every full_attention_interval-th layer is full attention.
  if (f.has("layer_types")) {
    const json& lt = f.raw("layer_types");
    if (!lt.is_array()) f.fail(Status::invalid_file, "layer_types", "must be a list");
    if (static_cast<int>(lt.size()) != c.num_layers)
      f.fail(Status::invalid_file, "layer_types",
             fmt::format("lists {} layers but num_hidden_layers is {}", lt.size(), c.num_layers));
    for (std::size_t i = 0; i < lt.size(); ++i) {
      const std::string v = lt[i].is_string() ? lt[i].get<std::string>() : describe(lt[i]);
      if (v == "linear_attention") c.layer_types.push_back(LayerKind::linear_attention);
      else if (v == "full_attention") c.layer_types.push_back(LayerKind::full_attention);
      else f.fail(Status::unsupported_model, "layer_types", fmt::format("[{}] is '{}'; expected linear_attention or full_attention", i, v));
    }
  } else {
    const auto interval = f.integer_or("full_attention_interval", 4);
    if (interval <= 0) f.fail(Status::invalid_file, "full_attention_interval", fmt::format("must be positive, got {}", interval));
    for (int i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerKind::full_attention : LayerKind::linear_attention);
  }

  // RoPE: rope_parameters (current transformers), else rope_scaling / top-level fields.
  const json empty = json::object();
  const char* rope_key = f.has("rope_parameters") ? "rope_parameters" : (f.has("rope_scaling") ? "rope_scaling" : nullptr);
  const json& rope = rope_key ? f.raw(rope_key) : empty;
  if (!rope.is_object()) f.fail(Status::invalid_file, rope_key, "must be an object");
  const Fields r(rope, what, f.path(rope_key ? rope_key : "rope_parameters") + ".");
  const std::string rope_type = r.has("rope_type") ? r.string_or("rope_type", "default") : r.string_or("type", "default");
  if (rope_type != "default" && rope_type != "mrope")
    r.fail(Status::unsupported_model, "rope_type", fmt::format("is '{}'; only unscaled RoPE is supported", rope_type));
  c.rope_theta = r.has("rope_theta") ? r.number_or("rope_theta", 1e4) : f.number_or("rope_theta", 1e4);
  const double partial = r.has("partial_rotary_factor") ? r.number_or("partial_rotary_factor", 1.0)
                                                        : f.number_or("partial_rotary_factor", 1.0);
  // Range first: converting a huge or NaN double to int is undefined behaviour.
  if (!(partial > 0.0 && partial <= 1.0))
    (r.has("partial_rotary_factor") ? r : f)
        .fail(Status::invalid_file, "partial_rotary_factor", fmt::format("is {}; it must be in (0, 1]", partial));
  c.rotary_dim = static_cast<int>(c.head_dim * partial);
  if (r.boolean_or("mrope_interleaved", false) || r.has("mrope_section")) {
    // Text-only positions are the same on all three mRoPE streams, so it is plain RoPE here.
  }

  const std::string ssm = f.string_or("mamba_ssm_dtype", "float32");
  if (ssm == "float32") c.ssm_state_dtype = DType::f32;
  else if (ssm == "bfloat16") c.ssm_state_dtype = DType::bf16;
  else f.fail(Status::unsupported_model, "mamba_ssm_dtype", fmt::format("is '{}'; float32 or bfloat16 expected", ssm));

  std::vector<std::int64_t> eos;
  if (f.has("eos_token_id")) collect_eos(f.raw("eos_token_id"), eos);
  if (nested && top.has("eos_token_id")) collect_eos(top.raw("eos_token_id"), eos);
  for (const auto id : eos)
    if (id < 0 || id >= c.vocab_size)
      f.fail(Status::invalid_file, "eos_token_id", fmt::format("{} is outside the vocabulary of {}", id, c.vocab_size));
  for (const auto id : eos) c.eos_token_ids.push_back(static_cast<std::int32_t>(id));
  std::sort(c.eos_token_ids.begin(), c.eos_token_ids.end());
  c.eos_token_ids.erase(std::unique(c.eos_token_ids.begin(), c.eos_token_ids.end()), c.eos_token_ids.end());

  // Consistency of the sizes.
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail(Status::invalid_file, "num_key_value_heads",
           fmt::format("({}) must divide num_attention_heads ({})", c.num_key_value_heads, c.num_attention_heads));
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    f.fail(Status::invalid_file, "linear_num_key_heads",
           fmt::format("({}) must divide linear_num_value_heads ({})", c.linear_num_key_heads, c.linear_num_value_heads));
  if (c.rotary_dim <= 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0)
    f.fail(Status::invalid_file, "partial_rotary_factor",
           fmt::format("gives a rotary dimension of {} for head_dim {}; it must be even and in (0, head_dim]",
                       c.rotary_dim, c.head_dim));
  // The derived sizes are int arithmetic everywhere (ModelConfig's helpers, tensor shapes): each
  // must stay far from overflow, like the sizes themselves.
  const auto check_dim = [&](const char* key, std::int64_t v, const char* name) {
    if (v > (std::int64_t{1} << 30))
      f.fail(Status::invalid_file, key, fmt::format("gives {} = {}, above the supported 2^30", name, v));
  };
  const std::int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  check_dim("head_dim", std::int64_t{c.num_attention_heads} * c.head_dim, "num_attention_heads × head_dim");
  check_dim("linear_key_head_dim", 2 * dk * c.linear_num_key_heads + dv * c.linear_num_value_heads,
            "the GDN conv dimension 2 × key heads × key dim + value heads × value dim");
  check_dim("linear_value_head_dim", dk * dv, "a GDN head's state, key dim × value dim");
  if (c.linear_conv_kernel_dim < 1 || c.linear_conv_kernel_dim > 16)
    f.fail(Status::unsupported_model, "linear_conv_kernel_dim", fmt::format("is {}; 1..16 supported", c.linear_conv_kernel_dim));
  if (!(c.rms_norm_eps > 0.0f) || !std::isfinite(c.rms_norm_eps))
    f.fail(Status::invalid_file, "rms_norm_eps", "must be a positive number");
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta))
    throw Error(Status::invalid_file, fmt::format("{}: rope_theta must be a positive number", what));
  if (c.max_position_embeddings < 0)  // 0: not stated
    f.fail(Status::invalid_file, "max_position_embeddings", fmt::format("must be 0 or more, got {}", c.max_position_embeddings));
  if (c.mtp_num_hidden_layers < 0 || c.mtp_num_hidden_layers > 1)
    f.fail(Status::unsupported_model, "mtp_num_hidden_layers", fmt::format("is {}; 0 or 1 supported", c.mtp_num_hidden_layers));
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Status::io_error, fmt::format("cannot read '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace gdn
