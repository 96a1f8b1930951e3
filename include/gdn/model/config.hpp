#pragma once
// The text model's configuration, read from a Hugging Face config.json. Qwen3.5/3.6 multimodal
// checkpoints (Qwen3_5ForConditionalGeneration) nest the language model under "text_config";
// text-only ones (Qwen3_5ForCausalLM, Qwen3NextForCausalLM) keep it at top level. Anything libgdn
// does not run (mixture-of-experts, other architectures, rope scaling) is refused by name here,
// before any weight is touched.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gdn/core/dtype.hpp"

namespace gdn {

enum class LayerKind : std::uint8_t { linear_attention, full_attention };

// How the GDN input projections are stored. Qwen3.5/3.6 keep four matrices (in_proj_qkv, _z, _b,
// _a); Qwen3-Next fuses them into in_proj_qkvz and in_proj_ba, interleaved per key-head group.
enum class GdnProjectionLayout : std::uint8_t { separate, fused_per_key_group };

struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;    // of the text model
  GdnProjectionLayout gdn_layout = GdnProjectionLayout::separate;

  int hidden_size = 0;
  int num_layers = 0;
  int vocab_size = 0;
  int intermediate_size = 0;
  std::vector<LayerKind> layer_types;

  // gated full attention
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor, the leading dims that RoPE rotates
  double rope_theta = 10000.0;

  // gated delta net
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 4;

  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  int mtp_num_hidden_layers = 0;
  int max_position_embeddings = 0;
  DType ssm_state_dtype = DType::f32;  // mamba_ssm_dtype: the recurrent state's default dtype
  std::vector<std::int32_t> eos_token_ids;

  // Derived sizes.
  int gdn_key_dim() const noexcept { return linear_num_key_heads * linear_key_head_dim; }
  int gdn_value_dim() const noexcept { return linear_num_value_heads * linear_value_head_dim; }
  int gdn_conv_dim() const noexcept { return 2 * gdn_key_dim() + gdn_value_dim(); }
  int gdn_heads_per_key_head() const noexcept { return linear_num_value_heads / linear_num_key_heads; }
  int attn_q_dim() const noexcept { return num_attention_heads * head_dim; }
  int attn_kv_dim() const noexcept { return num_key_value_heads * head_dim; }
  int count_layers(LayerKind k) const noexcept;
};

// Parses config.json text. `what` names the source in error messages. Throws gdn::Error
// (invalid_file for malformed JSON or a field of the wrong type, unsupported_model for an
// architecture or feature libgdn does not run), naming the field.
ModelConfig parse_model_config(std::string_view json_text, std::string_view what);

// Reads DIR/config.json.
ModelConfig load_model_config(const std::string& dir);

}  // namespace gdn
