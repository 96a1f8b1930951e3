#pragma once
// Small random checkpoints of any shape, written in the Hugging Face on-disk layout (config.json +
// model.safetensors, bf16 matrices, float32 vectors), for tests of sizes no fixture has: odd head
// dims, value heads of 600 or 1024, conv kernels of 1..8, 64 query heads per kv head, all-GDN or
// all-attention stacks, the Qwen3-Next fused projections. The weights are scaled so activations stay
// of order one through the layers (finite, non-degenerate logits), and are a function of the seed.

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gdn/model/config.hpp"
#include "safetensors_writer.hpp"

namespace gdn::test {

struct RandomModelSpec {
  int hidden = 32, vocab = 64, ffn = 48;
  std::vector<LayerKind> layers = {LayerKind::linear_attention, LayerKind::linear_attention, LayerKind::linear_attention,
                                   LayerKind::full_attention};
  int q_heads = 2, kv_heads = 1, head_dim = 16;
  double partial_rotary = 0.5;
  int lin_k_heads = 1, lin_v_heads = 2, lin_k_dim = 8, lin_v_dim = 8, conv_kernel = 4;
  bool tied = true, mtp = false;
  bool fused = false;  // Qwen3-Next's in_proj_qkvz / in_proj_ba
  std::uint64_t seed = 1;
};

inline nlohmann::json random_model_config(const RandomModelSpec& s) {
  nlohmann::json types = nlohmann::json::array();
  for (const auto k : s.layers) types.push_back(k == LayerKind::full_attention ? "full_attention" : "linear_attention");
  return {
      {"architectures", {s.fused ? "Qwen3NextForCausalLM" : "Qwen3_5ForCausalLM"}},
      {"model_type", s.fused ? "qwen3_next" : "qwen3_5_text"},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.ffn},
      {"num_hidden_layers", static_cast<int>(s.layers.size())},
      {"layer_types", types},
      {"vocab_size", s.vocab},
      {"num_attention_heads", s.q_heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"linear_num_key_heads", s.lin_k_heads},
      {"linear_num_value_heads", s.lin_v_heads},
      {"linear_key_head_dim", s.lin_k_dim},
      {"linear_value_head_dim", s.lin_v_dim},
      {"linear_conv_kernel_dim", s.conv_kernel},
      {"rms_norm_eps", 1e-6},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", s.partial_rotary}}},
      {"tie_word_embeddings", s.tied},
      {"mtp_num_hidden_layers", s.mtp ? 1 : 0},
      {"hidden_act", "silu"},
      {"mamba_ssm_dtype", "float32"},
  };
}

class RandomTensors {
 public:
  explicit RandomTensors(std::uint64_t seed) : rng_(seed) {}

  // bf16 [out, in], uniform with standard deviation gain / sqrt(in).
  void matrix(const std::string& name, std::int64_t out, std::int64_t in, double gain = 1.0) {
    const double a = gain * std::sqrt(3.0 / static_cast<double>(in));
    add(name, DType::bf16, {out, in}, [&] { return uniform(-a, a); });
  }
  void vector(const std::string& name, std::int64_t n, double lo, double hi) {
    add(name, DType::f32, {n}, [&] { return uniform(lo, hi); });
  }
  void tensor(const std::string& name, std::vector<std::int64_t> shape, double lo, double hi) {
    add(name, DType::f32, std::move(shape), [&] { return uniform(lo, hi); });
  }
  TensorMap& map() { return map_; }

 private:
  template <typename F>
  void add(const std::string& name, DType dtype, std::vector<std::int64_t> shape, F&& value) {
    TensorData t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.bytes.resize(static_cast<std::size_t>(t.numel()) * dtype_size(dtype));
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    for (auto& x : v) x = static_cast<float>(value());
    t.set_floats(v);
    map_[name] = std::move(t);
  }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }

  std::mt19937_64 rng_;
  TensorMap map_;
};

inline void random_layer(RandomTensors& r, const RandomModelSpec& s, const std::string& p, LayerKind kind) {
  const std::int64_t H = s.hidden;
  r.vector(p + "input_layernorm.weight", H, -0.1, 0.1);
  r.vector(p + "post_attention_layernorm.weight", H, -0.1, 0.1);
  if (kind == LayerKind::full_attention) {
    const std::int64_t qd = std::int64_t{s.q_heads} * s.head_dim, kvd = std::int64_t{s.kv_heads} * s.head_dim;
    r.matrix(p + "self_attn.q_proj.weight", 2 * qd, H);
    r.matrix(p + "self_attn.k_proj.weight", kvd, H);
    r.matrix(p + "self_attn.v_proj.weight", kvd, H);
    r.matrix(p + "self_attn.o_proj.weight", H, qd, 0.5);
    r.vector(p + "self_attn.q_norm.weight", s.head_dim, -0.1, 0.1);
    r.vector(p + "self_attn.k_norm.weight", s.head_dim, -0.1, 0.1);
  } else {
    const std::int64_t Kd = std::int64_t{s.lin_k_heads} * s.lin_k_dim, Vd = std::int64_t{s.lin_v_heads} * s.lin_v_dim;
    const std::int64_t C = 2 * Kd + Vd, Hv = s.lin_v_heads;
    const std::string q = p + "linear_attn.";
    if (s.fused) {
      r.matrix(q + "in_proj_qkvz.weight", 2 * Kd + 2 * Vd, H);
      r.matrix(q + "in_proj_ba.weight", 2 * Hv, H);
    } else {
      r.matrix(q + "in_proj_qkv.weight", C, H);
      r.matrix(q + "in_proj_z.weight", Vd, H);
      r.matrix(q + "in_proj_b.weight", Hv, H);
      r.matrix(q + "in_proj_a.weight", Hv, H);
    }
    r.tensor(q + "conv1d.weight", {C, 1, s.conv_kernel}, -0.6, 0.6);
    r.vector(q + "A_log", Hv, 0.0, std::log(16.0));
    r.vector(q + "dt_bias", Hv, -1.0, 1.0);
    r.vector(q + "norm.weight", s.lin_v_dim, 0.8, 1.2);
    r.matrix(q + "out_proj.weight", H, Vd, 0.5);
  }
  r.matrix(p + "mlp.gate_proj.weight", s.ffn, H);
  r.matrix(p + "mlp.up_proj.weight", s.ffn, H);
  r.matrix(p + "mlp.down_proj.weight", H, s.ffn, 0.5);
}

// Writes the checkpoint into `dir` (which must exist).
inline void write_random_checkpoint(const RandomModelSpec& s, const std::string& dir) {
  RandomTensors r(s.seed);
  const std::int64_t H = s.hidden;
  r.matrix("model.embed_tokens.weight", s.vocab, H, std::sqrt(static_cast<double>(H)));
  for (std::size_t l = 0; l < s.layers.size(); ++l) random_layer(r, s, "model.layers." + std::to_string(l) + ".", s.layers[l]);
  r.vector("model.norm.weight", H, -0.1, 0.1);
  if (!s.tied) r.matrix("lm_head.weight", s.vocab, H, 2.0);
  if (s.mtp) {
    r.matrix("mtp.fc.weight", H, 2 * H);
    r.vector("mtp.pre_fc_norm_embedding.weight", H, -0.1, 0.1);
    r.vector("mtp.pre_fc_norm_hidden.weight", H, -0.1, 0.1);
    r.vector("mtp.norm.weight", H, -0.1, 0.1);
    random_layer(r, s, "mtp.layers.0.", LayerKind::full_attention);
  }
  std::ofstream(std::filesystem::path(dir) / "config.json") << random_model_config(s).dump(2);
  write_safetensors((std::filesystem::path(dir) / "model.safetensors").string(), r.map());
}

}  // namespace gdn::test
