// The CPU model graph: one step runs every listed sequence through the decoder layers, in passes of
// at most max_batch_tokens rows ("ubatches"). Within a pass all sequences share each projection
// (each weight is streamed once per pass, whatever the number of sequences); the sequence-local
// parts (conv, delta rule, attention) run per segment.
//
//   h ← embed(tokens)
//   per layer:  h ← h + mixer(rms_norm(h));  h ← h + mlp(rms_norm(h))     mixer = GDN or attention
//   logits ← lm_head(rms_norm(h)) for the rows that asked for them

#include "context_impl.hpp"

#include "gdn/layers/attention.hpp"
#include "gdn/layers/gated_delta_net.hpp"
#include "gdn/layers/mlp.hpp"
#include "gdn/layers/rms_norm.hpp"

namespace gdn {

Context::Impl::Impl(std::shared_ptr<const Model> m, const ContextParams& params)
    : model(std::move(m)), c(model->config()), w(model->weights()), p(params), pool(params.threads) {
  if (p.backend != Backend::cpu)
    throw Error(Status::backend_unavailable,
                "Context runs the CPU backend; the CUDA backend is not wired into Context yet");
  if (p.max_sequences < 1 || p.max_sequences > (1 << 20))
    throw Error(Status::invalid_argument, fmt::format("max_sequences must be in [1, 2^20], got {}", p.max_sequences));
  if (p.max_context < 1)
    throw Error(Status::invalid_argument, fmt::format("max_context must be positive, got {}", p.max_context));
  if (p.kv_page_size < 1 || p.kv_page_size > 4096)
    throw Error(Status::invalid_argument, fmt::format("kv_page_size must be in [1, 4096], got {}", p.kv_page_size));
  if (p.max_batch_tokens < 1)
    throw Error(Status::invalid_argument, fmt::format("max_batch_tokens must be positive, got {}", p.max_batch_tokens));
  if (p.max_rollback_tokens < 0 || p.max_rollback_tokens > p.max_batch_tokens)
    throw Error(Status::invalid_argument, fmt::format("max_rollback_tokens must be in [0, max_batch_tokens = {}], got {}",
                                                      p.max_batch_tokens, p.max_rollback_tokens));
  if (p.matmul_input != MatmulInput::float32 && p.matmul_input != MatmulInput::bf16)
    throw Error(Status::invalid_argument, fmt::format("matmul_input must be float32 or bf16, got {}", static_cast<int>(p.matmul_input)));
  const DType sd = p.state_dtype.value_or(c.ssm_state_dtype);
  if (sd != DType::f32 && sd != DType::bf16)
    throw Error(Status::invalid_argument, fmt::format("state_dtype must be F32 or BF16, got {}", dtype_name(sd)));

  int n_gdn = 0, n_kv = 0;
  for (const auto kind : c.layer_types) {
    gdn_index.push_back(kind == LayerKind::linear_attention ? n_gdn++ : -1);
    kv_index.push_back(kind == LayerKind::full_attention ? n_kv++ : -1);
  }
  if (model->has_mtp()) mtp_kv_layer = n_kv++;

  gdn_state = GdnStatePool(c, p.max_sequences, sd);
  if (p.max_rollback_tokens > 0) step_log = GdnStepLog(c, p.max_sequences, sd, p.max_rollback_tokens);
  const std::int64_t pages_per_seq = ceil_div(p.max_context, p.kv_page_size);
  const std::int64_t pages = p.kv_pages > 0 ? p.kv_pages : pages_per_seq * p.max_sequences;
  kv = KvPagePool(n_kv > 0 ? pages : 0, p.kv_page_size, n_kv, c.num_key_value_heads, c.head_dim);
  slots.resize(static_cast<std::size_t>(p.max_sequences));
  page_tables.resize(static_cast<std::size_t>(p.max_sequences));
  for (auto& t : page_tables) t.reserve(static_cast<std::size_t>(pages_per_seq));
  seen_stamp.assign(static_cast<std::size_t>(p.max_sequences), 0);
  rope = layers::Rope(c.rotary_dim, c.rope_theta);

  const std::int64_t H = c.hidden_size, Hv = c.linear_num_value_heads;
  const std::int64_t C = c.gdn_conv_dim(), Vd = c.gdn_value_dim();
  const std::int64_t qd = c.attn_q_dim(), kvd = c.attn_kv_dim(), I = c.intermediate_size;
  U = p.max_batch_tokens;
  ld_proj = std::max({C + Vd + 2 * Hv, 2 * qd + 2 * kvd, 2 * I, 2 * H});
  ld_fused = c.gdn_layout == GdnProjectionLayout::fused_per_key_group ? 2 * c.gdn_key_dim() + 2 * Vd + 2 * Hv : 0;
  ld_aux = std::max(C, qd);
  x.assign(static_cast<std::size_t>(U * H), 0.0f);
  xn.assign(x.size(), 0.0f);
  mix.assign(x.size(), 0.0f);
  proj.assign(static_cast<std::size_t>(U * ld_proj), 0.0f);
  fused.assign(static_cast<std::size_t>(U * ld_fused), 0.0f);
  aux.assign(static_cast<std::size_t>(U * ld_aux), 0.0f);
  gates.assign(static_cast<std::size_t>(2 * Hv * U), 0.0f);
  core.assign(static_cast<std::size_t>(U * std::max(Vd, qd)), 0.0f);
  cos.assign(static_cast<std::size_t>(U * (c.rotary_dim / 2)), 0.0f);
  sin.assign(cos.size(), 0.0f);
  segs.reserve(static_cast<std::size_t>(p.max_sequences));
  outputs.reserve(static_cast<std::size_t>(U));
  thread_scratch.resize(static_cast<std::size_t>(pool.size()));
  for (auto& t : thread_scratch) {
    t.delta.reserve(c.linear_key_head_dim, c.linear_value_head_dim);
    t.state.assign(static_cast<std::size_t>(c.linear_key_head_dim * c.linear_value_head_dim), 0.0f);
    t.scores.assign(static_cast<std::size_t>(p.max_context + 1), 0.0f);
  }
  // Packed activations for the widest projection input (the MTP fc reads 2H), so no step allocates.
  thread_scratch[0].linear.reserve(std::max<std::int64_t>(U, p.max_logits_rows), std::max({2 * H, I, Vd, qd, C}),
                                   p.matmul_input);
  ensure_output_rows(p.max_logits_rows > 0 ? p.max_logits_rows : std::max(p.max_sequences, 64));
}

void Context::Impl::ensure_output_rows(std::int64_t rows) {
  const auto need = static_cast<std::size_t>(rows);
  if (row_has_logits.size() < need) {
    // Growing moves the outputs. Views of the old buffers (a numpy array kept past the next step, a
    // C pointer used too late) must read stale numbers, never freed memory, so the old buffers are
    // retired rather than freed; growth at least doubles, so they hold less than the live ones.
    const std::size_t rows_now = std::max(need, 2 * row_has_logits.size());
    std::vector<float> logits(rows_now * static_cast<std::size_t>(c.vocab_size));
    std::vector<float> hidden(rows_now * static_cast<std::size_t>(c.hidden_size));
    if (!logits_buf.empty()) retired_outputs.push_back(std::move(logits_buf));
    if (!hidden_buf.empty()) retired_outputs.push_back(std::move(hidden_buf));
    logits_buf = std::move(logits);
    hidden_buf = std::move(hidden);
    row_has_logits.resize(rows_now);
  }
}

void Context::Impl::set_output_flags(const Batch& batch) {
  output_rows = batch.output_rows();
  for (std::size_t e = 0; e < batch.entries().size(); ++e)
    for (std::int64_t i = 0; i < batch.entries()[e].token_count; ++i) {
      const std::int64_t r = batch.output_row(e, i);
      if (r >= 0) row_has_logits[static_cast<std::size_t>(r)] = batch.wants_logits(e, i);
    }
}

Context::Impl::Slot& Context::Impl::slot_for(SeqId id, const char* what) {
  const int s = handle_index(id);
  if (s < 0 || s >= p.max_sequences || !slots[static_cast<std::size_t>(s)].live ||
      slots[static_cast<std::size_t>(s)].generation != handle_generation(id))
    throw Error(Status::invalid_sequence, fmt::format("{}: sequence id {:#x} is not a live sequence of this context", what, id));
  return slots[static_cast<std::size_t>(s)];
}

int Context::Impl::acquire_slot(const char* what) {
  for (std::size_t s = 0; s < slots.size(); ++s) {
    if (!slots[s].live) {
      slots[s].live = true;
      slots[s].length = slots[s].mtp_length = 0;
      slots[s].log_start = slots[s].log_tokens = 0;
      gdn_state.clear(static_cast<int>(s));
      return static_cast<int>(s);
    }
  }
  throw Error(Status::out_of_capacity, fmt::format("{}: all {} sequence slots are in use", what, p.max_sequences));
}

std::int64_t Context::Impl::pages_needed(int s, std::int64_t begin, std::int64_t end) const {
  if (kv.capacity() == 0 || end <= begin) return 0;
  const auto& table = page_tables[static_cast<std::size_t>(s)];
  const std::int64_t have = static_cast<std::int64_t>(table.size());
  const std::int64_t first = begin / p.kv_page_size, last = ceil_div(end, p.kv_page_size);  // pages [first, last)
  std::int64_t n = std::max<std::int64_t>(0, last - have);
  for (std::int64_t i = first; i < std::min(last, have); ++i)
    if (kv.refcount(table[static_cast<std::size_t>(i)]) > 1) ++n;  // shared: copy before writing
  return n;
}

void Context::Impl::prepare_pages(int s, std::int64_t begin, std::int64_t end) {
  if (kv.capacity() == 0 || end <= begin) return;
  auto& table = page_tables[static_cast<std::size_t>(s)];
  const std::int64_t first = begin / p.kv_page_size, last = ceil_div(end, p.kv_page_size);
  for (std::int64_t i = first; i < std::min<std::int64_t>(last, static_cast<std::int64_t>(table.size())); ++i) {
    const std::int32_t old = table[static_cast<std::size_t>(i)];
    if (kv.refcount(old) > 1) {
      const std::int32_t fresh = kv.acquire();
      kv.copy_page(old, fresh);
      kv.release(old);
      table[static_cast<std::size_t>(i)] = fresh;
    }
  }
  while (static_cast<std::int64_t>(table.size()) < last) table.push_back(kv.acquire());
}

void Context::Impl::release_pages_from(int s, std::int64_t first_page) {
  auto& table = page_tables[static_cast<std::size_t>(s)];
  for (std::size_t i = static_cast<std::size_t>(first_page); i < table.size(); ++i) kv.release(table[i]);
  if (static_cast<std::size_t>(first_page) < table.size()) table.resize(static_cast<std::size_t>(first_page));
}

// Checks the whole batch without changing anything.
void Context::Impl::validate(const Batch& batch, bool mtp) {
  ++stamp;
  std::int64_t pages = 0;
  const char* what = mtp ? "step_mtp" : "step";
  for (const auto& e : batch.entries()) {
    const Slot& sl = slot_for(e.seq, what);
    const int s = handle_index(e.seq);
    if (seen_stamp[static_cast<std::size_t>(s)] == stamp)
      throw Error(Status::invalid_argument, fmt::format("{}: sequence {:#x} appears twice in the batch", what, e.seq));
    seen_stamp[static_cast<std::size_t>(s)] = stamp;
    if (e.token_count <= 0)
      throw Error(Status::invalid_argument, fmt::format("{}: the entry for sequence {:#x} has no tokens", what, e.seq));
    for (std::int64_t i = 0; i < e.token_count; ++i) {
      const Token t = batch.tokens()[static_cast<std::size_t>(e.token_begin + i)];
      if (t < 0 || t >= c.vocab_size)
        throw Error(Status::invalid_token, fmt::format("{}: token id {} at index {} of sequence {:#x} is outside [0, {})",
                                                       what, t, i, e.seq, c.vocab_size));
    }
    const std::int64_t start = mtp ? sl.mtp_length : sl.length;
    if (start + e.token_count > p.max_context)
      throw Error(Status::context_overflow,
                  fmt::format("{}: sequence {:#x} at position {} cannot take {} more tokens: max_context is {}", what,
                              e.seq, start, e.token_count, p.max_context));
    pages += pages_needed(s, start, start + e.token_count);
  }
  if (pages > kv.free_pages())
    throw Error(Status::out_of_capacity,
                fmt::format("{}: the batch needs {} more KV pages but only {} are free", what, pages, kv.free_pages()));
}

void Context::Impl::norm_rows(const float* in, const std::vector<float>& scale, float* out, std::int64_t rows) {
  const std::int64_t H = c.hidden_size;
  pool.parallel_for(rows, 8, [&](std::int64_t r0, std::int64_t r1, int) {
    for (std::int64_t r = r0; r < r1; ++r) layers::rms_norm(in + r * H, scale.data(), out + r * H, H, c.rms_norm_eps);
  });
}

void Context::Impl::add_rows(float* acc, const float* d, std::int64_t rows) {
  const std::int64_t n = rows * c.hidden_size;
  for (std::int64_t i = 0; i < n; ++i) acc[i] += d[i];
}

void Context::Impl::rope_angles() {
  const int half = c.rotary_dim / 2;
  for (const auto& s : segs)
    for (std::int64_t t = 0; t < s.n; ++t)
      rope.angles(s.pos + t, cos.data() + (s.row + t) * half, sin.data() + (s.row + t) * half);
}

void Context::Impl::attention_and_mlp(cpu::Exec& ex, const DecoderLayerWeights& lw, int kv_layer, std::int64_t rows) {
  const std::int64_t H = c.hidden_size;
  layers::AttentionBuffers ab{proj.data(), ld_proj, aux.data(), core.data(), cos.data(), sin.data()};
  layers::AttentionLayer(c, lw.attn, rope).forward(ex, segs, xn.data(), H, rows, mix.data(), H, kv, kv_layer, page_tables, ab);
  add_rows(x.data(), mix.data(), rows);
  mlp(ex, lw, rows);
}

void Context::Impl::mlp(cpu::Exec& ex, const DecoderLayerWeights& lw, std::int64_t rows) {
  const std::int64_t H = c.hidden_size;
  norm_rows(x.data(), lw.post_attention_norm_scale, xn.data(), rows);
  layers::mlp_forward(ex, lw.mlp, xn.data(), H, rows, mix.data(), H, layers::MlpBuffers{proj.data(), ld_proj});
  add_rows(x.data(), mix.data(), rows);
}

template <typename StateT>
void Context::Impl::forward_layers(std::int64_t rows) {
  cpu::Exec ex = exec();
  const std::int64_t H = c.hidden_size;
  rope_angles();
  GdnStepLog* log = step_log.enabled() ? &step_log : nullptr;
  for (int l = 0; l < c.num_layers; ++l) {
    const auto& lw = w.layers[static_cast<std::size_t>(l)];
    norm_rows(x.data(), lw.input_norm_scale, xn.data(), rows);
    if (lw.kind == LayerKind::linear_attention) {
      layers::GdnBuffers gb{proj.data(), ld_proj, fused.data(), ld_fused, aux.data(), gates.data(), U, core.data()};
      const int g = gdn_index[static_cast<std::size_t>(l)];
      if (p.faults.drop_conv_state)
        for (const auto& sg : segs) std::fill_n(gdn_state.conv(sg.slot, g), gdn_state.conv_floats(), 0.0f);
      layers::GatedDeltaNetLayer<StateT>(c, lw.gdn, p.faults.tiled_value_heads).forward(ex, segs, xn.data(), H, rows, mix.data(), H, gdn_state,
                                                            gdn_index[static_cast<std::size_t>(l)], gb,
                                                            p.gdn_chunk_min_tokens, log);
      add_rows(x.data(), mix.data(), rows);
      mlp(ex, lw, rows);
    } else {
      attention_and_mlp(ex, lw, kv_index[static_cast<std::size_t>(l)], rows);
    }
  }
}

// Final norm (given scale) and lm_head for the rows that asked for logits.
void Context::Impl::emit_outputs(const std::vector<float>& final_scale) {
  if (outputs.empty()) return;
  cpu::Exec ex = exec();
  const std::int64_t H = c.hidden_size, V = c.vocab_size;
  pool.parallel_for(static_cast<std::int64_t>(outputs.size()), 4, [&](std::int64_t i0, std::int64_t i1, int) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const auto& o = outputs[static_cast<std::size_t>(i)];
      layers::rms_norm(x.data() + o.ubatch_row * H, final_scale.data(), hidden_buf.data() + o.out_row * H, H, c.rms_norm_eps);
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
    ex.linear(w.lm_head, hidden_buf.data() + r0 * H, H, static_cast<std::int64_t>(j - i), logits_buf.data() + r0 * V, V);
    i = j;
  }
}

// Walks the batch in ubatches of at most U rows. fill(entry, token index, row) prepares a row;
// run(rows) runs the layers and emits outputs.
template <typename Fill, typename Run>
void Context::Impl::for_each_ubatch(const Batch& batch, bool mtp, Fill&& fill, Run&& run) {
  const auto entries = batch.entries();
  const bool log = !mtp && step_log.enabled();
  std::size_t e = 0;
  std::int64_t i = 0;
  while (e < entries.size()) {
    segs.clear();
    outputs.clear();
    std::int64_t rows = 0;
    while (rows < U && e < entries.size()) {
      const auto& en = entries[e];
      const int s = handle_index(en.seq);
      const Slot& sl = slots[static_cast<std::size_t>(s)];
      // A sequence whose step fits the rollback log is never split across passes, so it is logged.
      const bool loggable = log && i == 0 && en.token_count <= step_log.max_tokens();
      if (loggable && rows > 0 && en.token_count > U - rows) break;
      const std::int64_t m = std::min(en.token_count - i, U - rows);
      const bool record = loggable;
      segs.push_back(cpu::Segment{s, rows, m, (mtp ? sl.mtp_length : sl.length) + i, record});
      for (std::int64_t t = 0; t < m; ++t) {
        fill(en, i + t, rows + t);
        const std::int64_t out = batch.output_row(e, i + t);
        if (out >= 0) outputs.push_back(OutputRow{rows + t, out, batch.wants_logits(e, i + t)});
      }
      rows += m;
      i += m;
      if (i == en.token_count) {
        ++e;
        i = 0;
      }
    }
    run(rows);
  }
}

void Context::Impl::step(const Batch& batch) {
  validate(batch, false);
  ensure_output_rows(batch.output_rows());
  for (const auto& en : batch.entries()) {
    const int s = handle_index(en.seq);
    const auto& sl = slots[static_cast<std::size_t>(s)];
    prepare_pages(s, sl.length, sl.length + en.token_count);
  }
  const std::int64_t H = c.hidden_size;
  for_each_ubatch(
      batch, false,
      [&](const Batch::Entry& en, std::int64_t i, std::int64_t row) {
        cpu::gather_row(w.embed_tokens, batch.tokens()[static_cast<std::size_t>(en.token_begin + i)], x.data() + row * H);
      },
      [&](std::int64_t rows) {
        if (gdn_state.state_dtype() == DType::bf16) forward_layers<bf16>(rows);
        else forward_layers<float>(rows);
        emit_outputs(w.final_norm_scale);
      });
  for (const auto& en : batch.entries()) {
    Slot& sl = slots[static_cast<std::size_t>(handle_index(en.seq))];
    const bool logged = step_log.enabled() && en.token_count <= step_log.max_tokens();
    sl.log_start = sl.length;
    sl.log_tokens = logged ? en.token_count : 0;
    sl.length += en.token_count;
  }
  set_output_flags(batch);
}

void Context::Impl::step_mtp(const Batch& batch, std::span<const float> hidden) {
  if (!model->has_mtp()) throw Error(Status::unsupported_model, fmt::format("step_mtp: '{}' has no MTP head", model->dir()));
  const std::int64_t H = c.hidden_size;
  if (static_cast<std::int64_t>(hidden.size()) != batch.token_count() * H)
    throw Error(Status::invalid_argument, fmt::format("step_mtp: {} hidden values given for {} tokens of width {}",
                                                      hidden.size(), batch.token_count(), H));
  validate(batch, true);
  ensure_output_rows(batch.output_rows());
  for (const auto& en : batch.entries()) {
    const int s = handle_index(en.seq);
    const auto& sl = slots[static_cast<std::size_t>(s)];
    prepare_pages(s, sl.mtp_length, sl.mtp_length + en.token_count);
  }
  const MtpWeights& m = *w.mtp;
  for_each_ubatch(
      batch, true,
      [&](const Batch::Entry& en, std::int64_t i, std::int64_t row) {
        // fc input: [norm(embedding) ; norm(hidden)], embedding first.
        float* in = proj.data() + row * ld_proj;
        cpu::gather_row(w.embed_tokens, batch.tokens()[static_cast<std::size_t>(en.token_begin + i)], xn.data() + row * H);
        layers::rms_norm(xn.data() + row * H, m.pre_fc_norm_embedding_scale.data(), in, H, c.rms_norm_eps);
        layers::rms_norm(hidden.data() + (en.token_begin + i) * H, m.pre_fc_norm_hidden_scale.data(), in + H, H,
                         c.rms_norm_eps);
      },
      [&](std::int64_t rows) {
        cpu::Exec ex = exec();
        ex.linear(m.fc, proj.data(), ld_proj, rows, x.data(), H);
        rope_angles();
        norm_rows(x.data(), m.layer.input_norm_scale, xn.data(), rows);
        attention_and_mlp(ex, m.layer, mtp_kv_layer, rows);
        emit_outputs(m.norm_scale);
      });
  for (const auto& en : batch.entries()) slots[static_cast<std::size_t>(handle_index(en.seq))].mtp_length += en.token_count;
  set_output_flags(batch);
}

void Context::Impl::rollback(SeqId seq, std::int64_t keep) {
  Slot& sl = slot_for(seq, "rollback");
  const int s = handle_index(seq);
  if (sl.log_tokens == 0 || sl.length != sl.log_start + sl.log_tokens)
    throw Error(Status::invalid_argument,
                fmt::format("rollback: sequence {:#x} has no step to roll back (needs max_rollback_tokens >= the step's "
                            "tokens, currently {}, and applies only to the sequence's most recent step)",
                            seq, p.max_rollback_tokens));
  if (keep < 0 || keep > sl.log_tokens)
    throw Error(Status::invalid_argument,
                fmt::format("rollback: keep = {} is outside [0, {}] for sequence {:#x}", keep, sl.log_tokens, seq));
  if (keep < sl.log_tokens) {
    cpu::Exec ex = exec();
    layers::GdnBuffers gb{proj.data(), ld_proj, fused.data(), ld_fused, aux.data(), gates.data(), U, core.data()};
    for (int l = 0; l < c.num_layers; ++l) {
      const int g = gdn_index[static_cast<std::size_t>(l)];
      if (g < 0) continue;
      const auto& lw = w.layers[static_cast<std::size_t>(l)];
      if (gdn_state.state_dtype() == DType::bf16)
        layers::GatedDeltaNetLayer<bf16>(c, lw.gdn, p.faults.tiled_value_heads).replay(ex, s, keep, gdn_state, g, step_log, gb, p.gdn_chunk_min_tokens);
      else
        layers::GatedDeltaNetLayer<float>(c, lw.gdn, p.faults.tiled_value_heads).replay(ex, s, keep, gdn_state, g, step_log, gb, p.gdn_chunk_min_tokens);
    }
    // Attention KV beyond the kept positions is simply overwritten later.
    sl.length = sl.log_start + keep;
    release_pages_from(s, ceil_div(covered_positions(sl), p.kv_page_size));
  }
  // The log now describes a step of `keep` tokens from the same start, so a second rollback to
  // fewer tokens is still exact.
  sl.log_tokens = keep;
}

Context::Context(std::shared_ptr<const Model> model, const ContextParams& params)
    : impl_(std::make_unique<Impl>(std::move(model), params)) {}
Context::~Context() = default;

const Model& Context::model() const noexcept { return *impl_->model; }
const ContextParams& Context::params() const noexcept { return impl_->p; }

SeqId Context::create_sequence() {
  const int s = impl_->acquire_slot("create_sequence");
  return make_handle(s, impl_->slots[static_cast<std::size_t>(s)].generation);
}

void Context::reset_sequence(SeqId seq) {
  auto& sl = impl_->slot_for(seq, "reset_sequence");
  const int s = handle_index(seq);
  impl_->release_pages(s);
  impl_->gdn_state.clear(s);
  sl.length = sl.mtp_length = sl.log_start = sl.log_tokens = 0;
}

void Context::free_sequence(SeqId seq) {
  auto& sl = impl_->slot_for(seq, "free_sequence");
  const int s = handle_index(seq);
  impl_->release_pages(s);
  impl_->gdn_state.clear(s);
  sl = Impl::Slot{};
  sl.generation = handle_generation(seq) + 1;
}

bool Context::is_valid(SeqId seq) const noexcept {
  const int s = handle_index(seq);
  const auto& slots = impl_->slots;
  return s >= 0 && s < static_cast<int>(slots.size()) && slots[static_cast<std::size_t>(s)].live &&
         slots[static_cast<std::size_t>(s)].generation == handle_generation(seq);
}

std::int64_t Context::sequence_length(SeqId seq) const { return impl_->slot_for(seq, "sequence_length").length; }
std::int64_t Context::mtp_length(SeqId seq) const { return impl_->slot_for(seq, "mtp_length").mtp_length; }

int Context::live_sequences() const noexcept {
  return static_cast<int>(std::count_if(impl_->slots.begin(), impl_->slots.end(), [](const auto& s) { return s.live; }));
}

void Context::step(const Batch& batch) { impl_->step(batch); }
void Context::step_mtp(const Batch& batch, std::span<const float> hidden) { impl_->step_mtp(batch, hidden); }
void Context::rollback(SeqId seq, std::int64_t keep) { impl_->rollback(seq, keep); }

std::int64_t Context::rollbackable_tokens(SeqId seq) const {
  const auto& sl = impl_->slot_for(seq, "rollbackable_tokens");
  return sl.length == sl.log_start + sl.log_tokens ? sl.log_tokens : 0;
}

std::int64_t Context::output_rows() const noexcept { return impl_->output_rows; }

std::span<const float> Context::logits(std::int64_t row) const {
  if (row < 0 || row >= impl_->output_rows)
    throw Error(Status::invalid_argument, fmt::format("logits: row {} is outside the last step's {} rows", row, impl_->output_rows));
  if (!impl_->row_has_logits[static_cast<std::size_t>(row)])
    throw Error(Status::invalid_argument, fmt::format("logits: row {} carries only a hidden state (no logits were asked for)", row));
  const auto V = static_cast<std::size_t>(impl_->c.vocab_size);
  return {impl_->logits_buf.data() + static_cast<std::size_t>(row) * V, V};
}

std::span<const float> Context::hidden(std::int64_t row) const {
  if (row < 0 || row >= impl_->output_rows)
    throw Error(Status::invalid_argument, fmt::format("hidden: row {} is outside the last step's {} rows", row, impl_->output_rows));
  const auto H = static_cast<std::size_t>(impl_->c.hidden_size);
  return {impl_->hidden_buf.data() + static_cast<std::size_t>(row) * H, H};
}

std::int64_t Context::gdn_state_bytes_per_sequence() const noexcept { return impl_->gdn_state.bytes_per_sequence(); }
std::int64_t Context::snapshot_bytes() const noexcept { return impl_->gdn_state.bytes_per_sequence(); }
std::int64_t Context::rollback_bytes_per_sequence() const noexcept {
  return impl_->step_log.enabled() ? impl_->step_log.bytes_per_sequence() : 0;
}

std::int64_t Context::kv_bytes_per_token() const noexcept {
  const auto& c = impl_->c;
  const std::int64_t layers = c.count_layers(LayerKind::full_attention) + (impl_->model->has_mtp() ? 1 : 0);
  return layers * 2 * c.attn_kv_dim() * static_cast<std::int64_t>(sizeof(float));
}

std::int64_t Context::kv_free_pages() const noexcept { return impl_->kv.free_pages(); }

}  // namespace gdn
