// The shaped checkpoints of checkpoints.hpp.

#include "checkpoints.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/core/dtype.hpp"
#include "gdn/core/error.hpp"

namespace gdn::cli {
namespace {
using json = nlohmann::json;
}  // namespace

Shape shape_for(std::string_view name) {
  // Qwen3.5-0.8B and -2B (shared/spec/qwen3_5-detailed.md §1.2): every 4th layer full attention.
  if (name == "0.8b") return {"qwen3.5-0.8b", 24, 1024, 8, 2, 256, 3584, 16, 16, 128, 248320, true};
  if (name == "2b") return {"qwen3.5-2b", 24, 2048, 8, 2, 256, 6144, 16, 16, 128, 248320, true};
  // Qwen3.6-27B (64 layers, untied embeddings; its MTP head is left out: the benchmarks do not use it).
  if (name == "27b") return {"qwen3.6-27b", 64, 5120, 24, 4, 256, 17408, 16, 48, 128, 248320, false};
  // A tiny shape for smoke tests of the tool itself.
  if (name == "tiny") return {"tiny", 4, 128, 2, 1, 64, 256, 2, 2, 32, 512, true};
  throw Error(Status::invalid_argument, fmt::format("--shape: '{}' is not 0.8b, 2b, 27b or tiny", name));
}

namespace {

class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    std::vector<std::int64_t> shape;
    int kind;  // 0 matrix (normal), 1 zero-centred norm (zeros), 2 ones, 3 A_log, 4 conv, 5 dt_bias
    double std;
  };
  void add(std::string name, std::vector<std::int64_t> shape, int kind, double std = 0.0) {
    entries_.push_back({std::move(name), std::move(shape), kind, std});
  }
  void write(const std::filesystem::path& file, std::uint64_t seed, bool sparse) const {
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}};
    std::uint64_t off = 0;
    for (const auto& e : entries_) {
      const std::uint64_t n = numel(e) * 2;
      header[e.name] = {{"dtype", "BF16"}, {"shape", e.shape}, {"data_offsets", {off, off + n}}};
      off += n;
    }
    std::string h = header.dump();
    while ((h.size() + 8) % 8) h.push_back(' ');
    std::FILE* f = std::fopen(file.c_str(), "wb");
    if (!f) throw Error(Status::io_error, fmt::format("cannot write {}", file.string()));
    const std::uint64_t hn = h.size();
    std::fwrite(&hn, 8, 1, f);
    std::fwrite(h.data(), 1, h.size(), f);
    if (sparse) {
      // Every tensor at its full size, nothing written: a hole the file system reads back as zeros.
      const bool ok = std::fflush(f) == 0 && ::ftruncate(::fileno(f), static_cast<off_t>(8 + hn + off)) == 0;
      if (std::fclose(f) != 0 || !ok) throw Error(Status::io_error, fmt::format("cannot write {}", file.string()));
      return;
    }
    std::vector<std::uint16_t> buf(1 << 20);
    std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&state] {  // xorshift64*
      state ^= state >> 12;
      state ^= state << 25;
      state ^= state >> 27;
      return state * 0x2545F4914F6CDD1Dull;
    };
    auto uniform = [&] { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); };  // [0, 1)
    for (const auto& e : entries_) {
      std::uint64_t left = numel(e);
      while (left > 0) {
        const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(left, buf.size()));
        for (std::size_t i = 0; i < m; ++i) {
          float v = 0.0f;
          switch (e.kind) {
            case 0: v = static_cast<float>((2.0 * uniform() - 1.0) * e.std * std::sqrt(3.0)); break;  // uniform, same std
            case 1: v = 0.0f; break;
            case 2: v = 1.0f; break;
            case 3: v = std::log(1.0f + 15.0f * uniform()); break;  // HF init: A ~ U(1, 16)... log
            case 4: v = static_cast<float>((2.0 * uniform() - 1.0) * 0.5); break;
            case 5: v = 1.0f; break;
          }
          buf[i] = to_bf16(v).bits;
        }
        std::fwrite(buf.data(), 2, m, f);
        left -= m;
      }
    }
    if (std::fclose(f) != 0) throw Error(Status::io_error, fmt::format("cannot write {}", file.string()));
  }

 private:
  static std::uint64_t numel(const Entry& e) {
    std::uint64_t n = 1;
    for (auto d : e.shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
  std::vector<Entry> entries_;
};

}  // namespace

void make_checkpoint(const Shape& s, const std::filesystem::path& dir, bool sparse) {
  std::filesystem::create_directories(dir);
  json layer_types = json::array();
  for (int l = 0; l < s.layers; ++l) layer_types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  const json config = {
      {"architectures", {"Qwen3_5ForCausalLM"}},
      {"model_type", "qwen3_5_text"},
      {"attention_bias", false},
      {"dtype", "bfloat16"},
      {"eos_token_id", std::min(248044, s.vocab - 1)},
      {"head_dim", s.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", s.hidden},
      {"initializer_range", 0.02},
      {"intermediate_size", s.ffn},
      {"layer_types", layer_types},
      {"full_attention_interval", 4},
      {"linear_conv_kernel_dim", 4},
      {"linear_key_head_dim", s.lin_dim},
      {"linear_num_key_heads", s.lin_k_heads},
      {"linear_num_value_heads", s.lin_v_heads},
      {"linear_value_head_dim", s.lin_dim},
      {"max_position_embeddings", 262144},
      {"num_attention_heads", s.q_heads},
      {"num_hidden_layers", s.layers},
      {"num_key_value_heads", s.kv_heads},
      {"rms_norm_eps", 1e-6},
      {"rope_parameters",
       {{"mrope_interleaved", true}, {"mrope_section", {11, 11, 10}}, {"partial_rotary_factor", 0.25},
        {"rope_theta", 10000000.0}, {"rope_type", "default"}}},
      {"tie_word_embeddings", s.tied},
      {"vocab_size", s.vocab},
      {"mamba_ssm_dtype", "float32"},
  };
  SafetensorsWriter w;
  const std::int64_t H = s.hidden;
  const double std_w = 0.02;
  w.add("model.embed_tokens.weight", {s.vocab, H}, 0, std_w);
  const std::int64_t key_dim = std::int64_t{s.lin_k_heads} * s.lin_dim, val_dim = std::int64_t{s.lin_v_heads} * s.lin_dim;
  const std::int64_t conv_dim = 2 * key_dim + val_dim;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    w.add(p + "input_layernorm.weight", {H}, 1);
    w.add(p + "post_attention_layernorm.weight", {H}, 1);
    if ((l + 1) % 4 == 0) {
      const std::int64_t qd = std::int64_t{s.q_heads} * s.head_dim, kvd = std::int64_t{s.kv_heads} * s.head_dim;
      w.add(p + "self_attn.q_proj.weight", {2 * qd, H}, 0, std_w);
      w.add(p + "self_attn.k_proj.weight", {kvd, H}, 0, std_w);
      w.add(p + "self_attn.v_proj.weight", {kvd, H}, 0, std_w);
      w.add(p + "self_attn.o_proj.weight", {H, qd}, 0, std_w);
      w.add(p + "self_attn.q_norm.weight", {s.head_dim}, 1);
      w.add(p + "self_attn.k_norm.weight", {s.head_dim}, 1);
    } else {
      w.add(p + "linear_attn.in_proj_qkv.weight", {conv_dim, H}, 0, std_w);
      w.add(p + "linear_attn.in_proj_z.weight", {val_dim, H}, 0, std_w);
      w.add(p + "linear_attn.in_proj_b.weight", {s.lin_v_heads, H}, 0, std_w);
      w.add(p + "linear_attn.in_proj_a.weight", {s.lin_v_heads, H}, 0, std_w);
      w.add(p + "linear_attn.conv1d.weight", {conv_dim, 1, 4}, 4);
      w.add(p + "linear_attn.dt_bias", {s.lin_v_heads}, 5);
      w.add(p + "linear_attn.A_log", {s.lin_v_heads}, 3);
      w.add(p + "linear_attn.norm.weight", {s.lin_dim}, 2);
      w.add(p + "linear_attn.out_proj.weight", {H, val_dim}, 0, std_w);
    }
    w.add(p + "mlp.gate_proj.weight", {s.ffn, H}, 0, std_w);
    w.add(p + "mlp.up_proj.weight", {s.ffn, H}, 0, std_w);
    w.add(p + "mlp.down_proj.weight", {H, s.ffn}, 0, std_w);
  }
  w.add("model.norm.weight", {H}, 1);
  if (!s.tied) w.add("lm_head.weight", {s.vocab, H}, 0, std_w);
  const auto tmp = dir / "model.safetensors.tmp";
  w.write(tmp, 1234, sparse);
  std::filesystem::rename(tmp, dir / "model.safetensors");
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";
}


}  // namespace gdn::cli
