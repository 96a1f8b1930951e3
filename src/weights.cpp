#include "gdn/model/weights.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/model/model.hpp"
#include "gdn/io/safetensors.hpp"

namespace gdn {
namespace {

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

std::string shape_of(std::initializer_list<std::int64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (auto d : dims) {
    s += fmt::format("{}{}", first ? "" : ", ", d);
    first = false;
  }
  return s + "]";
}

class Binder {
 public:
  Binder(const io::Checkpoint& ckpt, ModelWeights& out) : ckpt_(ckpt), out_(out) {}

  TensorView tensor(const std::string& name, std::initializer_list<std::int64_t> dims) {
    TensorView t = ckpt_.get(name);
    bool ok = t.rank == static_cast<int>(dims.size());
    int i = 0;
    for (auto d : dims) ok = ok && i < t.rank && t.dim(i++) == d;
    if (!ok)
      throw Error(Status::tensor_mismatch, fmt::format("{}: tensor '{}' has shape {} but the config implies {}",
                                                       ckpt_.dir(), name, shape_string(t), shape_of(dims)));
    if (!is_float(t.dtype))
      throw Error(Status::tensor_mismatch, fmt::format("{}: tensor '{}' has dtype {}; BF16, F16 or F32 expected",
                                                       ckpt_.dir(), name, dtype_name(t.dtype)));
    return t;
  }

  LinearWeight matrix(const std::string& name, std::int64_t out, std::int64_t in) {
    TensorView t = tensor(name, {out, in});
    const auto align = dtype_size(t.dtype);
    if (reinterpret_cast<std::uintptr_t>(t.data) % align != 0) {
      // safetensors does not promise alignment; kernels need it, so copy the rare odd tensor.
      auto copy = std::make_unique<std::byte[]>(t.nbytes());
      std::memcpy(copy.get(), t.data, t.nbytes());
      t.data = copy.get();
      out_.realigned.push_back(std::move(copy));
    }
    return LinearWeight{t};
  }

  std::vector<float> floats(const TensorView& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::byte* p = t.data + i * dtype_size(t.dtype);
      switch (t.dtype) {
        case DType::f32: { float f; std::memcpy(&f, p, 4); v[i] = f; break; }
        case DType::bf16: { bf16 h; std::memcpy(&h, p, 2); v[i] = to_float(h); break; }
        case DType::f16: { f16 h; std::memcpy(&h, p, 2); v[i] = to_float(h); break; }
        default: break;
      }
    }
    return v;
  }

  std::vector<float> vec(const std::string& name, std::int64_t n) { return floats(tensor(name, {n})); }

  // Zero-centred norm: the kernels take 1 + w, computed in float32 as transformers does.
  std::vector<float> norm_scale(const std::string& name, std::int64_t n) {
    auto v = vec(name, n);
    for (auto& x : v) x = 1.0f + x;
    return v;
  }

 private:
  const io::Checkpoint& ckpt_;
  ModelWeights& out_;
};

AttentionWeights bind_attention(Binder& b, const ModelConfig& c, const std::string& p) {
  AttentionWeights a;
  a.q_proj = b.matrix(p + "q_proj.weight", 2LL * c.attn_q_dim(), c.hidden_size);
  a.k_proj = b.matrix(p + "k_proj.weight", c.attn_kv_dim(), c.hidden_size);
  a.v_proj = b.matrix(p + "v_proj.weight", c.attn_kv_dim(), c.hidden_size);
  a.o_proj = b.matrix(p + "o_proj.weight", c.hidden_size, c.attn_q_dim());
  a.q_norm_scale = b.norm_scale(p + "q_norm.weight", c.head_dim);
  a.k_norm_scale = b.norm_scale(p + "k_norm.weight", c.head_dim);
  return a;
}

GatedDeltaNetWeights bind_gdn(Binder& b, const ModelConfig& c, const std::string& p) {
  GatedDeltaNetWeights g;
  const std::int64_t H = c.hidden_size, Hv = c.linear_num_value_heads;
  if (c.gdn_layout == GdnProjectionLayout::separate) {
    g.in_proj_qkv = b.matrix(p + "in_proj_qkv.weight", c.gdn_conv_dim(), H);
    g.in_proj_z = b.matrix(p + "in_proj_z.weight", c.gdn_value_dim(), H);
    g.in_proj_b = b.matrix(p + "in_proj_b.weight", Hv, H);
    g.in_proj_a = b.matrix(p + "in_proj_a.weight", Hv, H);
  } else {
    g.in_proj_qkvz = b.matrix(p + "in_proj_qkvz.weight", 2LL * c.gdn_key_dim() + 2LL * c.gdn_value_dim(), H);
    g.in_proj_ba = b.matrix(p + "in_proj_ba.weight", 2 * Hv, H);
  }
  g.conv1d = b.tensor(p + "conv1d.weight", {c.gdn_conv_dim(), 1, c.linear_conv_kernel_dim});
  g.neg_exp_A = b.vec(p + "A_log", Hv);
  for (auto& x : g.neg_exp_A) x = -std::exp(x);
  g.dt_bias = b.vec(p + "dt_bias", Hv);
  g.norm = b.vec(p + "norm.weight", c.linear_value_head_dim);
  g.out_proj = b.matrix(p + "out_proj.weight", H, c.gdn_value_dim());
  return g;
}

MlpWeights bind_mlp(Binder& b, const ModelConfig& c, const std::string& p) {
  MlpWeights m;
  m.gate_proj = b.matrix(p + "gate_proj.weight", c.intermediate_size, c.hidden_size);
  m.up_proj = b.matrix(p + "up_proj.weight", c.intermediate_size, c.hidden_size);
  m.down_proj = b.matrix(p + "down_proj.weight", c.hidden_size, c.intermediate_size);
  return m;
}

DecoderLayerWeights bind_layer(Binder& b, const ModelConfig& c, const std::string& p, LayerKind kind) {
  DecoderLayerWeights l;
  l.kind = kind;
  l.input_norm_scale = b.norm_scale(p + "input_layernorm.weight", c.hidden_size);
  l.post_attention_norm_scale = b.norm_scale(p + "post_attention_layernorm.weight", c.hidden_size);
  if (kind == LayerKind::linear_attention) l.gdn = bind_gdn(b, c, p + "linear_attn.");
  else l.attn = bind_attention(b, c, p + "self_attn.");
  l.mlp = bind_mlp(b, c, p + "mlp.");
  return l;
}

}  // namespace

namespace {

void add_layer(const DecoderLayerWeights& l, std::vector<const LinearWeight*>& out) {
  for (const LinearWeight* w : {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b, &l.gdn.in_proj_a,
                                &l.gdn.in_proj_qkvz, &l.gdn.in_proj_ba, &l.gdn.out_proj, &l.attn.q_proj, &l.attn.k_proj,
                                &l.attn.v_proj, &l.attn.o_proj, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj})
    if (!w->empty()) out.push_back(w);
}

}  // namespace

std::vector<const LinearWeight*> ModelWeights::projections(bool include_mtp) const {
  std::vector<const LinearWeight*> out;
  for (const auto& l : layers) add_layer(l, out);
  out.push_back(&lm_head);
  if (mtp && include_mtp) {
    out.push_back(&mtp->fc);
    add_layer(mtp->layer, out);
  }
  return out;
}

namespace {

// more_bits: a decoder layer q4_k_m gives more bits (quant_more_bits_layer): its attention v_proj,
// GDN in_proj_qkv / in_proj_qkvz and MLP down_proj are marked (cpu::more_bits_projection agrees).
void layer_specs(const ModelConfig& c, const std::string& p, LayerKind kind, std::vector<TensorSpec>& out, bool more_bits = false) {
  const std::int64_t H = c.hidden_size, Hv = c.linear_num_value_heads;
  const auto vec = [&](const std::string& n, std::int64_t d) { out.push_back({p + n, {d}, false, false}); };
  const auto mat = [&](const std::string& n, std::int64_t rows, std::int64_t cols) {
    const bool more = more_bits && (n == "self_attn.v_proj.weight" || n == "linear_attn.in_proj_qkv.weight" ||
                                    n == "linear_attn.in_proj_qkvz.weight" || n == "mlp.down_proj.weight");
    out.push_back({p + n, {rows, cols}, true, false, false, more});
  };
  vec("input_layernorm.weight", H);
  vec("post_attention_layernorm.weight", H);
  if (kind == LayerKind::linear_attention) {
    if (c.gdn_layout == GdnProjectionLayout::separate) {
      mat("linear_attn.in_proj_qkv.weight", c.gdn_conv_dim(), H);
      mat("linear_attn.in_proj_z.weight", c.gdn_value_dim(), H);
      mat("linear_attn.in_proj_b.weight", Hv, H);
      mat("linear_attn.in_proj_a.weight", Hv, H);
    } else {
      mat("linear_attn.in_proj_qkvz.weight", 2LL * c.gdn_key_dim() + 2LL * c.gdn_value_dim(), H);
      mat("linear_attn.in_proj_ba.weight", 2 * Hv, H);
    }
    out.push_back({p + "linear_attn.conv1d.weight", {c.gdn_conv_dim(), 1, c.linear_conv_kernel_dim}, false, false});
    vec("linear_attn.A_log", Hv);
    vec("linear_attn.dt_bias", Hv);
    vec("linear_attn.norm.weight", c.linear_value_head_dim);
    mat("linear_attn.out_proj.weight", H, c.gdn_value_dim());
  } else {
    mat("self_attn.q_proj.weight", 2LL * c.attn_q_dim(), H);
    mat("self_attn.k_proj.weight", c.attn_kv_dim(), H);
    mat("self_attn.v_proj.weight", c.attn_kv_dim(), H);
    mat("self_attn.o_proj.weight", H, c.attn_q_dim());
    vec("self_attn.q_norm.weight", c.head_dim);
    vec("self_attn.k_norm.weight", c.head_dim);
  }
  mat("mlp.gate_proj.weight", c.intermediate_size, H);
  mat("mlp.up_proj.weight", c.intermediate_size, H);
  mat("mlp.down_proj.weight", H, c.intermediate_size);
}

}  // namespace

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c, const std::string& prefix, bool mtp) {
  std::vector<TensorSpec> out;
  const std::int64_t V = c.vocab_size, H = c.hidden_size;
  out.push_back({prefix + "embed_tokens.weight", {V, H}, false, false});
  for (int i = 0; i < c.num_layers; ++i)
    layer_specs(c, fmt::format("{}layers.{}.", prefix, i), c.layer_types[static_cast<std::size_t>(i)], out,
                quant_more_bits_layer(i, c.num_layers));
  out.push_back({prefix + "norm.weight", {H}, false, false});
  if (c.tie_word_embeddings) out.push_back({prefix + "embed_tokens.weight", {V, H}, true, true, true});
  else out.push_back({"lm_head.weight", {V, H}, true, false, true});
  if (mtp && c.mtp_num_hidden_layers > 0) {
    out.push_back({"mtp.fc.weight", {H, 2 * H}, true, false});
    out.push_back({"mtp.pre_fc_norm_embedding.weight", {H}, false, false});
    out.push_back({"mtp.pre_fc_norm_hidden.weight", {H}, false, false});
    out.push_back({"mtp.norm.weight", {H}, false, false});
    layer_specs(c, "mtp.layers.0.", LayerKind::full_attention, out);
  }
  return out;
}

ModelWeights bind_weights(const io::Checkpoint& ckpt, const ModelConfig& c, bool load_mtp) {
  ModelWeights w;
  Binder b(ckpt, w);
  for (const char* candidate : {"model.language_model.", "model.", ""}) {
    if (ckpt.contains(std::string(candidate) + "embed_tokens.weight")) {
      w.prefix = candidate;
      break;
    }
  }
  if (!ckpt.contains(w.prefix + "embed_tokens.weight"))
    throw Error(Status::missing_tensor,
                fmt::format("{}: no embedding found (looked for model.language_model.embed_tokens.weight and "
                            "model.embed_tokens.weight)",
                            ckpt.dir()));
  const std::int64_t V = c.vocab_size, H = c.hidden_size;
  w.embed_tokens = b.matrix(w.prefix + "embed_tokens.weight", V, H).w;
  w.layers.reserve(static_cast<std::size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i)
    w.layers.push_back(bind_layer(b, c, fmt::format("{}layers.{}.", w.prefix, i), c.layer_types[static_cast<std::size_t>(i)]));
  w.final_norm_scale = b.norm_scale(w.prefix + "norm.weight", H);
  if (c.tie_word_embeddings) {
    w.lm_head = LinearWeight{w.embed_tokens};
  } else {
    w.lm_head = b.matrix("lm_head.weight", V, H);
  }
  if (load_mtp && c.mtp_num_hidden_layers > 0 && ckpt.contains("mtp.fc.weight")) {
    MtpWeights m;
    m.fc = b.matrix("mtp.fc.weight", H, 2 * H);
    m.pre_fc_norm_embedding_scale = b.norm_scale("mtp.pre_fc_norm_embedding.weight", H);
    m.pre_fc_norm_hidden_scale = b.norm_scale("mtp.pre_fc_norm_hidden.weight", H);
    m.norm_scale = b.norm_scale("mtp.norm.weight", H);
    m.layer = bind_layer(b, c, "mtp.layers.0.", LayerKind::full_attention);
    w.mtp = std::move(m);
  }
  return w;
}

}  // namespace gdn
