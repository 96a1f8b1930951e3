// Checkpoints with real models' shapes (checkpoints.hpp).

#include "checkpoints.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/core/dtype.hpp"
#include "gdn/core/error.hpp"

namespace gdn::cli {
namespace {

using json = nlohmann::json;

struct Entry {
  std::string name;
  std::vector<std::int64_t> shape;
  int kind;  // 0 matrix (uniform of std `std`), 1 zero-centred norm (zeros), 2 ones, 3 A_log, 4 conv, 5 dt_bias
  double std;
  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

// The random stream is one xorshift64* sequence over the entries in order, whichever file they
// land in, so a sharded checkpoint holds the same values as a single-file one.
class Values {
 public:
  explicit Values(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  void fill(const Entry& e, std::uint16_t* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      float v = 0.0f;
      switch (e.kind) {
        case 0: v = static_cast<float>((2.0 * uniform() - 1.0) * e.std * std::sqrt(3.0)); break;  // uniform, same std
        case 1: v = 0.0f; break;
        case 2: v = 1.0f; break;
        case 3: v = std::log(1.0f + 15.0f * uniform()); break;  // A in (1, 16), as HF initialises it
        case 4: v = static_cast<float>((2.0 * uniform() - 1.0) * 0.5); break;
        case 5: v = 1.0f; break;
      }
      out[i] = to_bf16(v).bits;
    }
  }

 private:
  std::uint64_t next() {  // xorshift64*
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }  // [0, 1)
  std::uint64_t state_;
};

// One safetensors file of `entries` (all BF16); sparse: the data section is a hole.
void write_file(const std::filesystem::path& file, const std::vector<const Entry*>& entries, bool sparse, Values& values) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t off = 0;
  for (const Entry* e : entries) {
    const std::uint64_t n = e->numel() * 2;
    header[e->name] = {{"dtype", "BF16"}, {"shape", e->shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (!f) throw Error(Status::io_error, fmt::format("cannot write {}", file.string()));
  const std::uint64_t hn = h.size();
  bool ok = std::fwrite(&hn, 8, 1, f) == 1 && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  if (sparse) {
    ok = ok && std::fflush(f) == 0 && ::ftruncate(::fileno(f), static_cast<off_t>(8 + hn + off)) == 0;
  } else {
    std::vector<std::uint16_t> buf(1 << 20);
    for (const Entry* e : entries) {
      std::uint64_t left = e->numel();
      while (left > 0 && ok) {
        const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(left, buf.size()));
        values.fill(*e, buf.data(), m);
        ok = std::fwrite(buf.data(), 2, m, f) == m;
        left -= m;
      }
    }
  }
  if (std::fclose(f) != 0 || !ok) throw Error(Status::io_error, fmt::format("cannot write {}", file.string()));
}

std::vector<Entry> entries_of(const Shape& s) {
  std::vector<Entry> out;
  const auto add = [&](std::string name, std::vector<std::int64_t> shape, int kind, double sd = 0.0) {
    out.push_back({std::move(name), std::move(shape), kind, sd});
  };
  const std::string pre = s.multimodal ? "model.language_model." : "model.";
  const std::int64_t H = s.hidden;
  const double std_w = 0.02;
  const std::int64_t key_dim = std::int64_t{s.lin_k_heads} * s.lin_dim, val_dim = std::int64_t{s.lin_v_heads} * s.lin_dim;
  const std::int64_t conv_dim = 2 * key_dim + val_dim;
  const std::int64_t qd = std::int64_t{s.q_heads} * s.head_dim, kvd = std::int64_t{s.kv_heads} * s.head_dim;
  const auto attention = [&](const std::string& p) {
    add(p + "self_attn.q_proj.weight", {2 * qd, H}, 0, std_w);
    add(p + "self_attn.k_proj.weight", {kvd, H}, 0, std_w);
    add(p + "self_attn.v_proj.weight", {kvd, H}, 0, std_w);
    add(p + "self_attn.o_proj.weight", {H, qd}, 0, std_w);
    add(p + "self_attn.q_norm.weight", {s.head_dim}, 1);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, 1);
  };
  const auto mlp = [&](const std::string& p) {
    add(p + "mlp.gate_proj.weight", {s.ffn, H}, 0, std_w);
    add(p + "mlp.up_proj.weight", {s.ffn, H}, 0, std_w);
    add(p + "mlp.down_proj.weight", {H, s.ffn}, 0, std_w);
  };
  add(pre + "embed_tokens.weight", {s.vocab, H}, 0, std_w);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.", pre, l);
    add(p + "input_layernorm.weight", {H}, 1);
    add(p + "post_attention_layernorm.weight", {H}, 1);
    if ((l + 1) % 4 == 0) {
      attention(p);
    } else {
      add(p + "linear_attn.in_proj_qkv.weight", {conv_dim, H}, 0, std_w);
      add(p + "linear_attn.in_proj_z.weight", {val_dim, H}, 0, std_w);
      add(p + "linear_attn.in_proj_b.weight", {s.lin_v_heads, H}, 0, std_w);
      add(p + "linear_attn.in_proj_a.weight", {s.lin_v_heads, H}, 0, std_w);
      add(p + "linear_attn.conv1d.weight", {conv_dim, 1, 4}, 4);
      add(p + "linear_attn.dt_bias", {s.lin_v_heads}, 5);
      add(p + "linear_attn.A_log", {s.lin_v_heads}, 3);
      add(p + "linear_attn.norm.weight", {s.lin_dim}, 2);
      add(p + "linear_attn.out_proj.weight", {H, val_dim}, 0, std_w);
    }
    mlp(p);
  }
  add(pre + "norm.weight", {H}, 1);
  if (!s.tied) add("lm_head.weight", {s.vocab, H}, 0, std_w);
  if (s.mtp) {
    add("mtp.fc.weight", {H, 2 * H}, 0, std_w);
    add("mtp.pre_fc_norm_embedding.weight", {H}, 1);
    add("mtp.pre_fc_norm_hidden.weight", {H}, 1);
    add("mtp.norm.weight", {H}, 1);
    add("mtp.layers.0.input_layernorm.weight", {H}, 1);
    add("mtp.layers.0.post_attention_layernorm.weight", {H}, 1);
    attention("mtp.layers.0.");
    mlp("mtp.layers.0.");
  }
  return out;
}

json config_of(const Shape& s) {
  json layer_types = json::array();
  for (int l = 0; l < s.layers; ++l) layer_types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  json text = {
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
        {"rope_theta", s.rope_theta}, {"rope_type", "default"}}},
      {"tie_word_embeddings", s.tied},
      {"vocab_size", s.vocab},
      {"mamba_ssm_dtype", "float32"},
      {"mtp_num_hidden_layers", s.mtp ? 1 : 0},
  };
  if (!s.multimodal) {
    text["architectures"] = {"Qwen3_5ForCausalLM"};
    return text;
  }
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
          {"model_type", "qwen3_5"},
          {"tie_word_embeddings", s.tied},
          {"text_config", text}};
}

}  // namespace

Shape shape_for(std::string_view name) {
  // Qwen3.5-0.8B and -2B (shared/spec/qwen3_5-detailed.md §1.2): every 4th layer full attention.
  if (name == "0.8b") return {"qwen3.5-0.8b", 24, 1024, 8, 2, 256, 3584, 16, 16, 128, 248320, true};
  if (name == "2b") return {"qwen3.5-2b", 24, 2048, 8, 2, 256, 6144, 16, 16, 128, 248320, true};
  // Qwen3.6-27B: 866 bf16 tensors (language model and MTP head), 54.6 GB.
  if (name == "27b") return {"qwen3.6-27b", 64, 5120, 24, 4, 256, 17408, 16, 48, 128, 248320, false, true, true};
  // A tiny shape for smoke tests of the tool itself.
  if (name == "tiny") return {"tiny", 4, 128, 2, 1, 64, 256, 2, 2, 32, 512, true};
  throw Error(Status::invalid_argument, fmt::format("--shape: '{}' is not 0.8b, 2b, 27b or tiny", name));
}

void make_checkpoint(const Shape& s, const std::filesystem::path& dir, const CheckpointOptions& o) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const std::vector<Entry> entries = entries_of(s);
  const int shards = std::max(1, o.shards);
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e.numel() * 2;
  // Consecutive tensors, each shard holding about total / shards bytes (a tensor is never split).
  std::vector<std::vector<const Entry*>> files(static_cast<std::size_t>(shards));
  std::uint64_t at = 0;
  for (const auto& e : entries) {
    const auto k = std::min<std::uint64_t>(static_cast<std::uint64_t>(shards) - 1, at * static_cast<std::uint64_t>(shards) / total);
    files[static_cast<std::size_t>(k)].push_back(&e);
    at += e.numel() * 2;
  }
  Values values(o.seed);
  json weight_map = json::object();
  std::vector<std::string> names;
  for (int k = 0; k < shards; ++k) {
    const std::string name = shards == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards);
    names.push_back(name);
    for (const Entry* e : files[static_cast<std::size_t>(k)]) weight_map[e->name] = name;
    const fs::path tmp = dir / (name + ".tmp");
    write_file(tmp, files[static_cast<std::size_t>(k)], o.sparse, values);
    fs::rename(tmp, dir / name);
  }
  if (shards > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream(dir / "model.safetensors.index.json") << index.dump(2) << "\n";
  }
  std::ofstream(dir / "config.json") << config_of(s).dump(2) << "\n";
}

int make_checkpoint_command(int argc, char** argv) {
  const auto usage = [] {
    std::fputs("usage: gdn make-checkpoint --shape 0.8b|2b|27b|tiny [--sparse] [--shards N] [--seed S] DIR\n"
               "  writes a random-weight (or, with --sparse, all-zero and sparse on disk) bf16 checkpoint with the\n"
               "  exact tensor shapes of the model, in the Hugging Face layout\n",
               stderr);
    return 2;
  };
  std::string shape, dir;
  CheckpointOptions o;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--shape" && v) shape = argv[++i];
    else if (a == "--sparse") o.sparse = true;
    else if (a == "--shards" && v) o.shards = std::atoi(argv[++i]);
    else if (a == "--seed" && v) o.seed = std::strtoull(argv[++i], nullptr, 10);
    else if (!a.empty() && a[0] != '-' && dir.empty()) dir = std::string(a);
    else return usage();
  }
  if (shape.empty() || dir.empty() || o.shards < 1) return usage();
  const Shape s = shape_for(shape);
  const auto t0 = std::chrono::steady_clock::now();
  make_checkpoint(s, dir, o);
  fmt::print(stderr, "wrote a {}{} checkpoint ({} file{}) to {} in {:.1f} s\n", o.sparse ? "sparse, all-zero " : "random ", s.name,
             o.shards, o.shards == 1 ? "" : "s", dir,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace gdn::cli
