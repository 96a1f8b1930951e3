// The C ABI (gdn.h) over the C++ API. Each entry point checks its handles and struct sizes, runs the
// C++ call inside guard(), which turns every exception into a status plus this thread's last-error
// message, and writes outputs only on success. Nothing here has logic of its own beyond that.

#include "gdn.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "gdn/gdn.hpp"
#include "gdn/diagnostics/doctor.hpp"

#ifndef GDN_VERSION_STRING
#error "GDN_VERSION_STRING must be defined by the build (the CMake project version)"
#endif

// ---------------------------------------------------------------------------------------------
// The enums of gdn.h mirror the C++ ones value for value.
#define GDN_SAME(c, cpp) static_assert(static_cast<int>(c) == static_cast<int>(cpp), #c " must equal " #cpp)
GDN_SAME(GDN_STATUS_OK, gdn::Status::ok);
GDN_SAME(GDN_STATUS_INVALID_ARGUMENT, gdn::Status::invalid_argument);
GDN_SAME(GDN_STATUS_IO_ERROR, gdn::Status::io_error);
GDN_SAME(GDN_STATUS_INVALID_FILE, gdn::Status::invalid_file);
GDN_SAME(GDN_STATUS_UNSUPPORTED_MODEL, gdn::Status::unsupported_model);
GDN_SAME(GDN_STATUS_MISSING_TENSOR, gdn::Status::missing_tensor);
GDN_SAME(GDN_STATUS_TENSOR_MISMATCH, gdn::Status::tensor_mismatch);
GDN_SAME(GDN_STATUS_OUT_OF_CAPACITY, gdn::Status::out_of_capacity);
GDN_SAME(GDN_STATUS_INVALID_SEQUENCE, gdn::Status::invalid_sequence);
GDN_SAME(GDN_STATUS_CONTEXT_OVERFLOW, gdn::Status::context_overflow);
GDN_SAME(GDN_STATUS_INVALID_TOKEN, gdn::Status::invalid_token);
GDN_SAME(GDN_STATUS_BACKEND_UNAVAILABLE, gdn::Status::backend_unavailable);
GDN_SAME(GDN_STATUS_INTERNAL, gdn::Status::internal);
GDN_SAME(GDN_BACKEND_CPU, gdn::Backend::cpu);
GDN_SAME(GDN_BACKEND_CUDA, gdn::Backend::cuda);
GDN_SAME(GDN_LOGITS_NONE, gdn::LogitsFor::none);
GDN_SAME(GDN_LOGITS_LAST, gdn::LogitsFor::last);
GDN_SAME(GDN_LOGITS_ALL, gdn::LogitsFor::all);
#undef GDN_SAME
static_assert(std::is_same_v<gdn_token, gdn::Token>);
static_assert(std::is_same_v<gdn_seq_id, gdn::SeqId>);
static_assert(std::is_same_v<gdn_snapshot_id, gdn::SnapshotId>);
// Enums inside structs must stay 4 bytes (ctypes and other FFIs declare them as c_int).
static_assert(sizeof(gdn_status) == 4 && sizeof(gdn_state_dtype) == 4 && sizeof(gdn_backend) == 4 &&
              sizeof(gdn_logits_mode) == 4);

// ---------------------------------------------------------------------------------------------
// Handles. The magic word turns a NULL, foreign (a context passed as a model, easy from ctypes) or
// already-freed handle into INVALID_ARGUMENT instead of a crash where that is detectable at all.
namespace {
constexpr std::uint32_t model_magic = 0x4744'4d4c;    // "GDML"
constexpr std::uint32_t context_magic = 0x4744'4358;  // "GDCX"
constexpr std::uint32_t batch_magic = 0x4744'4254;    // "GDBT"
constexpr std::uint32_t dead_magic = 0xdead'0000;
}  // namespace

struct gdn_model {
  std::uint32_t magic = model_magic;
  std::shared_ptr<const gdn::Model> model;
};

struct gdn_context {
  std::uint32_t magic = context_magic;
  std::unique_ptr<gdn::Context> ctx;
};

struct gdn_batch {
  std::uint32_t magic = batch_magic;
  gdn::Batch batch;
};

namespace {

thread_local std::string last_error;

gdn_status fail(gdn_status s, const char* fn, const char* message) noexcept {
  try {
    last_error.assign(fn);
    last_error.append(": ");
    last_error.append(message);
  } catch (...) {
    last_error.clear();  // out of memory while reporting; the status still tells
  }
  return s;
}

// Runs f (which may throw anything) and maps the outcome to a status.
template <typename F>
gdn_status guard(const char* fn, F&& f) noexcept {
  try {
    f();
    last_error.clear();
    return GDN_STATUS_OK;
  } catch (const gdn::Error& e) {
    return fail(static_cast<gdn_status>(e.status()), fn, e.what());
  } catch (const std::bad_alloc&) {
    return fail(GDN_STATUS_OUT_OF_CAPACITY, fn, "out of memory");
  } catch (const std::exception& e) {
    return fail(GDN_STATUS_INTERNAL, fn, (std::string("internal error: ") + e.what()).c_str());
  } catch (...) {
    return fail(GDN_STATUS_INTERNAL, fn, "internal error: unknown exception");
  }
}

[[noreturn]] void invalid(const std::string& message) { throw gdn::Error(gdn::Status::invalid_argument, message); }

// The integer a C caller stored in an enum field or argument. Reading it as the enum type is
// undefined behaviour when it is outside the enumerators' range (UBSan -fsanitize=enum flags it),
// and C or ctypes callers can pass any int: compare the integer, never the enum.
template <typename E>
int enum_int(const E& e) noexcept {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<int>(v);
}

template <typename H>
void check_handle(const H* h, std::uint32_t magic, const char* what) {
  if (h == nullptr) invalid(std::string(what) + " is NULL");
  if (h->magic != magic) invalid(std::string(what) + " is not a live " + what + " handle (freed, or another type)");
}
void check(const gdn_model* m) { check_handle(m, model_magic, "model"); }
void check(const gdn_context* c) { check_handle(c, context_magic, "context"); }
void check(const gdn_batch* b) { check_handle(b, batch_magic, "batch"); }

template <typename T>
void check_out(T* p, const char* what) {
  if (p == nullptr) invalid(std::string(what) + " is NULL");
}

// Struct sizes (see "Versioning" in gdn.h). The first version of each struct ends at its last
// field; when a field is appended, these stay as they are.
constexpr std::uint32_t max_struct_size = 4096;  // anything larger is an uninitialised size field
#define GDN_END_OF(type, field) static_cast<std::uint32_t>(offsetof(type, field) + sizeof(type::field))
constexpr std::uint32_t model_params_v1 = GDN_END_OF(gdn_model_params, load_mtp);
constexpr std::uint32_t context_params_v1 = GDN_END_OF(gdn_context_params, backend);
constexpr std::uint32_t model_config_v1 = GDN_END_OF(gdn_model_config, model_type);
constexpr std::uint32_t context_memory_v1 = GDN_END_OF(gdn_context_memory, rollback_bytes_per_sequence);
#undef GDN_END_OF

void check_size(std::uint32_t size, std::uint32_t v1, const char* type) {
  if (size < v1 || size > max_struct_size)
    invalid("wrong-size parameter struct: " + std::string(type) + ".size is " + std::to_string(size) +
            ", expected at least " + std::to_string(v1) + " (set it to sizeof(" + type + "))");
}

// Reads a caller's (possibly older or newer) input struct into `out`, which holds the defaults.
template <typename S>
void read_struct(const S* in, S& out, std::uint32_t v1, const char* type) {
  if (in == nullptr) return;  // NULL: defaults
  check_size(in->size, v1, type);
  const std::size_t n = std::min<std::size_t>(in->size, sizeof(S));
  // Fields past the caller's size keep their defaults; a newer caller's fields beyond ours must be
  // zero ("as before"), or the caller asked for something this library cannot do.
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (std::size_t i = sizeof(S); i < in->size; ++i)
    if (bytes[i] != 0)
      invalid(std::string(type) + " has fields this libgdn " GDN_VERSION_STRING " does not know (size " +
              std::to_string(in->size) + " > " + std::to_string(sizeof(S)) +
              ") set to non-default values; the header is newer than the library");
  std::memcpy(&out, in, n);
  out.size = sizeof(S);
}

// Writes `value` into a caller's output struct of any size >= v1.
template <typename S>
void write_struct(S* out, const S& value, std::uint32_t v1, const char* type) {
  check_out(out, type);
  const std::uint32_t size = out->size;
  check_size(size, v1, type);
  const std::size_t n = std::min<std::size_t>(size, sizeof(S));
  std::memcpy(out, &value, n);
  if (size > sizeof(S)) std::memset(reinterpret_cast<unsigned char*>(out) + sizeof(S), 0, size - sizeof(S));
  out->size = size;
}

gdn_model_params default_model_params() {
  gdn_model_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.load_mtp = gdn::ModelParams{}.load_mtp;
  return p;
}

gdn_context_params default_context_params() {
  const gdn::ContextParams d;
  gdn_context_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.max_sequences = d.max_sequences;
  p.max_context = d.max_context;
  p.kv_page_size = d.kv_page_size;
  p.kv_pages = d.kv_pages;
  p.max_batch_tokens = d.max_batch_tokens;
  p.max_logits_rows = d.max_logits_rows;
  p.state_dtype = GDN_STATE_DTYPE_DEFAULT;
  p.threads = d.threads;
  p.gdn_chunk_min_tokens = d.gdn_chunk_min_tokens;
  p.max_rollback_tokens = d.max_rollback_tokens;
  p.backend = static_cast<gdn_backend>(d.backend);
  return p;
}

// Fills a caller's params struct of any accepted size with the defaults.
template <typename S>
void init_struct(S* p, const S& defaults, std::uint32_t v1, const char* type) {
  check_out(p, type);
  write_struct(p, defaults, v1, type);
}

gdn_state_dtype to_c(gdn::DType t) {
  switch (t) {
    case gdn::DType::f32: return GDN_STATE_DTYPE_F32;
    case gdn::DType::bf16: return GDN_STATE_DTYPE_BF16;
    default: return GDN_STATE_DTYPE_DEFAULT;
  }
}

// Copies rows [first, first + n) of width `width` from row accessor `row` into dst.
template <typename Row>
void copy_rows(const gdn::Context& ctx, std::int64_t first, std::int64_t n, std::int64_t width, float* dst,
               std::int64_t capacity, Row row, const char* what) {
  if (dst == nullptr && n > 0) invalid("dst is NULL");
  if (n < 0 || first < 0 || first + n > ctx.output_rows())
    invalid(std::string(what) + " rows [" + std::to_string(first) + ", " + std::to_string(first + n) +
            ") are outside the last step's " + std::to_string(ctx.output_rows()) + " rows");
  if (capacity < n * width)
    invalid("dst holds " + std::to_string(capacity) + " floats, " + std::to_string(n) + " rows need " +
            std::to_string(n * width));
  for (std::int64_t r = 0; r < n; ++r) {
    const auto src = row(first + r);
    std::memcpy(dst + r * width, src.data(), src.size() * sizeof(float));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
extern "C" {

uint32_t gdn_abi_version(void) { return GDN_ABI_VERSION; }

const char* gdn_version_string(void) { return GDN_VERSION_STRING; }

const char* gdn_status_string(gdn_status status) {
  // status_name returns views of string literals, so .data() is NUL-terminated.
  return gdn::status_name(static_cast<gdn::Status>(enum_int(status))).data();
}

const char* gdn_last_error(void) { return last_error.c_str(); }

// --- model -----------------------------------------------------------------------------------

gdn_status gdn_model_params_init(gdn_model_params* params) {
  return guard("gdn_model_params_init",
               [&] { init_struct(params, default_model_params(), model_params_v1, "gdn_model_params"); });
}

gdn_status gdn_model_load(const char* path, const gdn_model_params* params, gdn_model** out_model) {
  return guard("gdn_model_load", [&] {
    check_out(out_model, "out_model");
    if (path == nullptr) invalid("path is NULL");
    gdn_model_params p = default_model_params();
    read_struct(params, p, model_params_v1, "gdn_model_params");
    gdn::ModelParams mp;
    mp.load_mtp = p.load_mtp;
    auto handle = std::make_unique<gdn_model>();
    handle->model = gdn::Model::load(path, mp);
    *out_model = handle.release();
  });
}

void gdn_model_free(gdn_model* model) {
  if (model == nullptr || model->magic != model_magic) return;
  model->magic = dead_magic;
  delete model;
}

gdn_status gdn_model_get_config(const gdn_model* model, gdn_model_config* out_config) {
  return guard("gdn_model_get_config", [&] {
    check(model);
    const gdn::ModelConfig& c = model->model->config();
    gdn_model_config v;
    std::memset(&v, 0, sizeof v);
    v.size = sizeof v;
    v.vocab_size = c.vocab_size;
    v.hidden_size = c.hidden_size;
    v.intermediate_size = c.intermediate_size;
    v.num_layers = c.num_layers;
    v.num_linear_attention_layers = c.count_layers(gdn::LayerKind::linear_attention);
    v.num_full_attention_layers = c.count_layers(gdn::LayerKind::full_attention);
    v.num_attention_heads = c.num_attention_heads;
    v.num_key_value_heads = c.num_key_value_heads;
    v.head_dim = c.head_dim;
    v.rotary_dim = c.rotary_dim;
    v.linear_num_key_heads = c.linear_num_key_heads;
    v.linear_num_value_heads = c.linear_num_value_heads;
    v.linear_key_head_dim = c.linear_key_head_dim;
    v.linear_value_head_dim = c.linear_value_head_dim;
    v.linear_conv_kernel_dim = c.linear_conv_kernel_dim;
    v.mtp_num_hidden_layers = c.mtp_num_hidden_layers;
    v.max_position_embeddings = c.max_position_embeddings;
    v.tie_word_embeddings = c.tie_word_embeddings;
    v.has_mtp = model->model->has_mtp();
    v.rms_norm_eps = c.rms_norm_eps;
    v.rope_theta = c.rope_theta;
    v.state_dtype = to_c(c.ssm_state_dtype);
    v.n_eos_token_ids = static_cast<int32_t>(c.eos_token_ids.size());
    v.eos_token_ids = c.eos_token_ids.empty() ? nullptr : c.eos_token_ids.data();
    v.architecture = c.architecture.c_str();
    v.model_type = c.model_type.c_str();
    write_struct(out_config, v, model_config_v1, "gdn_model_config");
  });
}

// --- context ---------------------------------------------------------------------------------

gdn_status gdn_context_params_init(gdn_context_params* params) {
  return guard("gdn_context_params_init",
               [&] { init_struct(params, default_context_params(), context_params_v1, "gdn_context_params"); });
}

gdn_status gdn_context_create(gdn_model* model, const gdn_context_params* params, gdn_context** out_ctx) {
  return guard("gdn_context_create", [&] {
    check_out(out_ctx, "out_ctx");
    check(model);
    gdn_context_params p = default_context_params();
    read_struct(params, p, context_params_v1, "gdn_context_params");
    gdn::ContextParams cp;
    cp.max_sequences = p.max_sequences;
    cp.max_context = p.max_context;
    cp.kv_page_size = p.kv_page_size;
    cp.kv_pages = p.kv_pages;
    cp.max_batch_tokens = p.max_batch_tokens;
    cp.max_logits_rows = p.max_logits_rows;
    switch (enum_int(p.state_dtype)) {
      case GDN_STATE_DTYPE_DEFAULT: break;
      case GDN_STATE_DTYPE_F32: cp.state_dtype = gdn::DType::f32; break;
      case GDN_STATE_DTYPE_BF16: cp.state_dtype = gdn::DType::bf16; break;
      default: invalid("state_dtype " + std::to_string(enum_int(p.state_dtype)) + " is not a gdn_state_dtype");
    }
    cp.threads = p.threads;
    cp.gdn_chunk_min_tokens = p.gdn_chunk_min_tokens;
    cp.max_rollback_tokens = p.max_rollback_tokens;
    switch (enum_int(p.backend)) {
      case GDN_BACKEND_CPU: cp.backend = gdn::Backend::cpu; break;
      case GDN_BACKEND_CUDA: cp.backend = gdn::Backend::cuda; break;
      default: invalid("backend " + std::to_string(enum_int(p.backend)) + " is not a gdn_backend");
    }
    auto handle = std::make_unique<gdn_context>();
    handle->ctx = std::make_unique<gdn::Context>(model->model, cp);
    *out_ctx = handle.release();
  });
}

void gdn_context_free(gdn_context* ctx) {
  if (ctx == nullptr || ctx->magic != context_magic) return;
  ctx->magic = dead_magic;
  delete ctx;
}

gdn_status gdn_context_get_memory(const gdn_context* ctx, gdn_context_memory* out_memory) {
  return guard("gdn_context_get_memory", [&] {
    check(ctx);
    gdn_context_memory m;
    std::memset(&m, 0, sizeof m);
    m.size = sizeof m;
    m.live_sequences = ctx->ctx->live_sequences();
    m.gdn_state_bytes_per_sequence = ctx->ctx->gdn_state_bytes_per_sequence();
    m.kv_bytes_per_token = ctx->ctx->kv_bytes_per_token();
    m.kv_free_pages = ctx->ctx->kv_free_pages();
    m.snapshot_bytes = ctx->ctx->snapshot_bytes();
    m.rollback_bytes_per_sequence = ctx->ctx->rollback_bytes_per_sequence();
    write_struct(out_memory, m, context_memory_v1, "gdn_context_memory");
  });
}

// --- sequences -------------------------------------------------------------------------------

gdn_status gdn_seq_create(gdn_context* ctx, gdn_seq_id* out_seq) {
  return guard("gdn_seq_create", [&] {
    check(ctx);
    check_out(out_seq, "out_seq");
    *out_seq = ctx->ctx->create_sequence();
  });
}

gdn_status gdn_seq_reset(gdn_context* ctx, gdn_seq_id seq) {
  return guard("gdn_seq_reset", [&] {
    check(ctx);
    ctx->ctx->reset_sequence(seq);
  });
}

gdn_status gdn_seq_free(gdn_context* ctx, gdn_seq_id seq) {
  return guard("gdn_seq_free", [&] {
    check(ctx);
    ctx->ctx->free_sequence(seq);
  });
}

gdn_status gdn_seq_length(const gdn_context* ctx, gdn_seq_id seq, int64_t* out_length) {
  return guard("gdn_seq_length", [&] {
    check(ctx);
    check_out(out_length, "out_length");
    *out_length = ctx->ctx->sequence_length(seq);
  });
}

gdn_status gdn_seq_mtp_length(const gdn_context* ctx, gdn_seq_id seq, int64_t* out_length) {
  return guard("gdn_seq_mtp_length", [&] {
    check(ctx);
    check_out(out_length, "out_length");
    *out_length = ctx->ctx->mtp_length(seq);
  });
}

bool gdn_seq_is_valid(const gdn_context* ctx, gdn_seq_id seq) {
  if (ctx == nullptr || ctx->magic != context_magic) return false;
  return ctx->ctx->is_valid(seq);
}

// --- state control ---------------------------------------------------------------------------

gdn_status gdn_seq_snapshot(gdn_context* ctx, gdn_seq_id seq, gdn_snapshot_id* out_snapshot) {
  return guard("gdn_seq_snapshot", [&] {
    check(ctx);
    check_out(out_snapshot, "out_snapshot");
    *out_snapshot = ctx->ctx->snapshot(seq);
  });
}

gdn_status gdn_snapshot_free(gdn_context* ctx, gdn_snapshot_id snapshot) {
  return guard("gdn_snapshot_free", [&] {
    check(ctx);
    ctx->ctx->free_snapshot(snapshot);
  });
}

gdn_status gdn_seq_restore(gdn_context* ctx, gdn_seq_id seq, gdn_snapshot_id snapshot) {
  return guard("gdn_seq_restore", [&] {
    check(ctx);
    ctx->ctx->restore(seq, snapshot);
  });
}

gdn_status gdn_seq_create_from(gdn_context* ctx, gdn_snapshot_id snapshot, gdn_seq_id* out_seq) {
  return guard("gdn_seq_create_from", [&] {
    check(ctx);
    check_out(out_seq, "out_seq");
    *out_seq = ctx->ctx->create_sequence_from(snapshot);
  });
}

gdn_status gdn_seq_fork(gdn_context* ctx, gdn_seq_id seq, gdn_seq_id* out_seq) {
  return guard("gdn_seq_fork", [&] {
    check(ctx);
    check_out(out_seq, "out_seq");
    *out_seq = ctx->ctx->fork_sequence(seq);
  });
}

gdn_status gdn_seq_rollback(gdn_context* ctx, gdn_seq_id seq, int64_t keep) {
  return guard("gdn_seq_rollback", [&] {
    check(ctx);
    ctx->ctx->rollback(seq, keep);
  });
}

gdn_status gdn_seq_rollbackable_tokens(const gdn_context* ctx, gdn_seq_id seq, int64_t* out_tokens) {
  return guard("gdn_seq_rollbackable_tokens", [&] {
    check(ctx);
    check_out(out_tokens, "out_tokens");
    *out_tokens = ctx->ctx->rollbackable_tokens(seq);
  });
}

gdn_status gdn_seq_truncate_mtp(gdn_context* ctx, gdn_seq_id seq, int64_t mtp_length) {
  return guard("gdn_seq_truncate_mtp", [&] {
    check(ctx);
    ctx->ctx->truncate_mtp(seq, mtp_length);
  });
}

gdn_status gdn_seq_save(const gdn_context* ctx, gdn_seq_id seq, const char* path) {
  return guard("gdn_seq_save", [&] {
    check(ctx);
    if (path == nullptr) invalid("path is NULL");
    ctx->ctx->save_sequence(seq, path);
  });
}

gdn_status gdn_seq_load(gdn_context* ctx, const char* path, gdn_seq_id* out_seq) {
  return guard("gdn_seq_load", [&] {
    check(ctx);
    check_out(out_seq, "out_seq");
    if (path == nullptr) invalid("path is NULL");
    *out_seq = ctx->ctx->load_sequence(path);
  });
}

// --- batch -----------------------------------------------------------------------------------

gdn_status gdn_batch_init(int32_t reserve_entries, int64_t reserve_tokens, gdn_batch** out_batch) {
  return guard("gdn_batch_init", [&] {
    check_out(out_batch, "out_batch");
    if (reserve_entries < 0 || reserve_tokens < 0)
      invalid("reserve sizes must not be negative (got " + std::to_string(reserve_entries) + ", " +
              std::to_string(reserve_tokens) + ")");
    auto handle = std::make_unique<gdn_batch>();
    handle->batch.reserve(static_cast<std::size_t>(reserve_entries), static_cast<std::size_t>(reserve_tokens));
    *out_batch = handle.release();
  });
}

void gdn_batch_free(gdn_batch* batch) {
  if (batch == nullptr || batch->magic != batch_magic) return;
  batch->magic = dead_magic;
  delete batch;
}

gdn_status gdn_batch_clear(gdn_batch* batch) {
  return guard("gdn_batch_clear", [&] {
    check(batch);
    batch->batch.clear();
  });
}

gdn_status gdn_batch_add(gdn_batch* batch, gdn_seq_id seq, const gdn_token* tokens, int64_t n_tokens,
                         gdn_logits_mode logits, uint32_t flags, int64_t* out_first_row) {
  return guard("gdn_batch_add", [&] {
    check(batch);
    if (n_tokens < 0) invalid("n_tokens is " + std::to_string(n_tokens));
    if (tokens == nullptr && n_tokens > 0) invalid("tokens is NULL");
    const int mode = enum_int(logits);
    if (mode != GDN_LOGITS_NONE && mode != GDN_LOGITS_LAST && mode != GDN_LOGITS_ALL)
      invalid("logits mode " + std::to_string(mode) + " is not a gdn_logits_mode");
    if ((flags & ~static_cast<uint32_t>(GDN_BATCH_HIDDEN_ALL)) != 0)
      invalid("flags " + std::to_string(flags) + " has bits this libgdn " GDN_VERSION_STRING " does not know");
    const std::size_t e = batch->batch.add(seq, std::span<const gdn::Token>(tokens, static_cast<std::size_t>(n_tokens)),
                                           static_cast<gdn::LogitsFor>(logits), (flags & GDN_BATCH_HIDDEN_ALL) != 0);
    if (out_first_row != nullptr) {
      const bool has_rows = n_tokens > 0 && batch->batch.output_row(e, n_tokens - 1) >= 0;
      *out_first_row = has_rows ? batch->batch.entries()[e].output_begin : -1;
    }
  });
}

gdn_status gdn_batch_size(const gdn_batch* batch, int64_t* out_tokens, int64_t* out_output_rows) {
  return guard("gdn_batch_size", [&] {
    check(batch);
    if (out_tokens != nullptr) *out_tokens = batch->batch.token_count();
    if (out_output_rows != nullptr) *out_output_rows = batch->batch.output_rows();
  });
}

// --- step ------------------------------------------------------------------------------------

gdn_status gdn_context_step(gdn_context* ctx, const gdn_batch* batch) {
  return guard("gdn_context_step", [&] {
    check(ctx);
    check(batch);
    ctx->ctx->step(batch->batch);
  });
}

gdn_status gdn_context_step_mtp(gdn_context* ctx, const gdn_batch* batch, const float* hidden, int64_t n_hidden_rows) {
  return guard("gdn_context_step_mtp", [&] {
    check(ctx);
    check(batch);
    if (n_hidden_rows < 0) invalid("n_hidden_rows is " + std::to_string(n_hidden_rows));
    if (hidden == nullptr && n_hidden_rows > 0) invalid("hidden is NULL");
    const auto H = static_cast<std::size_t>(ctx->ctx->model().config().hidden_size);
    ctx->ctx->step_mtp(batch->batch, std::span<const float>(hidden, static_cast<std::size_t>(n_hidden_rows) * H));
  });
}

// --- outputs ---------------------------------------------------------------------------------

gdn_status gdn_context_n_outputs(const gdn_context* ctx, int64_t* out_rows) {
  return guard("gdn_context_n_outputs", [&] {
    check(ctx);
    check_out(out_rows, "out_rows");
    *out_rows = ctx->ctx->output_rows();
  });
}

gdn_status gdn_context_get_logits(const gdn_context* ctx, int64_t row, const float** out_logits) {
  return guard("gdn_context_get_logits", [&] {
    check(ctx);
    check_out(out_logits, "out_logits");
    *out_logits = ctx->ctx->logits(row).data();
  });
}

gdn_status gdn_context_copy_logits(const gdn_context* ctx, int64_t first_row, int64_t n_rows, float* dst,
                                   int64_t dst_capacity) {
  return guard("gdn_context_copy_logits", [&] {
    check(ctx);
    const gdn::Context& c = *ctx->ctx;
    copy_rows(c, first_row, n_rows, c.model().config().vocab_size, dst, dst_capacity,
              [&](std::int64_t r) { return c.logits(r); }, "logits");
  });
}

gdn_status gdn_context_get_hidden(const gdn_context* ctx, int64_t row, const float** out_hidden) {
  return guard("gdn_context_get_hidden", [&] {
    check(ctx);
    check_out(out_hidden, "out_hidden");
    *out_hidden = ctx->ctx->hidden(row).data();
  });
}

gdn_status gdn_context_copy_hidden(const gdn_context* ctx, int64_t first_row, int64_t n_rows, float* dst,
                                   int64_t dst_capacity) {
  return guard("gdn_context_copy_hidden", [&] {
    check(ctx);
    const gdn::Context& c = *ctx->ctx;
    copy_rows(c, first_row, n_rows, c.model().config().hidden_size, dst, dst_capacity,
              [&](std::int64_t r) { return c.hidden(r); }, "hidden");
  });
}

// --- doctor ----------------------------------------------------------------------------------

namespace {
constexpr std::uint32_t doctor_params_v1 = static_cast<std::uint32_t>(offsetof(gdn_doctor_params, faults) + sizeof(std::uint32_t));
constexpr std::uint32_t doctor_known_faults = GDN_DOCTOR_FAULT_DROP_CONV_STATE | GDN_DOCTOR_FAULT_TILED_VALUE_HEADS;

gdn_doctor_params default_doctor_params() {
  const gdn::DoctorOptions d;
  gdn_doctor_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.quick = d.quick;
  p.threads = d.threads;
  p.state_dtype = GDN_STATE_DTYPE_DEFAULT;
  p.faults = 0;
  return p;
}
}  // namespace

gdn_status gdn_doctor_params_init(gdn_doctor_params* params) {
  return guard("gdn_doctor_params_init",
               [&] { init_struct(params, default_doctor_params(), doctor_params_v1, "gdn_doctor_params"); });
}

gdn_status gdn_doctor_run(const char* model_dir, const gdn_doctor_params* params, const char** out_json,
                          int32_t* out_n_fail) {
  // The last report of this thread, handed out as a pointer (like last_error).
  thread_local std::string last_report;
  return guard("gdn_doctor_run", [&] {
    if (model_dir == nullptr) invalid("model_dir is NULL");
    gdn_doctor_params p = default_doctor_params();
    read_struct(params, p, doctor_params_v1, "gdn_doctor_params");
    if ((p.faults & ~doctor_known_faults) != 0) invalid("unknown fault bits " + std::to_string(p.faults & ~doctor_known_faults));
    gdn::DoctorOptions o;
    o.quick = p.quick;
    o.threads = p.threads;
    if (p.state_dtype == GDN_STATE_DTYPE_F32) o.state_dtype = gdn::DType::f32;
    else if (p.state_dtype == GDN_STATE_DTYPE_BF16) o.state_dtype = gdn::DType::bf16;
    else if (p.state_dtype != GDN_STATE_DTYPE_DEFAULT) invalid("state_dtype " + std::to_string(p.state_dtype) + " is unknown");
    o.faults.drop_conv_state = (p.faults & GDN_DOCTOR_FAULT_DROP_CONV_STATE) != 0;
    o.faults.tiled_value_heads = (p.faults & GDN_DOCTOR_FAULT_TILED_VALUE_HEADS) != 0;
    const gdn::DoctorReport report = gdn::run_doctor(model_dir, o);
    std::string json = report.to_json();
    last_report.swap(json);
    if (out_json) *out_json = last_report.c_str();
    if (out_n_fail) *out_n_fail = static_cast<int32_t>(report.count(gdn::Verdict::fail));
  });
}

}  // extern "C"
