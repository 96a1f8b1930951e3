// The CPU model graph: one step runs every listed sequence through the decoder layers, in passes of
// at most max_batch_tokens rows ("ubatches"). Within a pass all sequences share each projection
// (each weight is streamed once per pass, whatever the number of sequences); the sequence-local
// parts (conv, delta rule, attention) run per segment.
//
//   h ← embed(tokens)
//   per layer:  h ← h + mixer(rms_norm(h));  h ← h + mlp(rms_norm(h))     mixer = GDN or attention
//   logits ← lm_head(rms_norm(h)) for the rows that asked for them

#include "gdn/runtime/context.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "gdn/backend/cpu/exec.hpp"
#include "gdn/core/error.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/layers/attention.hpp"
#include "gdn/layers/gated_delta_net.hpp"
#include "gdn/layers/mlp.hpp"
#include "gdn/layers/rms_norm.hpp"
#include "gdn/layers/rope.hpp"
#include "gdn/state/gdn_state.hpp"
#include "gdn/state/kv_pages.hpp"

namespace gdn {
namespace {

constexpr int slot_of(SeqId id) { return static_cast<int>(id & 0xffffffffu); }
constexpr std::uint32_t generation_of(SeqId id) { return static_cast<std::uint32_t>(id >> 32); }
constexpr SeqId make_seq_id(int slot, std::uint32_t generation) {
  return (static_cast<SeqId>(generation) << 32) | static_cast<std::uint32_t>(slot);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

struct Context::Impl {
  struct Slot {
    bool live = false;
    std::uint32_t generation = 0;
    std::int64_t length = 0;
    std::int64_t mtp_length = 0;
  };
  // Where a wanted logits row comes from in the current ubatch.
  struct OutputRow {
    std::int64_t ubatch_row;
    std::int64_t out_row;
  };

  std::shared_ptr<const Model> model;
  const ModelConfig& c;
  const ModelWeights& w;
  ContextParams p;
  ThreadPool pool;
  std::vector<cpu::ThreadScratch> thread_scratch;
  GdnStatePool gdn_state;
  KvPagePool kv;
  std::vector<Slot> slots;
  std::vector<std::vector<std::int32_t>> page_tables;  // per slot; capacity reserved up front
  std::vector<std::uint32_t> seen_stamp;               // duplicate detection in validate()
  std::uint32_t stamp = 0;
  layers::Rope rope;
  std::vector<int> gdn_index, kv_index;  // per layer: index among GDN layers / KV layers (-1 if n/a)
  int mtp_kv_layer = -1;

  // Work buffers for U = max_batch_tokens rows.
  std::int64_t U = 0, ld_proj = 0, ld_fused = 0, ld_aux = 0;
  std::vector<float> x, xn, mix, proj, fused, aux, gates, core, cos, sin;
  std::vector<cpu::Segment> segs;
  std::vector<OutputRow> outputs;
  std::vector<float> logits_buf, hidden_buf;
  std::int64_t logits_rows = 0;

  Impl(std::shared_ptr<const Model> m, const ContextParams& params)
      : model(std::move(m)), c(model->config()), w(model->weights()), p(params), pool(params.threads) {
    if (p.backend != Backend::cpu)
      throw Error(Status::backend_unavailable, "this context type runs the CPU backend; the CUDA backend is not wired into Context yet");
    if (p.max_sequences < 1 || p.max_sequences > (1 << 20))
      throw Error(Status::invalid_argument, fmt::format("max_sequences must be in [1, 2^20], got {}", p.max_sequences));
    if (p.max_context < 1)
      throw Error(Status::invalid_argument, fmt::format("max_context must be positive, got {}", p.max_context));
    if (p.kv_page_size < 1 || p.kv_page_size > 4096)
      throw Error(Status::invalid_argument, fmt::format("kv_page_size must be in [1, 4096], got {}", p.kv_page_size));
    if (p.max_batch_tokens < 1)
      throw Error(Status::invalid_argument, fmt::format("max_batch_tokens must be positive, got {}", p.max_batch_tokens));
    const DType sd = p.state_dtype.value_or(c.ssm_state_dtype);
    if (sd != DType::f32 && sd != DType::bf16)
      throw Error(Status::invalid_argument, fmt::format("state_dtype must be F32 or BF16, got {}", dtype_name(sd)));

    // Layer bookkeeping.
    int n_gdn = 0, n_kv = 0;
    for (const auto kind : c.layer_types) {
      gdn_index.push_back(kind == LayerKind::linear_attention ? n_gdn++ : -1);
      kv_index.push_back(kind == LayerKind::full_attention ? n_kv++ : -1);
    }
    if (model->has_mtp()) mtp_kv_layer = n_kv++;

    gdn_state = GdnStatePool(c, p.max_sequences, sd);
    const std::int64_t pages_per_seq = ceil_div(p.max_context, p.kv_page_size);
    const std::int64_t pages = p.kv_pages > 0 ? p.kv_pages : pages_per_seq * p.max_sequences;
    kv = KvPagePool(n_kv > 0 ? pages : 0, p.kv_page_size, n_kv, c.num_key_value_heads, c.head_dim);
    slots.resize(static_cast<std::size_t>(p.max_sequences));
    page_tables.resize(static_cast<std::size_t>(p.max_sequences));
    for (auto& t : page_tables) t.reserve(static_cast<std::size_t>(pages_per_seq));
    seen_stamp.assign(static_cast<std::size_t>(p.max_sequences), 0);
    rope = layers::Rope(c.rotary_dim, c.rope_theta);

    // Buffers.
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
    ensure_output_rows(p.max_logits_rows > 0 ? p.max_logits_rows : std::max(p.max_sequences, 64));
  }

  void ensure_output_rows(std::int64_t rows) {
    const auto need = static_cast<std::size_t>(rows);
    if (logits_buf.size() < need * static_cast<std::size_t>(c.vocab_size)) {
      logits_buf.resize(need * static_cast<std::size_t>(c.vocab_size));
      hidden_buf.resize(need * static_cast<std::size_t>(c.hidden_size));
    }
  }

  Slot& slot_for(SeqId id, const char* what) {
    const int s = slot_of(id);
    if (s < 0 || s >= p.max_sequences || !slots[static_cast<std::size_t>(s)].live ||
        slots[static_cast<std::size_t>(s)].generation != generation_of(id))
      throw Error(Status::invalid_sequence, fmt::format("{}: sequence id {:#x} is not a live sequence of this context", what, id));
    return slots[static_cast<std::size_t>(s)];
  }
  const Slot& slot_for(SeqId id, const char* what) const { return const_cast<Impl*>(this)->slot_for(id, what); }

  void release_pages(int s) {
    for (const auto page : page_tables[static_cast<std::size_t>(s)]) kv.release(page);
    page_tables[static_cast<std::size_t>(s)].clear();
  }

  // Checks the whole batch without changing anything. Returns the KV pages it needs.
  std::int64_t validate(const Batch& batch, bool mtp) {
    ++stamp;
    std::int64_t pages_needed = 0;
    const char* what = mtp ? "step_mtp" : "step";
    for (const auto& e : batch.entries()) {
      Slot& sl = slot_for(e.seq, what);
      const int s = slot_of(e.seq);
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
      const std::int64_t positions = std::max(sl.length, sl.mtp_length) + (mtp ? 0 : e.token_count);
      const std::int64_t want = std::max(positions, start + e.token_count);
      if (kv.capacity() > 0)
        pages_needed += ceil_div(want, p.kv_page_size) - static_cast<std::int64_t>(page_tables[static_cast<std::size_t>(s)].size());
    }
    if (pages_needed > kv.free_pages())
      throw Error(Status::out_of_capacity, fmt::format("{}: the batch needs {} more KV pages but only {} are free", what,
                                                       pages_needed, kv.free_pages()));
    return pages_needed;
  }

  void reserve_pages(const Batch& batch, bool mtp) {
    if (kv.capacity() == 0) return;
    for (const auto& e : batch.entries()) {
      const int s = slot_of(e.seq);
      const Slot& sl = slots[static_cast<std::size_t>(s)];
      const std::int64_t start = mtp ? sl.mtp_length : sl.length;
      const std::int64_t want = std::max(std::max(sl.length, sl.mtp_length) + (mtp ? 0 : e.token_count), start + e.token_count);
      auto& table = page_tables[static_cast<std::size_t>(s)];
      while (static_cast<std::int64_t>(table.size()) < ceil_div(want, p.kv_page_size)) table.push_back(kv.acquire());
    }
  }

  cpu::Exec exec() { return cpu::Exec{pool, thread_scratch}; }

  void norm_rows(const float* in, const std::vector<float>& scale, float* out, std::int64_t rows) {
    const std::int64_t H = c.hidden_size;
    pool.parallel_for(rows, 8, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t r = r0; r < r1; ++r) layers::rms_norm(in + r * H, scale.data(), out + r * H, H, c.rms_norm_eps);
    });
  }

  void add_rows(float* acc, const float* d, std::int64_t rows) {
    const std::int64_t n = rows * c.hidden_size;
    for (std::int64_t i = 0; i < n; ++i) acc[i] += d[i];
  }

  void rope_angles(std::int64_t rows) {
    const int half = c.rotary_dim / 2;
    for (const auto& s : segs)
      for (std::int64_t t = 0; t < s.n; ++t)
        rope.angles(s.pos + t, cos.data() + (s.row + t) * half, sin.data() + (s.row + t) * half);
    (void)rows;
  }

  void attention_and_mlp(cpu::Exec& ex, const DecoderLayerWeights& lw, int kv_layer, std::int64_t rows) {
    const std::int64_t H = c.hidden_size;
    layers::AttentionBuffers ab{proj.data(), ld_proj, aux.data(), core.data(), cos.data(), sin.data()};
    layers::AttentionLayer(c, lw.attn, rope).forward(ex, segs, xn.data(), H, rows, mix.data(), H, kv, kv_layer,
                                                     page_tables, ab);
    add_rows(x.data(), mix.data(), rows);
    mlp(ex, lw, rows);
  }

  void mlp(cpu::Exec& ex, const DecoderLayerWeights& lw, std::int64_t rows) {
    const std::int64_t H = c.hidden_size;
    norm_rows(x.data(), lw.post_attention_norm_scale, xn.data(), rows);
    layers::mlp_forward(ex, lw.mlp, xn.data(), H, rows, mix.data(), H, layers::MlpBuffers{proj.data(), ld_proj});
    add_rows(x.data(), mix.data(), rows);
  }

  template <typename StateT>
  void forward_layers(std::int64_t rows) {
    cpu::Exec ex = exec();
    const std::int64_t H = c.hidden_size;
    rope_angles(rows);
    for (int l = 0; l < c.num_layers; ++l) {
      const auto& lw = w.layers[static_cast<std::size_t>(l)];
      norm_rows(x.data(), lw.input_norm_scale, xn.data(), rows);
      if (lw.kind == LayerKind::linear_attention) {
        layers::GdnBuffers gb{proj.data(), ld_proj, fused.data(), ld_fused, aux.data(), gates.data(), U, core.data()};
        layers::GatedDeltaNetLayer<StateT>(c, lw.gdn).forward(ex, segs, xn.data(), H, rows, mix.data(), H, gdn_state,
                                                              gdn_index[static_cast<std::size_t>(l)], gb,
                                                              p.gdn_chunk_min_tokens);
        add_rows(x.data(), mix.data(), rows);
        mlp(ex, lw, rows);
      } else {
        attention_and_mlp(ex, lw, kv_index[static_cast<std::size_t>(l)], rows);
      }
    }
  }

  // Final norm (given scale) and lm_head for the rows that asked for logits.
  void emit_outputs(const std::vector<float>& final_scale) {
    if (outputs.empty()) return;
    cpu::Exec ex = exec();
    const std::int64_t H = c.hidden_size, V = c.vocab_size;
    // Contiguous runs of output rows go through lm_head together.
    pool.parallel_for(static_cast<std::int64_t>(outputs.size()), 4, [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const auto& o = outputs[static_cast<std::size_t>(i)];
        layers::rms_norm(x.data() + o.ubatch_row * H, final_scale.data(), hidden_buf.data() + o.out_row * H, H,
                         c.rms_norm_eps);
      }
    });
    std::size_t i = 0;
    while (i < outputs.size()) {
      std::size_t j = i + 1;
      while (j < outputs.size() && outputs[j].out_row == outputs[j - 1].out_row + 1) ++j;
      const std::int64_t r0 = outputs[i].out_row;
      ex.linear(w.lm_head, hidden_buf.data() + r0 * H, H, static_cast<std::int64_t>(j - i), logits_buf.data() + r0 * V, V);
      i = j;
    }
  }

  // Walks the batch in ubatches of at most U rows. fill(entry, token index, row) prepares a row;
  // run(rows) runs the layers and emits outputs.
  template <typename Fill, typename Run>
  void for_each_ubatch(const Batch& batch, bool mtp, Fill&& fill, Run&& run) {
    const auto entries = batch.entries();
    std::size_t e = 0;
    std::int64_t i = 0;
    while (e < entries.size()) {
      segs.clear();
      outputs.clear();
      std::int64_t rows = 0;
      while (rows < U && e < entries.size()) {
        const auto& en = entries[e];
        const int s = slot_of(en.seq);
        const Slot& sl = slots[static_cast<std::size_t>(s)];
        const std::int64_t m = std::min(en.token_count - i, U - rows);
        segs.push_back(cpu::Segment{s, rows, m, (mtp ? sl.mtp_length : sl.length) + i});
        for (std::int64_t t = 0; t < m; ++t) {
          fill(en, i + t, rows + t);
          const std::int64_t out = batch.logits_row(e, i + t);
          if (out >= 0) outputs.push_back(OutputRow{rows + t, out});
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

  void step(const Batch& batch) {
    validate(batch, false);
    ensure_output_rows(batch.logits_rows());
    reserve_pages(batch, false);
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
    for (const auto& en : batch.entries()) slots[static_cast<std::size_t>(slot_of(en.seq))].length += en.token_count;
    logits_rows = batch.logits_rows();
  }

  void step_mtp(const Batch& batch, std::span<const float> hidden) {
    if (!model->has_mtp())
      throw Error(Status::unsupported_model, fmt::format("step_mtp: '{}' has no MTP head", model->dir()));
    const std::int64_t H = c.hidden_size;
    if (static_cast<std::int64_t>(hidden.size()) != batch.token_count() * H)
      throw Error(Status::invalid_argument, fmt::format("step_mtp: {} hidden values given for {} tokens of width {}",
                                                        hidden.size(), batch.token_count(), H));
    validate(batch, true);
    ensure_output_rows(batch.logits_rows());
    reserve_pages(batch, true);
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
          rope_angles(rows);
          norm_rows(x.data(), m.layer.input_norm_scale, xn.data(), rows);
          attention_and_mlp(ex, m.layer, mtp_kv_layer, rows);
          emit_outputs(m.norm_scale);
        });
    for (const auto& en : batch.entries()) slots[static_cast<std::size_t>(slot_of(en.seq))].mtp_length += en.token_count;
    logits_rows = batch.logits_rows();
  }
};

Context::Context(std::shared_ptr<const Model> model, const ContextParams& params)
    : impl_(std::make_unique<Impl>(std::move(model), params)) {}
Context::~Context() = default;

const Model& Context::model() const noexcept { return *impl_->model; }
const ContextParams& Context::params() const noexcept { return impl_->p; }

SeqId Context::create_sequence() {
  auto& slots = impl_->slots;
  for (std::size_t s = 0; s < slots.size(); ++s) {
    if (!slots[s].live) {
      slots[s].live = true;
      slots[s].length = 0;
      slots[s].mtp_length = 0;
      impl_->gdn_state.clear(static_cast<int>(s));
      return make_seq_id(static_cast<int>(s), slots[s].generation);
    }
  }
  throw Error(Status::out_of_capacity,
              fmt::format("create_sequence: all {} sequence slots are in use", impl_->p.max_sequences));
}

void Context::reset_sequence(SeqId seq) {
  auto& sl = impl_->slot_for(seq, "reset_sequence");
  const int s = slot_of(seq);
  impl_->release_pages(s);
  impl_->gdn_state.clear(s);
  sl.length = 0;
  sl.mtp_length = 0;
}

void Context::free_sequence(SeqId seq) {
  auto& sl = impl_->slot_for(seq, "free_sequence");
  const int s = slot_of(seq);
  impl_->release_pages(s);
  impl_->gdn_state.clear(s);
  sl = Impl::Slot{false, sl.generation + 1, 0, 0};
}

bool Context::is_valid(SeqId seq) const noexcept {
  const int s = slot_of(seq);
  const auto& slots = impl_->slots;
  return s >= 0 && s < static_cast<int>(slots.size()) && slots[static_cast<std::size_t>(s)].live &&
         slots[static_cast<std::size_t>(s)].generation == generation_of(seq);
}

std::int64_t Context::sequence_length(SeqId seq) const { return impl_->slot_for(seq, "sequence_length").length; }
std::int64_t Context::mtp_length(SeqId seq) const { return impl_->slot_for(seq, "mtp_length").mtp_length; }

int Context::live_sequences() const noexcept {
  return static_cast<int>(std::count_if(impl_->slots.begin(), impl_->slots.end(), [](const auto& s) { return s.live; }));
}

void Context::step(const Batch& batch) { impl_->step(batch); }
void Context::step_mtp(const Batch& batch, std::span<const float> hidden) { impl_->step_mtp(batch, hidden); }

std::int64_t Context::logits_rows() const noexcept { return impl_->logits_rows; }

std::span<const float> Context::logits(std::int64_t row) const {
  if (row < 0 || row >= impl_->logits_rows)
    throw Error(Status::invalid_argument, fmt::format("logits: row {} is outside the last step's {} rows", row, impl_->logits_rows));
  const auto V = static_cast<std::size_t>(impl_->c.vocab_size);
  return {impl_->logits_buf.data() + static_cast<std::size_t>(row) * V, V};
}

std::span<const float> Context::hidden(std::int64_t row) const {
  if (row < 0 || row >= impl_->logits_rows)
    throw Error(Status::invalid_argument, fmt::format("hidden: row {} is outside the last step's {} rows", row, impl_->logits_rows));
  const auto H = static_cast<std::size_t>(impl_->c.hidden_size);
  return {impl_->hidden_buf.data() + static_cast<std::size_t>(row) * H, H};
}

std::int64_t Context::gdn_state_bytes_per_sequence() const noexcept { return impl_->gdn_state.bytes_per_sequence(); }

std::int64_t Context::kv_bytes_per_token() const noexcept {
  const auto& c = impl_->c;
  const std::int64_t layers = c.count_layers(LayerKind::full_attention) + (impl_->model->has_mtp() ? 1 : 0);
  return layers * 2 * c.attn_kv_dim() * static_cast<std::int64_t>(sizeof(float));
}

std::int64_t Context::kv_free_pages() const noexcept { return impl_->kv.free_pages(); }

}  // namespace gdn
