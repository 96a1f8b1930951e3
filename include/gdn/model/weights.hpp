#pragma once
// The weights of a model, bound from a checkpoint, in a backend-neutral form. Large matrices are
// views into the memory-mapped safetensors files (zero-copy); small per-channel vectors (norm
// weights, A_log, dt_bias) are converted to float32 once at load, in the form every backend's
// kernels use, because they are often stored in a different dtype from the matrices and are read on
// every token. How a backend lays the matrices out for its kernels (the CPU's packed images, a
// device copy) is the backend's business (src/backend/).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gdn/core/tensor.hpp"
#include "gdn/model/config.hpp"

namespace gdn {

namespace io { class Checkpoint; }

// A projection y = W·x with W stored [out, in].
struct LinearWeight {
  TensorView w;
  std::int64_t out() const noexcept { return w.dim(0); }
  std::int64_t in() const noexcept { return w.dim(1); }
  bool empty() const noexcept { return w.empty(); }
};

struct GatedDeltaNetWeights {
  // Separate layout (Qwen3.5/3.6).
  LinearWeight in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;
  // Fused layout (Qwen3-Next): rows interleaved per key-head group.
  LinearWeight in_proj_qkvz, in_proj_ba;
  TensorView conv1d;                // [conv_dim, 1, kernel] as stored; tap kernel-1 multiplies the current token
  std::vector<float> neg_exp_A;     // −exp(A_log) per value head
  std::vector<float> dt_bias;       // per value head
  std::vector<float> norm;          // gated RMSNorm weight [dv], used as is
  LinearWeight out_proj;
};

struct AttentionWeights {
  LinearWeight q_proj;   // [Hq·2·hd, H]: per head, hd query rows then hd gate rows
  LinearWeight k_proj, v_proj, o_proj;
  std::vector<float> q_norm_scale, k_norm_scale;  // 1 + w
};

struct MlpWeights {
  LinearWeight gate_proj, up_proj, down_proj;
};

struct DecoderLayerWeights {
  LayerKind kind = LayerKind::linear_attention;
  std::vector<float> input_norm_scale;  // 1 + w
  std::vector<float> post_attention_norm_scale;
  GatedDeltaNetWeights gdn;
  AttentionWeights attn;
  MlpWeights mlp;
};

// Multi-token prediction head: fc over [norm(embedding) ; norm(hidden)], one full-attention
// decoder layer, a final norm, and the main model's lm_head.
struct MtpWeights {
  LinearWeight fc;  // [H, 2H]
  std::vector<float> pre_fc_norm_embedding_scale, pre_fc_norm_hidden_scale, norm_scale;
  DecoderLayerWeights layer;
};

struct ModelWeights {
  TensorView embed_tokens;  // [V, H]
  std::vector<DecoderLayerWeights> layers;
  std::vector<float> final_norm_scale;
  LinearWeight lm_head;  // the embedding when tied
  std::optional<MtpWeights> mtp;
  std::string prefix;  // e.g. "model.language_model."
  // Copies of tensors whose data was not aligned to their element size in the file.
  std::vector<std::unique_ptr<std::byte[]>> realigned;

  // Every projection the model runs (the MTP head's too unless include_mtp is false).
  std::vector<const LinearWeight*> projections(bool include_mtp = true) const;
};

// A tensor the config implies, as bind_weights binds it.
struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  bool projection = false;  // a matrix the model multiplies by (what the CPU backend packs)
  bool alias = false;       // lm_head of a tied model: the embedding again (its bytes are not counted twice)
  bool lm_head = false;     // the output projection (its quantised format may differ: ModelParams::lm_head_quant)
  bool more_bits = false;   // a projection WeightQuant::q4_k_m keeps at q8_0
};
// Every tensor bind_weights(ckpt, cfg, mtp) binds, for a checkpoint whose language-model tensors
// start with `prefix` ("model.language_model.", "model." or ""), in binding order; with `mtp` the
// MTP head's too. Reads nothing: for memory plans and tools that must not load the weights.
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& cfg, const std::string& prefix, bool mtp);

// Checks every tensor the config implies (presence, dtype, shape) and binds it. Throws
// gdn::Error(missing_tensor | tensor_mismatch) naming the tensor. load_mtp=false skips mtp.*.
ModelWeights bind_weights(const io::Checkpoint& ckpt, const ModelConfig& cfg, bool load_mtp);

}  // namespace gdn
