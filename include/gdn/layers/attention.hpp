#pragma once
// Gated full attention of Qwen3.5/3.6 and Qwen3-Next, as the sequence of steps every backend runs:
//
//   [q | gate] per head, k, v = xn · [W_q | W_k | W_v]ᵀ   q_proj yields, per head, hd query values
//                                                       then hd gate values (split per head, not in
//                                                       halves of the whole projection)
//   q, k ← rope(rms_norm(·) · (1 + w))    zero-centred RMSNorm per head, then partial NeoX RoPE on the
//                                         first rotary_dim dims (dim i pairs with i + rotary_dim/2)
//   k, v appended to the sequence's paged KV cache at this row's position
//   o = softmax(q · Kᵀ / √hd, causal) · V   GQA: query head h reads kv head h / (Hq/Hkv); float32 softmax
//   o ← o · sigmoid(gate)
//   out = o · W_oᵀ

namespace gdn::layers {

template <typename K>
struct GatedAttention {
  static void forward(K& k, const typename K::AttentionWeights& w, int kv_layer) {
    k.attn_in_proj(w);              // q | gate, k, v
    k.attn_append(w, kv_layer);     // q, k normed and rotated; k, v into the KV cache
    k.attn_core(w, kv_layer);       // causal softmax attention, gated
    k.attn_output(w);               // out projection → the layer's output rows
  }
};

}  // namespace gdn::layers
