// libFuzzer target: config.json parsing on arbitrary text. Refusals must be gdn::Error with
// invalid_file or unsupported_model; an accepted config must satisfy what the rest of the library
// assumes of it (every size positive, the derived sizes computable without overflow, the layer
// list as long as num_hidden_layers, RoPE dims even and within the head).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "gdn/core/error.hpp"
#include "gdn/model/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  gdn::ModelConfig c;
  try {
    c = gdn::parse_model_config(text, "fuzz/config.json");
  } catch (const gdn::Error& e) {
    GDN_FUZZ_CHECK(e.status() == gdn::Status::invalid_file || e.status() == gdn::Status::unsupported_model);
    return 0;
  }
  GDN_FUZZ_CHECK(c.hidden_size > 0 && c.num_layers > 0 && c.vocab_size > 0 && c.intermediate_size > 0);
  GDN_FUZZ_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0);
  GDN_FUZZ_CHECK(c.linear_num_key_heads > 0 && c.linear_num_value_heads > 0);
  GDN_FUZZ_CHECK(c.linear_key_head_dim > 0 && c.linear_value_head_dim > 0);
  GDN_FUZZ_CHECK(c.linear_conv_kernel_dim >= 1);
  GDN_FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
  GDN_FUZZ_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0);
  GDN_FUZZ_CHECK(c.rotary_dim > 0 && c.rotary_dim <= c.head_dim && c.rotary_dim % 2 == 0);
  GDN_FUZZ_CHECK(static_cast<int>(c.layer_types.size()) == c.num_layers);
  GDN_FUZZ_CHECK(c.mtp_num_hidden_layers == 0 || c.mtp_num_hidden_layers == 1);
  GDN_FUZZ_CHECK(c.max_position_embeddings >= 0);
  for (const auto id : c.eos_token_ids) GDN_FUZZ_CHECK(id >= 0 && id < c.vocab_size);
  // The derived sizes are int arithmetic: UBSan reports an overflow in any of them.
  volatile int sink = 0;
  sink = c.gdn_key_dim();
  sink = c.gdn_value_dim();
  sink = c.gdn_conv_dim();
  sink = c.gdn_heads_per_key_head();
  sink = c.attn_q_dim();
  sink = c.attn_kv_dim();
  (void)sink;
  return 0;
}
