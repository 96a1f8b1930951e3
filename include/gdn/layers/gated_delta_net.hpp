#pragma once
// A Gated DeltaNet layer (the "linear attention" layers of Qwen3.5/3.6 and Qwen3-Next), as the
// sequence of steps every backend runs. For each token x (rows of a pass, normed input xn):
//
//   [qkv | z | b | a] = xn · [W_qkv | W_z | W_b | W_a]ᵀ      Qwen3-Next: one fused matrix whose rows
//                                                            are interleaved per key-head group
//   qkv ← silu(causal_conv1d(qkv))   depthwise, kernel K (4), over the sequence's previous K−1 raw
//                                    qkv rows (its conv state) and this pass's rows
//   q ← q / ‖q‖ / √dk,  k ← k / ‖k‖  per key head, ‖x‖ = sqrt(Σx² + 1e−6)
//   g = −exp(A_log) · softplus(a + dt_bias),  β = sigmoid(b)   per value head
//   per value head h, reading key head h / (Hv/Hk) (consecutive value heads share a key head, as
//   transformers' repeat_interleave; GGUF conversions tile them instead):
//     S ← e^g · S;  u = β (v − Sᵀk);  S ← S + k uᵀ;  o = Sᵀq        S: dk × dv, float32
//   o ← rms_norm(o) · w_norm · silu(z)   per value head (RMSNormGated; w_norm used as is)
//   out = o · W_outᵀ
//
// The recurrent state S lives in float32 by default (mamba_ssm_dtype): a bf16 state written back
// every token degrades output slowly. Backends may run the recurrence token by token or in the
// chunked WY/UT form (prefill); the two are exact rewrites of each other.

namespace gdn::layers {

// K is a backend's kernel set for one pass (decoder.hpp): it holds the pass's rows and work
// buffers; each call is one of the steps above, and may fuse what it can.
template <typename K>
struct GatedDeltaNet {
  static void forward(K& k, const typename K::GdnWeights& w, int gdn_layer) {
    k.gdn_in_proj(w);               // qkv | z | b | a
    k.gdn_conv(w, gdn_layer);       // causal conv + SiLU, the conv state updated
    k.gdn_gates(w);                 // q, k L2 norms; g and β
    k.gdn_delta_rule(w, gdn_layer); // the recurrence per value head, the recurrent state updated
    k.gdn_output(w);                // gated norm, out projection → the layer's output rows
  }
};

}  // namespace gdn::layers
