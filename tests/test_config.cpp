// config.json parsing: both Qwen3.5 layouts (nested text_config / top level), layer_types vs
// full_attention_interval, rope fields in either place, and refusals that name the field.

#include <catch2/catch.hpp>

#include "gdn/core/error.hpp"
#include "gdn/model/config.hpp"
#include "test_util.hpp"

using namespace gdn;

namespace {

const char* const text_fields = R"(
  "hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 256, "intermediate_size": 128,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 32,
  "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6)";

std::string top(const std::string& extra) {
  return std::string("{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\",") + text_fields +
         extra + "}";
}

void expect_error(const std::string& json, Status s, const std::string& needle) {
  try {
    parse_model_config(json, "config.json");
    FAIL("accepted: " << needle);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.status() == s);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("top-level text config with rope_parameters", "[config]") {
  const auto c = parse_model_config(
      top(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
             "mrope_section": [11, 11, 10], "mrope_interleaved": true}, "eos_token_id": 5, "tie_word_embeddings": true)"),
      "t");
  CHECK(c.num_layers == 8);
  CHECK(c.rotary_dim == 8);
  CHECK(c.rope_theta == 1e7);
  CHECK(c.tie_word_embeddings);
  CHECK(c.layer_types[3] == LayerKind::full_attention);
  CHECK(c.layer_types[2] == LayerKind::linear_attention);
  CHECK(c.count_layers(LayerKind::full_attention) == 2);
  CHECK(c.eos_token_ids == std::vector<std::int32_t>{5});
  CHECK(c.ssm_state_dtype == DType::f32);
}

TEST_CASE("nested text_config (Qwen3_5ForConditionalGeneration) with eos at both levels", "[config]") {
  const std::string j = std::string(R"({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
      "eos_token_id": 7, "text_config": {"model_type": "qwen3_5_text", "eos_token_id": 6, "rope_theta": 1000000,
      "partial_rotary_factor": 0.5, "full_attention_interval": 2, "mamba_ssm_dtype": "float32",)") +
                        text_fields + "}}";
  const auto c = parse_model_config(j, "t");
  CHECK(c.architecture == "Qwen3_5ForConditionalGeneration");
  CHECK(c.rotary_dim == 16);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.layer_types[1] == LayerKind::full_attention);
  CHECK(c.layer_types[0] == LayerKind::linear_attention);
  CHECK(c.eos_token_ids == std::vector<std::int32_t>{6, 7});
}

TEST_CASE("every fixture config parses to the fixture README's shapes", "[config]") {
  const auto c = load_model_config(test::fixture_model("qwen35_cond_mtp"));
  CHECK(c.hidden_size == 48);
  CHECK(c.linear_num_value_heads == 6);
  CHECK(c.gdn_heads_per_key_head() == 3);
  CHECK(c.layer_types == std::vector<LayerKind>{LayerKind::linear_attention, LayerKind::linear_attention,
                                                LayerKind::linear_attention, LayerKind::full_attention});
  CHECK(c.mtp_num_hidden_layers == 1);
  const auto n = load_model_config(test::fixture_model("qwen3next_dense"));
  CHECK(n.gdn_layout == GdnProjectionLayout::fused_per_key_group);
}

TEST_CASE("unsupported models are refused by name", "[config]") {
  expect_error(R"({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": {}})", Status::unsupported_model,
               "'architectures'");
  expect_error(R"({"architectures": ["LlamaForCausalLM"]})", Status::unsupported_model, "LlamaForCausalLM");
  expect_error(R"({"model_type": "qwen3_5_moe_text"})", Status::unsupported_model, "mixture-of-experts");
  expect_error(std::string(R"({"architectures": ["Qwen3NextForCausalLM"], "num_experts": 512, )") + text_fields + "}",
               Status::unsupported_model, "'num_experts'");
  expect_error(top(R"(, "hidden_act": "gelu")"), Status::unsupported_model, "'hidden_act'");
  expect_error(top(R"(, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6})"), Status::unsupported_model,
               "rope_parameters.rope_type");
  expect_error(top(R"(, "mamba_ssm_dtype": "float16")"), Status::unsupported_model, "'mamba_ssm_dtype'");
}

TEST_CASE("malformed or inconsistent configs name the field", "[config]") {
  expect_error("{nope", Status::invalid_file, "not valid JSON");
  expect_error(R"({"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64})", Status::invalid_file,
               "'num_hidden_layers' is missing");
  expect_error(R"({"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": "64"})", Status::invalid_file,
               "'hidden_size' must be an integer");
  expect_error(R"({"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": -4})", Status::invalid_file,
               "'hidden_size' must be a positive size");
  expect_error(top(R"(, "layer_types": ["linear_attention"])"), Status::invalid_file, "lists 1 layers");
  expect_error(top(R"(, "layer_types": ["linear_attention","linear_attention","linear_attention","sliding",
                   "linear_attention","linear_attention","linear_attention","full_attention"])"),
               Status::unsupported_model, "'sliding'");
  expect_error(top(R"(, "partial_rotary_factor": 0.01)"), Status::invalid_file, "'partial_rotary_factor'");
  expect_error(top(R"(, "eos_token_id": 9999)"), Status::invalid_file, "outside the vocabulary");
  expect_error(top(R"(, "tie_word_embeddings": "yes")"), Status::invalid_file, "'tie_word_embeddings' must be true or false");
  expect_error(top(R"(, "max_position_embeddings": -14096)"), Status::invalid_file, "'max_position_embeddings' must be 0 or more");
  expect_error(R"({"architectures": "Qwen3_5ForCausalLM"})", Status::invalid_file, "'architectures'");
}
