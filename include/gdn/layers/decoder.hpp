#pragma once
// The model graph of Qwen3.5/3.6 and Qwen3-Next text models, composed of the layer objects, for a
// backend's kernel set K. A pass runs rows of several sequences at once (each sequence's rows are
// consecutive tokens at consecutive positions, continuing its state): every weight is read once per
// pass, whatever the number of sequences.
//
//   h ← embed(tokens)
//   per layer:  h ← h + mixer(rms_norm(h));  h ← h + mlp(rms_norm(h))     mixer = GDN or attention
//   hidden ← rms_norm(h), logits ← hidden · W_lm_headᵀ   for the rows that are outputs
//
// The multi-token-prediction (MTP) head predicts the token after next: for a token x whose
// position's predecessor had final hidden state hidden,
//   h ← [rms_norm(embed(x)) ; rms_norm(hidden)] · W_fcᵀ
//   one full-attention decoder layer (its own KV cache), then a final norm and the main lm_head.
//
// Every norm here is the zero-centred RMSNorm, y = x · rsqrt(mean(x²) + eps) · (1 + w): weights
// hold 1 + w precomputed (the classic trap is applying the +1 twice, or not at all).
//
// What K provides — types: Weights (layers[], mtp), GdnWeights, AttentionWeights, MlpWeights;
// steps: embed(w) (x ← embedding rows), norm(scale) (xn ← rms_norm(x)), add_and_norm(scale)
// (x ← x + out; xn ← rms_norm(x)), add() (x ← x + out), outputs(w, scale) (final norm and logits
// of the output rows), mtp_input(m) and mtp_fc(m), and the steps of the layer objects.

#include "gdn/layers/attention.hpp"
#include "gdn/layers/gated_delta_net.hpp"
#include "gdn/layers/mlp.hpp"
#include "gdn/model/config.hpp"

namespace gdn::layers {

template <typename K>
struct Decoder {
  // A main-model pass.
  static void forward(K& k, const typename K::Weights& w, const ModelConfig& c) {
    k.embed(w);
    int gdn_layer = 0, kv_layer = 0;
    for (int l = 0; l < c.num_layers; ++l) {
      const auto& lw = w.layers[static_cast<std::size_t>(l)];
      if (l == 0) k.norm(lw.input_norm_scale);
      if (lw.kind == LayerKind::linear_attention) GatedDeltaNet<K>::forward(k, lw.gdn, gdn_layer++);
      else GatedAttention<K>::forward(k, lw.attn, kv_layer++);
      k.add_and_norm(lw.post_attention_norm_scale);
      SwiGluMlp<K>::forward(k, lw.mlp);
      if (l + 1 < c.num_layers) k.add_and_norm(w.layers[static_cast<std::size_t>(l) + 1].input_norm_scale);
      else k.add();
    }
    k.outputs(w, w.final_norm_scale);
  }

  // An MTP-head pass. Its decoder layer's KV cache comes after the main model's attention layers.
  static void forward_mtp(K& k, const typename K::Weights& w, const ModelConfig& c) {
    const auto& m = *w.mtp;
    k.mtp_input(w, m);
    k.mtp_fc(m);
    k.norm(m.layer.input_norm_scale);
    GatedAttention<K>::forward(k, m.layer.attn, c.count_layers(LayerKind::full_attention));
    k.add_and_norm(m.layer.post_attention_norm_scale);
    SwiGluMlp<K>::forward(k, m.layer.mlp);
    k.add();
    k.outputs(w, m.norm_scale);
  }
};

}  // namespace gdn::layers
