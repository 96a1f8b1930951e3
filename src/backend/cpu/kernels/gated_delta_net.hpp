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
#include "gdn/backend/cpu/vec_math.hpp"
#include "gdn/layers/activations.hpp"
#include "gdn/layers/delta_rule.hpp"
#include "gdn/layers/rms_norm.hpp"
#include "gdn/model/config.hpp"
#include "gdn/state/gdn_state.hpp"
#include "gdn/state/gdn_step_log.hpp"

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
// state: [K-1][C] oldest first; taps w[j*C + c], j = K-1 multiplies the current token.
inline void causal_conv1d_silu(const float* w, int K, std::int64_t C, const float* in, std::int64_t ld_in, std::int64_t n,
                               float* state, float* out, std::int64_t ld_out, std::int64_t c0, std::int64_t c1) {
  const int H = K - 1;  // history length
  for (std::int64_t t = 0; t < n; ++t) {
    // Tap by tap over a run of channels (vectorisable), same summation order per channel.
    float* o = out + t * ld_out;
    std::fill(o + c0, o + c1, 0.0f);
    for (int j = 0; j < K; ++j) {
      const std::int64_t src = t - H + j;  // row index; negative means history
      const float* u = src >= 0 ? in + src * ld_in : state + (H + src) * C;
      const float* wj = w + j * C;
      for (std::int64_t c = c0; c < c1; ++c) o[c] += wj[c] * u[c];
    }
    cpu::vec::silu_inplace(o + c0, c1 - c0);
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
  // tiled_value_heads: pair value head h with key head h % Hk instead of h / (Hv/Hk) — only for
  // proving that checks catch the GGUF-order mix-up.
  GatedDeltaNetLayer(const ModelConfig& c, const GatedDeltaNetWeights& w, bool tiled_value_heads = false)
      : c_(c), w_(w), tiled_(tiled_value_heads) {}

  // xn: [rows, H] normed input. out: [rows, H] layer output (not yet added to the residual).
  // chunk_min: segments of at least this many tokens take the chunked form. With a log, segments
  // marked `record` keep what rollback() needs (see gdn_step_log.hpp).
  void forward(cpu::Exec& ex, std::span<const cpu::Segment> segs, const float* xn, std::int64_t ldx, std::int64_t rows,
               float* out, std::int64_t ldo, GdnStatePool& pool, int gdn_index, const GdnBuffers& b,
               std::int64_t chunk_min, GdnStepLog* log) const {
    const std::int64_t C = c_.gdn_conv_dim(), Vd = c_.gdn_value_dim();
    project(ex, xn, ldx, rows, b);
    if (log != nullptr) record_inputs(segs, pool, gdn_index, b, *log);
    conv_segments(ex, segs, pool, gdn_index, b);
    normalize_and_gate(ex, rows, b);
    if (log != nullptr) record_gates(segs, gdn_index, b, *log);
    delta_rule(ex, segs, pool, gdn_index, b.conv_out, b.gates, b.ld_gates, b.core, chunk_min);
    ex.pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        float* o = b.core + row * Vd;
        const float* z = b.proj + row * b.ld_proj + C;
        for (int h = 0; h < c_.linear_num_value_heads; ++h) {
          const int dv = c_.linear_value_head_dim;
          rms_norm_gated(o + h * dv, z + h * dv, w_.norm.data(), o + h * dv, dv, c_.rms_norm_eps);
        }
      }
    });
    ex.linear(w_.out_proj, b.core, Vd, rows, out, ldo);
  }

  // Puts slot's state back to where it stood after the first `keep` tokens of the logged step:
  // start state restored, then the same conv and recurrence code a `keep`-token step would run.
  // Uses b.conv_out and b.core as scratch.
  void replay(cpu::Exec& ex, int slot, std::int64_t keep, GdnStatePool& pool, int gdn_index, GdnStepLog& log,
              const GdnBuffers& b, std::int64_t chunk_min) const {
    std::copy_n(log.start().conv(slot, gdn_index), pool.conv_floats(), pool.conv(slot, gdn_index));
    std::copy_n(log.start().recurrent(slot, gdn_index), pool.recurrent_elements() * static_cast<std::int64_t>(sizeof(StateT)),
                pool.recurrent(slot, gdn_index));
    if (keep == 0) return;
    const cpu::Segment seg{slot, 0, keep, 0, false};
    const std::int64_t C = c_.gdn_conv_dim();
    conv(ex, seg, pool.conv(slot, gdn_index), log.raw(slot, gdn_index), C, b.conv_out);
    normalize_qk(ex, keep, b.conv_out);
    delta_rule(ex, std::span(&seg, 1), pool, gdn_index, b.conv_out, log.gates(slot, gdn_index), log.max_tokens(), b.core,
               chunk_min);
  }

 private:
  void conv(cpu::Exec& ex, const cpu::Segment& s, float* state, const float* raw, std::int64_t ld_raw, float* conv_out) const {
    const std::int64_t C = c_.gdn_conv_dim();
    ex.pool.parallel_for(C, 64, [&](std::int64_t c0, std::int64_t c1, int) {
      causal_conv1d_silu(w_.conv.data(), c_.linear_conv_kernel_dim, C, raw, ld_raw, s.n, state, conv_out + s.row * C, C, c0, c1);
    });
  }

  // The conv of every segment in one parallel region (a batch of decodes is many one-row
  // segments; a region per segment cost more than the conv itself). Channels are independent, so
  // how they are split between threads never changes a result.
  void conv_segments(cpu::Exec& ex, std::span<const cpu::Segment> segs, GdnStatePool& pool, int gdn_index,
                     const GdnBuffers& b) const {
    const std::int64_t C = c_.gdn_conv_dim(), block = 128, blocks = (C + block - 1) / block;
    ex.pool.parallel_for(static_cast<std::int64_t>(segs.size()) * blocks, 1, [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const cpu::Segment& s = segs[static_cast<std::size_t>(i / blocks)];
        const std::int64_t c0 = i % blocks * block, c1 = std::min(C, c0 + block);
        causal_conv1d_silu(w_.conv.data(), c_.linear_conv_kernel_dim, C, b.proj + s.row * b.ld_proj, b.ld_proj, s.n,
                           pool.conv(s.slot, gdn_index), b.conv_out + s.row * C, C, c0, c1);
      }
    });
  }

  void normalize_qk(cpu::Exec& ex, std::int64_t rows, float* conv_out) const {
    const int Hk = c_.linear_num_key_heads, dk = c_.linear_key_head_dim;
    const std::int64_t Kd = c_.gdn_key_dim(), C = c_.gdn_conv_dim();
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
    ex.pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        float* qkv = conv_out + row * C;
        for (int h = 0; h < Hk; ++h) {
          l2_normalize(qkv + h * dk, dk, q_scale);
          l2_normalize(qkv + Kd + h * dk, dk, 1.0f);
        }
      }
    });
  }

  // q, k normalisation per (row, key head); gates per (row, value head).
  void normalize_and_gate(cpu::Exec& ex, std::int64_t rows, const GdnBuffers& b) const {
    const int Hv = c_.linear_num_value_heads;
    const std::int64_t C = c_.gdn_conv_dim(), Vd = c_.gdn_value_dim();
    normalize_qk(ex, rows, b.conv_out);
    ex.pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        const float* braw = b.proj + row * b.ld_proj + C + Vd;
        const float* araw = braw + Hv;
        for (int h = 0; h < Hv; ++h) {
          b.gates[h * b.ld_gates + row] = w_.neg_exp_A[static_cast<std::size_t>(h)] *
                                          softplus(araw[h] + w_.dt_bias[static_cast<std::size_t>(h)]);
          b.gates[(Hv + h) * b.ld_gates + row] = sigmoid(braw[h]);
        }
      }
    });
  }

  // The delta rule per (segment, value head); gates[h * ld_gates + row] holds g, then β at Hv + h.
  void delta_rule(cpu::Exec& ex, std::span<const cpu::Segment> segs, GdnStatePool& pool, int gdn_index,
                  const float* conv_out, const float* gates, std::int64_t ld_gates, float* core,
                  std::int64_t chunk_min) const {
    const int Hk = c_.linear_num_key_heads, Hv = c_.linear_num_value_heads;
    const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
    const std::int64_t Kd = c_.gdn_key_dim(), Vd = c_.gdn_value_dim(), C = c_.gdn_conv_dim();
    const int r = Hv / Hk;
    const std::int64_t tasks = static_cast<std::int64_t>(segs.size()) * Hv;
    ex.pool.parallel_for(tasks, 1, [&](std::int64_t t0, std::int64_t t1, int thread) {
      auto& scratch = ex.threads[static_cast<std::size_t>(thread)];
      for (std::int64_t t = t0; t < t1; ++t) {
        const auto& s = segs[static_cast<std::size_t>(t / Hv)];
        const int h = static_cast<int>(t % Hv);
        const int kh = tiled_ ? h % Hk : h / r;
        DeltaRuleInput in;
        in.q = conv_out + s.row * C + kh * dk;
        in.k = conv_out + s.row * C + Kd + kh * dk;
        in.v = conv_out + s.row * C + 2 * Kd + h * dv;
        in.q_stride = in.k_stride = in.v_stride = C;
        in.g = gates + h * ld_gates + s.row;
        in.beta = gates + (Hv + h) * ld_gates + s.row;
        in.dk = dk;
        in.dv = dv;
        StateT* stored = reinterpret_cast<StateT*>(pool.recurrent(s.slot, gdn_index)) + static_cast<std::int64_t>(h) * dk * dv;
        float* S = widen_state(stored, scratch, dk * dv);
        float* o = core + s.row * Vd + h * dv;
        if (s.n >= chunk_min) delta_rule_chunked(in, s.n, S, o, Vd, scratch.delta);
        else delta_rule_recurrent(in, s.n, S, o, Vd);
        store_state(S, stored, dk * dv);
      }
    });
  }

  void record_inputs(std::span<const cpu::Segment> segs, GdnStatePool& pool, int gdn_index, const GdnBuffers& b,
                     GdnStepLog& log) const {
    const std::int64_t C = c_.gdn_conv_dim();
    for (const auto& s : segs) {
      if (!s.record) continue;
      std::copy_n(pool.conv(s.slot, gdn_index), pool.conv_floats(), log.start().conv(s.slot, gdn_index));
      std::copy_n(pool.recurrent(s.slot, gdn_index), pool.recurrent_elements() * static_cast<std::int64_t>(sizeof(StateT)),
                  log.start().recurrent(s.slot, gdn_index));
      float* raw = log.raw(s.slot, gdn_index);
      for (std::int64_t t = 0; t < s.n; ++t) std::copy_n(b.proj + (s.row + t) * b.ld_proj, C, raw + t * C);
    }
  }

  void record_gates(std::span<const cpu::Segment> segs, int gdn_index, const GdnBuffers& b, GdnStepLog& log) const {
    const int Hv = c_.linear_num_value_heads;
    for (const auto& s : segs) {
      if (!s.record) continue;
      float* g = log.gates(s.slot, gdn_index);
      for (int h = 0; h < 2 * Hv; ++h) std::copy_n(b.gates + h * b.ld_gates + s.row, s.n, g + h * log.max_tokens());
    }
  }

  void project(cpu::Exec& ex, const float* xn, std::int64_t ldx, std::int64_t rows, const GdnBuffers& b) const {
    const std::int64_t C = c_.gdn_conv_dim(), Vd = c_.gdn_value_dim();
    const int Hv = c_.linear_num_value_heads;
    if (c_.gdn_layout == GdnProjectionLayout::separate) {
      // One pass over the four weights that read xn.
      ex.linear({{w_.in_proj_qkv, b.proj, b.ld_proj},
                 {w_.in_proj_z, b.proj + C, b.ld_proj},
                 {w_.in_proj_b, b.proj + C + Vd, b.ld_proj},
                 {w_.in_proj_a, b.proj + C + Vd + Hv, b.ld_proj}},
                xn, ldx, rows);
      return;
    }
    // Qwen3-Next: per key-head group g, qkvz rows are [q_g | k_g | v_g (r heads) | z_g (r heads)] and
    // ba rows [b_g (r) | a_g (r)]. Project once, then move the outputs to the separate layout.
    const int Hk = c_.linear_num_key_heads, dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
    const int r = Hv / Hk;
    const std::int64_t Kd = c_.gdn_key_dim();
    const std::int64_t qkvz = w_.in_proj_qkvz.out();
    ex.linear({{w_.in_proj_qkvz, b.fused, b.ld_fused}, {w_.in_proj_ba, b.fused + qkvz, b.ld_fused}}, xn, ldx, rows);
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
  bool tiled_ = false;
};

}  // namespace gdn::layers
