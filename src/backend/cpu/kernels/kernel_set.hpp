// The CPU kernel set of one pass: what gdn::layers::Decoder and the layer objects call (see
// include/gdn/layers/decoder.hpp), on float32 activations in the backend's work buffers. Within a
// pass all sequences share each projection (each weight is streamed once per pass, whatever the
// number of sequences); the sequence-local parts (conv, delta rule, attention) run per segment.
// A fragment of a target region.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

class Kernels {
 public:
  using Weights = PreparedWeights;
  using GdnWeights = cpu::GdnWeights;
  using AttentionWeights = cpu::AttentionWeights;
  using MlpWeights = cpu::MlpWeights;

  Kernels(CpuState& s, const PassPlan& plan, const PassOutputs& out)
      : s_(s), c_(s.c), plan_(plan), out_(out), ex_(s.exec()), rows_(plan.rows), H_(s.c.hidden_size) {}

  // --- the residual stream

  void embed(const Weights& w) {
    for (std::int64_t r = 0; r < rows_; ++r)
      gather_row(*w.embed_tokens, plan_.tokens[static_cast<std::size_t>(r)], s_.x.data() + r * H_);
    rope_rows();
  }

  void norm(const float* scale) { norm_rows(s_.x.data(), scale, s_.xn.data()); }

  void add_and_norm(const float* scale) {
    add();
    norm(scale);
  }

  void add() {
    float* acc = s_.x.data();
    const float* d = s_.mix.data();
    const std::int64_t n = rows_ * H_;
    for (std::int64_t i = 0; i < n; ++i) acc[i] += d[i];
  }

  // Final norm (given scale) of the output rows into the hidden outputs, and lm_head for the rows
  // that asked for logits.
  void outputs(const Weights& w, const float* scale) {
    const auto outputs = plan_.outputs;
    if (outputs.empty()) return;
    const std::int64_t V = c_.vocab_size;
    ex_.pool.parallel_for(static_cast<std::int64_t>(outputs.size()), 4, [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const auto& o = outputs[static_cast<std::size_t>(i)];
        rms_norm(s_.x.data() + o.row * H_, scale, out_.hidden + o.out_row * H_, H_, c_.rms_norm_eps);
      }
    });
    // Contiguous runs of rows that want logits go through lm_head together.
    std::size_t i = 0;
    while (i < outputs.size()) {
      if (!outputs[i].logits) {
        ++i;
        continue;
      }
      std::size_t j = i + 1;
      while (j < outputs.size() && outputs[j].logits && outputs[j].out_row == outputs[j - 1].out_row + 1) ++j;
      const std::int64_t r0 = outputs[i].out_row;
      ex_.linear(w.lm_head, out_.hidden + r0 * H_, H_, static_cast<std::int64_t>(j - i), out_.logits + r0 * V, V);
      i = j;
    }
  }

  // --- the MTP head's input: [norm(embedding) ; norm(hidden)], embedding first, then fc.

  void mtp_input(const Weights& w, const MtpWeights& m) {
    for (std::int64_t r = 0; r < rows_; ++r) {
      float* in = s_.proj.data() + r * s_.ld_proj;
      gather_row(*w.embed_tokens, plan_.tokens[static_cast<std::size_t>(r)], s_.xn.data() + r * H_);
      rms_norm(s_.xn.data() + r * H_, m.pre_fc_norm_embedding_scale, in, H_, c_.rms_norm_eps);
      rms_norm(plan_.hidden + r * H_, m.pre_fc_norm_hidden_scale, in + H_, H_, c_.rms_norm_eps);
    }
  }

  void mtp_fc(const MtpWeights& m) {
    ex_.linear(m.fc, s_.proj.data(), s_.ld_proj, rows_, s_.x.data(), H_);
    rope_rows();
  }

  // --- Gated DeltaNet (gdn/layers/gated_delta_net.hpp). proj rows hold qkv (conv_dim) | z (Vd) |
  // b (Hv) | a (Hv); aux the conv output q | k | v; gates [2·Hv][U] g then β, head-major so each
  // head's tokens are contiguous; core the delta-rule output.

  void gdn_in_proj(const GdnWeights& w) {
    const std::int64_t C = c_.gdn_conv_dim(), Vd = c_.gdn_value_dim();
    const int Hv = c_.linear_num_value_heads;
    float* proj = s_.proj.data();
    const std::int64_t ld = s_.ld_proj;
    if (c_.gdn_layout == GdnProjectionLayout::separate) {
      // One pass over the four weights that read xn.
      ex_.linear({{w.in_proj_qkv, proj, ld}, {w.in_proj_z, proj + C, ld}, {w.in_proj_b, proj + C + Vd, ld},
                  {w.in_proj_a, proj + C + Vd + Hv, ld}},
                 s_.xn.data(), H_, rows_);
      return;
    }
    // Qwen3-Next: per key-head group g, qkvz rows are [q_g | k_g | v_g (r heads) | z_g (r heads)] and
    // ba rows [b_g (r) | a_g (r)]. Project once, then move the outputs to the separate layout.
    const int Hk = c_.linear_num_key_heads, dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
    const int r = Hv / Hk;
    const std::int64_t Kd = c_.gdn_key_dim();
    const std::int64_t qkvz = w.in_proj_qkvz.out();
    float* fused = s_.fused.data();
    const std::int64_t ldf = s_.ld_fused;
    ex_.linear({{w.in_proj_qkvz, fused, ldf}, {w.in_proj_ba, fused + qkvz, ldf}}, s_.xn.data(), H_, rows_);
    ex_.pool.parallel_for(rows_, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        const float* src = fused + row * ldf;
        float* dst = proj + row * ld;
        const std::int64_t group = 2 * dk + 2 * static_cast<std::int64_t>(r) * dv;
        for (int g = 0; g < Hk; ++g) {
          const float* sg = src + g * group;
          std::copy_n(sg, dk, dst + g * dk);
          std::copy_n(sg + dk, dk, dst + Kd + g * dk);
          std::copy_n(sg + 2 * dk, r * dv, dst + 2 * Kd + static_cast<std::int64_t>(g) * r * dv);
          std::copy_n(sg + 2 * dk + r * dv, r * dv, dst + C + static_cast<std::int64_t>(g) * r * dv);
          const float* ba = src + qkvz + 2 * g * r;
          std::copy_n(ba, r, dst + C + Vd + g * r);
          std::copy_n(ba + r, r, dst + C + Vd + Hv + g * r);
        }
      }
    });
  }

  // The conv of every segment in one parallel region (a batch of decodes is many one-row
  // segments; a region per segment cost more than the conv itself). Channels are independent, so
  // how they are split between threads never changes a result. Segments marked `record` first log
  // their start state and raw inputs (GdnStepLog).
  void gdn_conv(const GdnWeights& w, int g) {
    if (s_.step_log.enabled()) record_inputs(g);
    const std::int64_t C = c_.gdn_conv_dim(), block = 128, blocks = (C + block - 1) / block;
    const auto segs = plan_.segments;
    ex_.pool.parallel_for(static_cast<std::int64_t>(segs.size()) * blocks, 1, [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const PassSegment& sg = segs[static_cast<std::size_t>(i / blocks)];
        const std::int64_t c0 = i % blocks * block, c1 = std::min(C, c0 + block);
        causal_conv1d_silu(w.conv.data(), c_.linear_conv_kernel_dim, C, s_.proj.data() + sg.row * s_.ld_proj, s_.ld_proj,
                           sg.n, s_.gdn_state.conv(sg.slot, g), s_.aux.data() + sg.row * C, C, c0, c1);
      }
    });
  }

  // q, k normalisation per (row, key head); gates per (row, value head).
  void gdn_gates(const GdnWeights& w) {
    const int Hv = c_.linear_num_value_heads;
    const std::int64_t C = c_.gdn_conv_dim(), Vd = c_.gdn_value_dim();
    normalize_qk(s_, ex_, rows_, s_.aux.data());
    float* gates = s_.gates.data();
    const std::int64_t ldg = s_.U;
    ex_.pool.parallel_for(rows_, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        const float* braw = s_.proj.data() + row * s_.ld_proj + C + Vd;
        const float* araw = braw + Hv;
        for (int h = 0; h < Hv; ++h) {
          gates[h * ldg + row] = w.neg_exp_A[h] * softplus(araw[h] + w.dt_bias[h]);
          gates[(Hv + h) * ldg + row] = sigmoid(braw[h]);
        }
      }
    });
  }

  void gdn_delta_rule(const GdnWeights&, int g) {
    if (s_.step_log.enabled()) record_gates(g);
    delta_rule(s_, ex_, plan_.segments, g, s_.aux.data(), s_.gates.data(), s_.U, s_.core.data());
  }

  void gdn_output(const GdnWeights& w) {
    const std::int64_t C = c_.gdn_conv_dim(), Vd = c_.gdn_value_dim();
    const int Hv = c_.linear_num_value_heads, dv = c_.linear_value_head_dim;
    ex_.pool.parallel_for(rows_, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        float* o = s_.core.data() + row * Vd;
        const float* z = s_.proj.data() + row * s_.ld_proj + C;
        for (int h = 0; h < Hv; ++h) rms_norm_gated(o + h * dv, z + h * dv, w.norm, o + h * dv, dv, c_.rms_norm_eps);
      }
    });
    ex_.linear(w.out_proj, s_.core.data(), Vd, rows_, s_.mix.data(), H_);
  }

  // --- gated attention (gdn/layers/attention.hpp). proj rows hold q_proj's output (q | gate per
  // head) | k | v; aux the normed, rotated queries; core the gated attention output.

  void attn_in_proj(const AttentionWeights& w) {
    const int Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads, hd = c_.head_dim;
    const std::int64_t qg = 2LL * Hq * hd, kvd = static_cast<std::int64_t>(Hkv) * hd;
    float* proj = s_.proj.data();
    const std::int64_t ld = s_.ld_proj;
    ex_.linear({{w.q_proj, proj, ld}, {w.k_proj, proj + qg, ld}, {w.v_proj, proj + qg + kvd, ld}}, s_.xn.data(), H_, rows_);
  }

  // Norm + RoPE, then this step's keys and values into the cache: one parallel region over all
  // rows (a batch of decodes is many one-row segments). A bf16 cache receives each key and value
  // rounded to nearest even, once: every later read (this pass's own rows included) sees the same
  // stored value, so prefill, decode and verification rows still agree bit for bit.
  void attn_append(const AttentionWeights& w, int kv_layer) {
    if (s_.kv.dtype() == DType::bf16) attn_append_as<bf16>(w, kv_layer);
    else attn_append_as<float>(w, kv_layer);
  }

  template <typename T>
  void attn_append_as(const AttentionWeights& w, int kv_layer) {
    const int Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads, hd = c_.head_dim;
    const std::int64_t qg = 2LL * Hq * hd, kvd = static_cast<std::int64_t>(Hkv) * hd;
    const int half = c_.rotary_dim / 2;
    const int ps = s_.kv.page_size();
    const auto segs = plan_.segments;
    ex_.pool.parallel_for(rows_, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      // Segments are in row order; find the one holding r0, then walk on.
      auto seg = std::upper_bound(segs.begin(), segs.end(), r0, [](std::int64_t r, const PassSegment& sg) { return r < sg.row; }) - 1;
      for (std::int64_t row = r0; row < r1; ++row) {
        while (row >= seg->row + seg->n) ++seg;
        const auto& pages = plan_.page_tables[static_cast<std::size_t>(seg->slot)];
        const std::int64_t pos = seg->pos + (row - seg->row);
        const float* cs = s_.cos.data() + row * half;
        const float* sn = s_.sin.data() + row * half;
        float* p = s_.proj.data() + row * s_.ld_proj;
        float* q = s_.aux.data() + row * Hq * hd;
        for (int h = 0; h < Hq; ++h) {
          rms_norm(p + 2LL * h * hd, w.q_norm_scale, q + h * hd, hd, c_.rms_norm_eps);
          rope_apply(q + h * hd, cs, sn, half);
        }
        const std::int32_t page = pages[static_cast<std::size_t>(pos / ps)];
        const std::int64_t off = (pos % ps) * hd;
        for (int g = 0; g < Hkv; ++g) {
          T* k = s_.kv.keys<T>(page, kv_layer, g) + off;
          T* v = s_.kv.values<T>(page, kv_layer, g) + off;
          const float* vf = p + qg + kvd + g * hd;
          if constexpr (std::is_same_v<T, float>) {
            rms_norm(p + qg + g * hd, w.k_norm_scale, k, hd, c_.rms_norm_eps);
            rope_apply(k, cs, sn, half);
            std::copy_n(vf, hd, v);
          } else {
            float* kf = p + qg + g * hd;  // normed and rotated in place: the row's projection is not read again
            rms_norm(kf, w.k_norm_scale, kf, hd, c_.rms_norm_eps);
            rope_apply(kf, cs, sn, half);
            for (int i = 0; i < hd; ++i) {
              k[i] = to_bf16(kf[i]);
              v[i] = to_bf16(vf[i]);
            }
          }
        }
      }
    });
  }

  void attn_core(const AttentionWeights&, int kv_layer) {
    const int Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads, hd = c_.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const int group = Hq / Hkv;
    constexpr std::int64_t row_block = attention_row_block;
    const auto segs = plan_.segments;
    // One task per (segment, block of rows, kv head). Where that leaves threads idle — a decode of
    // few sequences on more cores than kv heads — a long segment of at most one row block is split
    // into one task per (chunk, kv head) instead, and its rows finished by attention_merge: the same
    // bits (kernels/attention.hpp).
    const auto blocks = [&](const PassSegment& sg) { return (sg.n + row_block - 1) / row_block; };
    std::int64_t tasks = 0;
    for (const auto& sg : segs) tasks += Hkv * blocks(sg);
    auto& split = s_.attention_split;
    std::int64_t split_rows = 0;
    if (!s_.attention_partials.empty() && tasks < ex_.pool.size() && segs.size() <= split.size())
      for (std::size_t si = 0; si < segs.size(); ++si) {
        const auto& sg = segs[si];
        const std::int64_t chunks = attention_chunks(sg.pos + sg.n);
        const bool fits = sg.n <= row_block && chunks > 1 && chunks <= s_.attention_chunks && split_rows + sg.n <= row_block;
        split[si] = fits ? split_rows * Hq * s_.attention_chunks * (hd + 2) : -1;
        split_rows += fits ? sg.n : 0;
      }
    const auto split_of = [&](std::size_t si) { return split_rows > 0 ? split[si] : std::int64_t{-1}; };
    const auto seg_tasks = [&](std::size_t si) {
      return Hkv * (split_of(si) >= 0 ? attention_chunks(segs[si].pos + segs[si].n) : blocks(segs[si]));
    };
    if (split_rows > 0) {
      tasks = 0;
      for (std::size_t si = 0; si < segs.size(); ++si) tasks += seg_tasks(si);
    }
    const AttentionRows rows{s_.aux.data(), s_.proj.data(), s_.ld_proj, s_.core.data()};
    ex_.pool.parallel_for(tasks, 1, [&](std::int64_t i0, std::int64_t i1, int thread) {
      float* scratch = ex_.threads[static_cast<std::size_t>(thread)].attention.data();
      for (std::int64_t i = i0; i < i1; ++i) {
        std::int64_t t = i;
        std::size_t si = 0;
        for (; t >= seg_tasks(si); ++si) t -= seg_tasks(si);
        const auto& sg = segs[si];
        const int g = static_cast<int>(t % Hkv);
        const auto& pages = plan_.page_tables[static_cast<std::size_t>(sg.slot)];
        if (split_of(si) >= 0) {
          const AttentionSplit part{t / Hkv, s_.attention_partials.data() + split_of(si), s_.attention_chunks};
          attention(s_.kv, kv_layer, g, pages, sg, 0, sg.n, Hq, hd, group, scale, rows, scratch, part);
        } else {
          const std::int64_t r0 = (t / Hkv) * row_block, r1 = std::min(sg.n, r0 + row_block);
          attention(s_.kv, kv_layer, g, pages, sg, r0, r1, Hq, hd, group, scale, rows, scratch, AttentionSplit{});
        }
      }
    });
    if (split_rows == 0) return;
    // The split rows, each query head's chunks folded in order.
    ex_.pool.parallel_for(split_rows * Hq, 1, [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) {
        std::int64_t t = i / Hq;
        std::size_t si = 0;
        for (;; ++si) {
          if (split_of(si) < 0) continue;
          if (t < segs[si].n) break;
          t -= segs[si].n;
        }
        const AttentionSplit part{-1, s_.attention_partials.data() + split_of(si), s_.attention_chunks};
        attention_merge(s_.kv.dtype(), segs[si], t, static_cast<int>(i % Hq), Hq, hd, rows, part);
      }
    });
  }

  void attn_output(const AttentionWeights& w) {
    ex_.linear(w.o_proj, s_.core.data(), static_cast<std::int64_t>(c_.num_attention_heads) * c_.head_dim, rows_,
               s_.mix.data(), H_);
  }

  // --- SwiGLU MLP (gdn/layers/mlp.hpp). proj rows hold gate | up.

  void mlp_gate_up(const MlpWeights& w) {
    const std::int64_t I = w.gate_proj.out();
    ex_.linear({{w.gate_proj, s_.proj.data(), s_.ld_proj}, {w.up_proj, s_.proj.data() + I, s_.ld_proj}}, s_.xn.data(), H_, rows_);
  }

  void mlp_swiglu(const MlpWeights& w) {
    const std::int64_t I = w.gate_proj.out();
    ex_.pool.parallel_for(rows_, 1, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t r = r0; r < r1; ++r) {
        float* g = s_.proj.data() + r * s_.ld_proj;
        vec::silu_mul(g, g + I, I);
      }
    });
  }

  void mlp_down(const MlpWeights& w) { ex_.linear(w.down_proj, s_.proj.data(), s_.ld_proj, rows_, s_.mix.data(), H_); }

 private:
  void norm_rows(const float* in, const float* scale, float* out) {
    ex_.pool.parallel_for(rows_, 8, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t r = r0; r < r1; ++r) rms_norm(in + r * H_, scale, out + r * H_, H_, c_.rms_norm_eps);
    });
  }

  void rope_rows() {
    const int half = c_.rotary_dim / 2;
    for (const auto& sg : plan_.segments)
      for (std::int64_t t = 0; t < sg.n; ++t)
        rope_angles(s_.inv_freq.data(), half, sg.pos + t, s_.cos.data() + (sg.row + t) * half,
                    s_.sin.data() + (sg.row + t) * half);
  }

  void record_inputs(int g) {
    const std::int64_t C = c_.gdn_conv_dim();
    GdnStatePool& pool = s_.gdn_state;
    GdnStepLog& log = s_.step_log;
    const std::int64_t rec_bytes = pool.recurrent_elements() * static_cast<std::int64_t>(dtype_size(pool.state_dtype()));
    for (const auto& sg : plan_.segments) {
      if (!sg.record) continue;
      std::copy_n(pool.conv(sg.slot, g), pool.conv_floats(), log.start().conv(sg.slot, g));
      std::copy_n(pool.recurrent(sg.slot, g), rec_bytes, log.start().recurrent(sg.slot, g));
      float* raw = log.raw(sg.slot, g);
      for (std::int64_t t = 0; t < sg.n; ++t) std::copy_n(s_.proj.data() + (sg.row + t) * s_.ld_proj, C, raw + t * C);
    }
  }

  void record_gates(int g) {
    const int Hv = c_.linear_num_value_heads;
    GdnStepLog& log = s_.step_log;
    for (const auto& sg : plan_.segments) {
      if (!sg.record) continue;
      float* out = log.gates(sg.slot, g);
      for (int h = 0; h < 2 * Hv; ++h) std::copy_n(s_.gates.data() + h * s_.U + sg.row, sg.n, out + h * log.max_tokens());
    }
  }

  CpuState& s_;
  const ModelConfig& c_;
  const PassPlan& plan_;
  const PassOutputs& out_;
  Exec ex_;
  std::int64_t rows_, H_;
};
