// The engine: a step validates the whole batch first (nothing changes on error), makes the KV
// positions it writes private to their sequence (copy-on-write), then walks the batch in passes of
// at most max_batch_tokens rows ("ubatches") and hands each to the backend as a plan: which rows
// belong to which sequence slot at which position, and which rows are outputs. Only after every
// pass succeeded are the sequences' lengths advanced.

#include "context_impl.hpp"

#include "fault_backend.hpp"
#include "testing.hpp"

namespace gdn {
namespace {

BackendParams backend_params(const ModelConfig& c, const ContextParams& p, const ContextHooks& hooks, std::int64_t pages,
                             std::int64_t output_rows) {
  BackendParams b;
  b.slots = p.max_sequences;
  b.kv_pages = pages;  // 0 when the model has no attention layer (nor an MTP head, whose layer is one)
  b.kv_page_size = p.kv_page_size;
  b.max_context = p.max_context;
  b.max_pass_rows = p.max_batch_tokens;
  b.max_output_rows = static_cast<int>(std::min<std::int64_t>(output_rows, p.max_batch_tokens));
  b.state_dtype = p.state_dtype.value_or(c.ssm_state_dtype);
  b.kv_dtype = p.kv_dtype.value_or(default_kv_dtype(p.backend));
  b.matmul_input = p.matmul_input;
  b.threads = p.threads;
  b.gdn_chunk_min_tokens = p.gdn_chunk_min_tokens;
  b.max_rollback_tokens = p.max_rollback_tokens;
  b.device = p.device;
  b.cuda_graphs = p.cuda_graphs;
  b.tiled_value_heads = hooks.tiled_value_heads;
  return b;
}

}  // namespace

Context::Impl::Impl(std::shared_ptr<const Model> m, const ContextParams& params, const ContextHooks& h)
    : model(std::move(m)), c(model->config()), p(params), hooks(h) {
  if (p.backend != Backend::cpu && p.backend != Backend::cuda)
    throw Error(Status::invalid_argument, fmt::format("backend must be cpu or cuda, got {}", static_cast<int>(p.backend)));
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
  if (p.gdn_chunk_min_tokens < 1)
    throw Error(Status::invalid_argument, fmt::format("gdn_chunk_min_tokens must be positive, got {}", p.gdn_chunk_min_tokens));
  if (p.max_logits_rows < 0)
    throw Error(Status::invalid_argument, fmt::format("max_logits_rows must not be negative, got {}", p.max_logits_rows));
  if (p.device < 0) throw Error(Status::invalid_argument, fmt::format("device must not be negative, got {}", p.device));
  const DType sd = p.state_dtype.value_or(c.ssm_state_dtype);
  if (sd != DType::f32 && sd != DType::bf16)
    throw Error(Status::invalid_argument, fmt::format("state_dtype must be F32 or BF16, got {}", dtype_name(sd)));
  const DType kd = p.kv_dtype.value_or(default_kv_dtype(p.backend));
  if (kd != DType::f32 && kd != DType::bf16)
    throw Error(Status::invalid_argument, fmt::format("kv_dtype must be F32 or BF16, got {}", dtype_name(kd)));
  if (p.backend == Backend::cuda && kd != DType::bf16)
    throw Error(Status::invalid_argument,
                fmt::format("kv_dtype {}: the CUDA backend keeps its KV cache in BF16 only (F32 KV is the CPU's)", dtype_name(kd)));

  const std::int64_t pages_per_seq = ceil_div(p.max_context, p.kv_page_size);
  const std::int64_t n_pages = p.kv_pages > 0 ? p.kv_pages : pages_per_seq * p.max_sequences;
  // Page ids are 32-bit.
  if (n_pages > std::numeric_limits<std::int32_t>::max())
    throw Error(Status::out_of_capacity,
                fmt::format("a KV cache of {} pages is beyond what one context can address (page ids are 32-bit); lower "
                            "max_context, max_sequences or kv_pages",
                            n_pages));
  // The MTP layer is a full-attention layer with its own KV: a model whose main layers are all GDN
  // still needs pages for it.
  const bool has_kv = c.count_layers(LayerKind::full_attention) > 0 || model->has_mtp();
  const std::int64_t out_rows = p.max_logits_rows > 0 ? p.max_logits_rows : std::max(p.max_sequences, 64);
  const BackendParams bp = backend_params(c, p, hooks, has_kv ? n_pages : 0, out_rows);
  backend = p.backend == Backend::cuda ? make_cuda_backend(model, bp) : make_cpu_backend(model, bp);
  if (hooks.drop_conv_state) backend = std::make_unique<DropConvStateBackend>(std::move(backend));

  pages = PageAllocator(has_kv ? n_pages : 0);
  slots.resize(static_cast<std::size_t>(p.max_sequences));
  page_tables.resize(static_cast<std::size_t>(p.max_sequences));
  for (auto& t : page_tables) t.reserve(static_cast<std::size_t>(pages_per_seq));
  seen_stamp.assign(static_cast<std::size_t>(p.max_sequences), 0);
  segs.reserve(static_cast<std::size_t>(p.max_sequences));
  outputs.reserve(static_cast<std::size_t>(p.max_batch_tokens));
  ensure_output_rows(out_rows);
}

void Context::Impl::check_usable(const char* what) const {
  if (!failure.empty())
    throw Error(Status::internal, fmt::format("{}: the context is unusable after an earlier failure that may have left its "
                                              "state half-written ({}); create a new context",
                                              what, failure));
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
  check_usable(what);
  for (std::size_t s = 0; s < slots.size(); ++s) {
    if (!slots[s].live) {
      guarded([&] { backend->clear_slot(static_cast<int>(s)); });
      slots[s].live = true;
      slots[s].length = slots[s].mtp_length = 0;
      slots[s].log_start = slots[s].log_tokens = 0;
      return static_cast<int>(s);
    }
  }
  throw Error(Status::out_of_capacity, fmt::format("{}: all {} sequence slots are in use", what, p.max_sequences));
}

std::int64_t Context::Impl::pages_needed(int s, std::int64_t begin, std::int64_t end) const {
  if (pages.capacity() == 0 || end <= begin) return 0;
  const auto& table = page_tables[static_cast<std::size_t>(s)];
  const std::int64_t have = static_cast<std::int64_t>(table.size());
  const std::int64_t first = begin / p.kv_page_size, last = ceil_div(end, p.kv_page_size);  // pages [first, last)
  std::int64_t n = std::max<std::int64_t>(0, last - have);
  for (std::int64_t i = first; i < std::min(last, have); ++i)
    if (pages.refcount(table[static_cast<std::size_t>(i)]) > 1) ++n;  // shared: copy before writing
  return n;
}

void Context::Impl::prepare_pages(int s, std::int64_t begin, std::int64_t end) {
  if (pages.capacity() == 0 || end <= begin) return;
  auto& table = page_tables[static_cast<std::size_t>(s)];
  const std::int64_t first = begin / p.kv_page_size, last = ceil_div(end, p.kv_page_size);
  for (std::int64_t i = first; i < std::min<std::int64_t>(last, static_cast<std::int64_t>(table.size())); ++i) {
    const std::int32_t old = table[static_cast<std::size_t>(i)];
    if (pages.refcount(old) > 1) {
      const std::int32_t fresh = pages.acquire();
      guarded([&] { backend->copy_kv_page(old, fresh); });
      pages.release(old);
      table[static_cast<std::size_t>(i)] = fresh;
    }
  }
  while (static_cast<std::int64_t>(table.size()) < last) table.push_back(pages.acquire());
}

void Context::Impl::release_pages_from(int s, std::int64_t first_page) {
  auto& table = page_tables[static_cast<std::size_t>(s)];
  for (std::size_t i = static_cast<std::size_t>(first_page); i < table.size(); ++i) pages.release(table[i]);
  if (static_cast<std::size_t>(first_page) < table.size()) table.resize(static_cast<std::size_t>(first_page));
}

// Checks the whole batch without changing anything.
void Context::Impl::validate(const Batch& batch, bool mtp) {
  const char* what = mtp ? "step_mtp" : "step";
  check_usable(what);
  ++stamp;
  std::int64_t need = 0;
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
    need += pages_needed(s, start, start + e.token_count);
  }
  if (need > pages.free_pages())
    throw Error(Status::out_of_capacity,
                fmt::format("{}: the batch needs {} more KV pages but only {} are free", what, need, pages.free_pages()));
}

// Walks the batch in passes of at most U rows, in batch order (so each pass's tokens, and the MTP
// hidden rows, are one contiguous run of the batch's).
void Context::Impl::run_passes(const Batch& batch, bool mtp, const float* hidden) {
  const auto entries = batch.entries();
  const std::int64_t U = p.max_batch_tokens, H = c.hidden_size;
  const bool log = !mtp && p.max_rollback_tokens > 0;
  const PassOutputs out{logits_buf.data(), hidden_buf.data()};
  std::size_t e = 0;
  std::int64_t i = 0, first_token = 0;
  while (e < entries.size()) {
    segs.clear();
    outputs.clear();
    std::int64_t rows = 0;
    while (rows < U && e < entries.size()) {
      const auto& en = entries[e];
      const int s = handle_index(en.seq);
      const Slot& sl = slots[static_cast<std::size_t>(s)];
      // A sequence whose step fits the rollback log is never split across passes, so it is logged.
      const bool record = log && i == 0 && en.rollback && en.token_count <= p.max_rollback_tokens;
      if (record && rows > 0 && en.token_count > U - rows) break;
      const std::int64_t m = std::min(en.token_count - i, U - rows);
      segs.push_back(PassSegment{s, rows, m, (mtp ? sl.mtp_length : sl.length) + i, record});
      for (std::int64_t t = 0; t < m; ++t) {
        const std::int64_t o = batch.output_row(e, i + t);
        if (o >= 0) outputs.push_back(PassOutput{rows + t, o, batch.wants_logits(e, i + t)});
      }
      rows += m;
      i += m;
      if (i == en.token_count) {
        ++e;
        i = 0;
      }
    }
    PassPlan plan;
    plan.mtp = mtp;
    plan.rows = rows;
    plan.tokens = batch.tokens().subspan(static_cast<std::size_t>(first_token), static_cast<std::size_t>(rows));
    plan.hidden = mtp ? hidden + first_token * H : nullptr;
    plan.segments = segs;
    plan.outputs = outputs;
    plan.page_tables = page_tables;
    guarded([&] { backend->forward(plan, out); });
    first_token += rows;
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
  run_passes(batch, false, nullptr);
  for (const auto& en : batch.entries()) {
    Slot& sl = slots[static_cast<std::size_t>(handle_index(en.seq))];
    const bool logged = p.max_rollback_tokens > 0 && en.rollback && en.token_count <= p.max_rollback_tokens;
    sl.log_start = sl.length;
    sl.log_tokens = logged ? en.token_count : 0;
    sl.length += en.token_count;
  }
  set_output_flags(batch);
}

void Context::Impl::step_mtp(const Batch& batch, std::span<const float> hidden) {
  check_usable("step_mtp");
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
  run_passes(batch, true, hidden.data());
  for (const auto& en : batch.entries()) slots[static_cast<std::size_t>(handle_index(en.seq))].mtp_length += en.token_count;
  set_output_flags(batch);
}

void Context::Impl::rollback(SeqId seq, std::int64_t keep) {
  check_usable("rollback");
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
    guarded([&] { backend->rollback(s, keep); });
    // Attention KV beyond the kept positions is simply overwritten later.
    sl.length = sl.log_start + keep;
    release_pages_from(s, ceil_div(covered_positions(sl), p.kv_page_size));
  }
  // The log now describes a step of `keep` tokens from the same start, so a second rollback to
  // fewer tokens is still exact.
  sl.log_tokens = keep;
}

Context::Context(std::shared_ptr<const Model> model, const ContextParams& params)
    : impl_(std::make_unique<Impl>(std::move(model), params, ContextHooks{})) {}
Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

const Model& Context::model() const noexcept { return *impl_->model; }
const ContextParams& Context::params() const noexcept { return impl_->p; }
bool Context::usable() const noexcept { return impl_->failure.empty(); }

SeqId Context::create_sequence() {
  const int s = impl_->acquire_slot("create_sequence");
  return make_handle(s, impl_->slots[static_cast<std::size_t>(s)].generation);
}

void Context::reset_sequence(SeqId seq) {
  impl_->check_usable("reset_sequence");
  auto& sl = impl_->slot_for(seq, "reset_sequence");
  const int s = handle_index(seq);
  impl_->guarded([&] { impl_->backend->clear_slot(s); });
  impl_->release_pages(s);
  sl.length = sl.mtp_length = sl.log_start = sl.log_tokens = 0;
}

void Context::free_sequence(SeqId seq) {
  auto& sl = impl_->slot_for(seq, "free_sequence");
  const int s = handle_index(seq);
  impl_->release_pages(s);
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

std::int64_t Context::gdn_state_bytes_per_sequence() const noexcept {
  const auto& l = impl_->backend->layout();
  return l.conv_bytes_per_slot() + l.recurrent_bytes_per_slot();
}
std::int64_t Context::snapshot_bytes() const noexcept { return gdn_state_bytes_per_sequence(); }
std::int64_t Context::rollback_bytes_per_sequence() const noexcept { return impl_->backend->rollback_bytes_per_sequence(); }
std::int64_t Context::kv_bytes_per_token() const noexcept { return impl_->backend->kv_bytes_per_token(); }
std::int64_t Context::kv_free_pages() const noexcept { return impl_->pages.free_pages(); }

namespace detail {

std::unique_ptr<Context> make_context_for_tests(std::shared_ptr<const Model> model, const ContextParams& params,
                                                const FaultInjection& faults) {
  ContextHooks hooks;
  hooks.tiled_value_heads = faults.tiled_value_heads;
  hooks.drop_conv_state = faults.drop_conv_state;
  return std::unique_ptr<Context>(new Context(std::make_unique<Context::Impl>(std::move(model), params, hooks)));
}

}  // namespace detail
}  // namespace gdn
