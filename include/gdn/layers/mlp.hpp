#pragma once
// SwiGLU MLP, dense in every layer of the models libgdn runs:
//   out = (silu(xn · W_gateᵀ) ⊙ (xn · W_upᵀ)) · W_downᵀ

namespace gdn::layers {

template <typename K>
struct SwiGluMlp {
  static void forward(K& k, const typename K::MlpWeights& w) {
    k.mlp_gate_up(w);  // gate | up
    k.mlp_swiglu(w);   // silu(gate) ⊙ up
    k.mlp_down(w);     // down projection → the layer's output rows
  }
};

}  // namespace gdn::layers
