#pragma once
// A Gated DeltaNet layer (the "linear attention" layers of Qwen3.5/3.6 and Qwen3-Next), composed
// of its parts: input projections → causal depthwise conv + SiLU over the qkv channels → per-head
// L2 norm of q and k, gates β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias) → the gated
// delta rule (delta_rule.hpp) → gated RMSNorm with silu(z) → output projection.
//
// Value head h reads key head h / (Hv/Hk): each key head serves consecutive value heads, as in
// transformers' repeat_interleave. (GGUF conversions tile them instead; mixing the two orders
// degrades output slowly rather than obviously.)
//
// StateT is the element type of the stored recurrent state: float (the default) or bf16. The
// recurrence always runs in float; a bf16 state is widened at the start of a step and rounded back
// at its end, as a bf16-state server would.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "gdn/backend/cpu/exec.hpp"
#include "gdn/layers/activations.hpp"
#include "gdn/layers/delta_rule.hpp"
#include "gdn/layers/rms_norm.hpp"
#include "gdn/model/config.hpp"
#include "gdn/state/gdn_state.hpp"

namespace gdn::layers {

// Row-major work buffers for `rows` rows, provided by the caller.
struct GdnBuffers {
  float* proj;         // [rows, ld_proj]: qkv (conv_dim) | z (Vd) | b (Hv) | a (Hv), raw projections
  std::int64_t ld_proj;
  float* fused;        // [rows, ld_fused]: Qwen3-Next qkvz | ba, before de-interleaving (fused layout only)
  std::int64_t ld_fused;
  float* conv_out;     // [rows, conv_dim]: q | k | v after conv + SiLU (q, k then normalised in place)
  float* gates;        // [2·Hv, ld_gates]: g then β, head-major so each head's tokens are contiguous
  std::int64_t ld_gates;
  float* core;         // [rows, Vd]: delta-rule output, then gated-normed in place
};

// Causal depthwise conv over one sequence's rows, continuing from (and updating) its conv state.
// state: [K-1][C] oldest first; taps w[c*K + j], j = K-1 multiplies the current token.
inline void causal_conv1d_silu(const float* w, int K, std::int64_t C, const float* in, std::int64_t ld_in, std::int64_t n,
                               float* state, float* out, std::int64_t ld_out, std::int64_t c0, std::int64_t c1) {
  const int H = K - 1;  // history length
  for (std::int64_t t = 0; t < n; ++t) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const float* wc = w + c * K;
      float acc = 0.0f;
      for (int j = 0; j < K; ++j) {
        const std::int64_t src = t - H + j;  // row index; negative means history
        const float u = src >= 0 ? in[src * ld_in + c] : state[(H + src) * C + c];
        acc += wc[j] * u;
      }
      out[t * ld_out + c] = silu(acc);
    }
  }
  // New history: the last H raw inputs of [state ; in].
  for (int h = 0; h < H; ++h) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t src = n - H + h;
      state[h * C + c] = src >= 0 ? in[src * ld_in + c] : state[(h + n) * C + c];
    }
  }
}

inline void l2_normalize(float* x, int n, float scale) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  const float r = scale / std::sqrt(s + 1e-6f);  // eps fixed at 1e-6 in the reference, not rms_norm_eps
  for (int i = 0; i < n; ++i) x[i] *= r;
}

template <typename StateT>
class GatedDeltaNetLayer {
 public:
  GatedDeltaNetLayer(const ModelConfig& c, const GatedDeltaNetWeights& w) : c_(c), w_(w) {}

  // xn: [rows, H] normed input. out: [rows, H] layer output (not yet added to the residual).
  // chunk_min: segments of at least this many tokens take the chunked form.
  void forward(cpu::Exec& ex, std::span<const cpu::Segment> segs, const float* xn, std::int64_t ldx, std::int64_t rows,
               float* out, std::int64_t ldo, GdnStatePool& pool, int gdn_index, const GdnBuffers& b,
               std::int64_t chunk_min) const {
    const int Hk = c_.linear_num_key_heads, Hv = c_.linear_num_value_heads;
    const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
    const std::int64_t Kd = c_.gdn_key_dim(), Vd = c_.gdn_value_dim(), C = c_.gdn_conv_dim();
    const int r = Hv / Hk;
    const int K = c_.linear_conv_kernel_dim;

    project(ex, xn, ldx, rows, b);

    // Conv, per segment, parallel over channel blocks.
    for (const auto& s : segs) {
      float* state = pool.conv(s.slot, gdn_index);
      ex.pool.parallel_for(C, 64, [&](std::int64_t c0, std::int64_t c1, int) {
        causal_conv1d_silu(w_.conv.data(), K, C, b.proj + s.row * b.ld_proj, b.ld_proj, s.n, state,
                           b.conv_out + s.row * C, C, c0, c1);
      });
    }

    // q, k normalisation per (row, key head); gates per (row, value head).
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
    ex.pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        float* qkv = b.conv_out + row * C;
        for (int h = 0; h < Hk; ++h) {
          l2_normalize(qkv + h * dk, dk, q_scale);
          l2_normalize(qkv + Kd + h * dk, dk, 1.0f);
        }
        const float* braw = b.proj + row * b.ld_proj + C + Vd;
        const float* araw = braw + Hv;
        for (int h = 0; h < Hv; ++h) {
          b.gates[h * b.ld_gates + row] = w_.neg_exp_A[static_cast<std::size_t>(h)] *
                                          softplus(araw[h] + w_.dt_bias[static_cast<std::size_t>(h)]);
          b.gates[(Hv + h) * b.ld_gates + row] = sigmoid(braw[h]);
        }
      }
    });

    // The delta rule, per (segment, value head).
    const std::int64_t tasks = static_cast<std::int64_t>(segs.size()) * Hv;
    ex.pool.parallel_for(tasks, 1, [&](std::int64_t t0, std::int64_t t1, int thread) {
      auto& scratch = ex.threads[static_cast<std::size_t>(thread)];
      for (std::int64_t t = t0; t < t1; ++t) {
        const auto& s = segs[static_cast<std::size_t>(t / Hv)];
        const int h = static_cast<int>(t % Hv);
        const int kh = h / r;
        DeltaRuleInput in;
        in.q = b.conv_out + s.row * C + kh * dk;
        in.k = b.conv_out + s.row * C + Kd + kh * dk;
        in.v = b.conv_out + s.row * C + 2 * Kd + h * dv;
        in.q_stride = in.k_stride = in.v_stride = C;
        in.g = b.gates + h * b.ld_gates + s.row;
        in.beta = b.gates + (Hv + h) * b.ld_gates + s.row;
        in.dk = dk;
        in.dv = dv;
        StateT* stored = reinterpret_cast<StateT*>(pool.recurrent(s.slot, gdn_index)) + static_cast<std::int64_t>(h) * dk * dv;
        float* S = widen_state(stored, scratch, dk * dv);
        float* o = b.core + s.row * Vd + h * dv;
        if (s.n >= chunk_min) delta_rule_chunked(in, s.n, S, o, Vd, scratch.delta);
        else delta_rule_recurrent(in, s.n, S, o, Vd);
        store_state(S, stored, dk * dv);
      }
    });

    // Gated RMSNorm per (row, value head), then the output projection.
    ex.pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        float* o = b.core + row * Vd;
        const float* z = b.proj + row * b.ld_proj + C;
        for (int h = 0; h < Hv; ++h)
          rms_norm_gated(o + h * dv, z + h * dv, w_.norm.data(), o + h * dv, dv, c_.rms_norm_eps);
      }
    });
    ex.linear(w_.out_proj, b.core, Vd, rows, out, ldo);
  }

 private:
  void project(cpu::Exec& ex, const float* xn, std::int64_t ldx, std::int64_t rows, const GdnBuffers& b) const {
    const std::int64_t C = c_.gdn_conv_dim(), Vd = c_.gdn_value_dim();
    const int Hv = c_.linear_num_value_heads;
    if (c_.gdn_layout == GdnProjectionLayout::separate) {
      ex.linear(w_.in_proj_qkv, xn, ldx, rows, b.proj, b.ld_proj);
      ex.linear(w_.in_proj_z, xn, ldx, rows, b.proj + C, b.ld_proj);
      ex.linear(w_.in_proj_b, xn, ldx, rows, b.proj + C + Vd, b.ld_proj);
      ex.linear(w_.in_proj_a, xn, ldx, rows, b.proj + C + Vd + Hv, b.ld_proj);
      return;
    }
    // Qwen3-Next: per key-head group g, qkvz rows are [q_g | k_g | v_g (r heads) | z_g (r heads)] and
    // ba rows [b_g (r) | a_g (r)]. Project once, then move the outputs to the separate layout.
    const int Hk = c_.linear_num_key_heads, dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
    const int r = Hv / Hk;
    const std::int64_t Kd = c_.gdn_key_dim();
    const std::int64_t qkvz = w_.in_proj_qkvz.out();
    ex.linear(w_.in_proj_qkvz, xn, ldx, rows, b.fused, b.ld_fused);
    ex.linear(w_.in_proj_ba, xn, ldx, rows, b.fused + qkvz, b.ld_fused);
    ex.pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        const float* src = b.fused + row * b.ld_fused;
        float* dst = b.proj + row * b.ld_proj;
        const std::int64_t group = 2 * dk + 2 * static_cast<std::int64_t>(r) * dv;
        for (int g = 0; g < Hk; ++g) {
          const float* s = src + g * group;
          std::copy_n(s, dk, dst + g * dk);
          std::copy_n(s + dk, dk, dst + Kd + g * dk);
          std::copy_n(s + 2 * dk, r * dv, dst + 2 * Kd + static_cast<std::int64_t>(g) * r * dv);
          std::copy_n(s + 2 * dk + r * dv, r * dv, dst + C + static_cast<std::int64_t>(g) * r * dv);
          const float* ba = src + qkvz + 2 * g * r;
          std::copy_n(ba, r, dst + C + Vd + g * r);
          std::copy_n(ba + r, r, dst + C + Vd + Hv + g * r);
        }
      }
    });
  }

  static float* widen_state(StateT* stored, cpu::ThreadScratch& scratch, std::int64_t n) {
    if constexpr (std::is_same_v<StateT, float>) {
      return stored;
    } else {
      float* S = scratch.state.data();
      for (std::int64_t i = 0; i < n; ++i) S[i] = to_float(stored[i]);
      return S;
    }
  }
  static void store_state(const float* S, StateT* stored, std::int64_t n) {
    if constexpr (!std::is_same_v<StateT, float>) {
      for (std::int64_t i = 0; i < n; ++i) stored[i] = to_bf16(S[i]);
    }
  }

  const ModelConfig& c_;
  const GatedDeltaNetWeights& w_;
};

}  // namespace gdn::layers
