// The parts of a Gated DeltaNet layer that forward passes and rollback replays share: the q/k
// normalisation and the delta rule over segments. A fragment of a target region.
//
// The recurrent state is stored as float (the default) or bf16; the recurrence always runs in
// float: a bf16 state is widened at the start of a step and rounded back at its end, as a
// bf16-state server would.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

// q ← q/‖q‖/√dk and k ← k/‖k‖ per (row, key head), in the conv output q | k | v.
inline void normalize_qk(const CpuState& s, Exec& ex, std::int64_t rows, float* conv_out) {
  const ModelConfig& c = s.c;
  const int Hk = c.linear_num_key_heads, dk = c.linear_key_head_dim;
  const std::int64_t Kd = c.gdn_key_dim(), C = c.gdn_conv_dim();
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

template <typename StateT>
void delta_rule_segments(CpuState& s, Exec& ex, std::span<const PassSegment> segs, int g, const float* conv_out,
                         const float* gates, std::int64_t ld_gates, float* core) {
  const ModelConfig& c = s.c;
  const int Hv = c.linear_num_value_heads;
  const int dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const std::int64_t Kd = c.gdn_key_dim(), Vd = c.gdn_value_dim(), C = c.gdn_conv_dim();
  const std::int64_t tasks = static_cast<std::int64_t>(segs.size()) * Hv;
  const std::int64_t n_state = static_cast<std::int64_t>(dk) * dv;
  // Up to 4 adjacent heads a claim: their states are adjacent, so each thread streams 256 KiB
  // (dk = dv = 128) in address order instead of jumping 64 KiB at every head — at batch-1 decode the
  // delta rule's share of the step fell from about 7.9% to 6.0% with the state in huge pages. Claims
  // stay small enough (at least two a thread) to balance segments of unequal length.
  const std::int64_t grain = std::clamp<std::int64_t>(tasks / (2 * ex.pool.size()), 1, 4);
  ex.pool.parallel_for(tasks, grain, [&](std::int64_t t0, std::int64_t t1, int thread) {
    auto& scratch = ex.threads[static_cast<std::size_t>(thread)];
    for (std::int64_t t = t0; t < t1; ++t) {
      const auto& sg = segs[static_cast<std::size_t>(t / Hv)];
      const int h = static_cast<int>(t % Hv);
      const int kh = s.key_head[static_cast<std::size_t>(h)];
      DeltaRuleInput in;
      in.q = conv_out + sg.row * C + kh * dk;
      in.k = conv_out + sg.row * C + Kd + kh * dk;
      in.v = conv_out + sg.row * C + 2 * Kd + h * dv;
      in.q_stride = in.k_stride = in.v_stride = C;
      in.g = gates + h * ld_gates + sg.row;
      in.beta = gates + (Hv + h) * ld_gates + sg.row;
      in.dk = dk;
      in.dv = dv;
      StateT* stored = reinterpret_cast<StateT*>(s.gdn_state.recurrent(sg.slot, g)) + static_cast<std::int64_t>(h) * n_state;
      float* S = nullptr;
      if constexpr (std::is_same_v<StateT, float>) {
        S = stored;
      } else {
        S = scratch.state.data();
        for (std::int64_t i = 0; i < n_state; ++i) S[i] = to_float(stored[i]);
      }
      float* o = core + sg.row * Vd + h * dv;
      if (sg.n >= s.p.gdn_chunk_min_tokens) delta_rule_chunked(in, sg.n, S, o, Vd, scratch.delta);
      else delta_rule_recurrent(in, sg.n, S, o, Vd, scratch.delta);
      if constexpr (!std::is_same_v<StateT, float>) {
        for (std::int64_t i = 0; i < n_state; ++i) stored[i] = to_bf16(S[i]);
      }
    }
  });
}

// The delta rule per (segment, value head); gates[h · ld_gates + row] holds g, then β at Hv + h.
inline void delta_rule(CpuState& s, Exec& ex, std::span<const PassSegment> segs, int g, const float* conv_out,
                       const float* gates, std::int64_t ld_gates, float* core) {
  if (s.gdn_state.state_dtype() == DType::bf16) delta_rule_segments<bf16>(s, ex, segs, g, conv_out, gates, ld_gates, core);
  else delta_rule_segments<float>(s, ex, segs, g, conv_out, gates, ld_gates, core);
}

// Puts the slot's GDN state back to where it stood after the first `keep` tokens of its logged
// step: start state restored, then the same conv and recurrence code a `keep`-token step would
// run (for every GDN layer). Uses the aux and core buffers as scratch.
inline void replay_gdn(CpuState& s, int slot, std::int64_t keep) {
  const ModelConfig& c = s.c;
  Exec ex = s.exec();
  GdnStatePool& pool = s.gdn_state;
  GdnStepLog& log = s.step_log;
  const std::int64_t C = c.gdn_conv_dim();
  const std::int64_t rec_bytes = pool.recurrent_elements() * static_cast<std::int64_t>(dtype_size(pool.state_dtype()));
  const PassSegment seg{slot, 0, keep, 0, false};
  int g = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const auto& lw = s.w.layers[static_cast<std::size_t>(l)];
    if (lw.kind != LayerKind::linear_attention) continue;
    std::copy_n(log.start().conv(slot, g), pool.conv_floats(), pool.conv(slot, g));
    std::copy_n(log.start().recurrent(slot, g), rec_bytes, pool.recurrent(slot, g));
    if (keep > 0) {
      float* state = pool.conv(slot, g);
      const float* raw = log.raw(slot, g);
      float* conv_out = s.aux.data();
      ex.pool.parallel_for(C, 64, [&](std::int64_t c0, std::int64_t c1, int) {
        causal_conv1d_silu(lw.gdn.conv.data(), c.linear_conv_kernel_dim, C, raw, C, keep, state, conv_out, C, c0, c1);
      });
      normalize_qk(s, ex, keep, conv_out);
      delta_rule(s, ex, std::span(&seg, 1), g, conv_out, log.gates(slot, g), log.max_tokens(), s.core.data());
    }
    ++g;
  }
}
