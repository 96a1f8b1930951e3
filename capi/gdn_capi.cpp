// The C ABI (gdn.h) over the C++ API. Each entry point checks its handles and struct sizes, runs the
// C++ call inside guard(), which turns every exception into a status plus this thread's last-error
// message, and writes outputs only on success. Nothing here has logic of its own beyond that, and
// beyond what the C contract adds to the C++ one: handles that keep what they use alive, and calls
// that change nothing when they fail (a refused speculative start puts its sampler back).

#include "gdn.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gdn/gdn.hpp"
#include "gdn/diagnostics/doctor.hpp"
#include "gdn/model/memory_plan.hpp"
#include "gdn/model/packed_image.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/generator.hpp"
#include "gdn/runtime/sampling.hpp"
#include "gdn/runtime/speculative.hpp"
#include "gdn/text/chat_template.hpp"
#include "use_flag.hpp"

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
GDN_SAME(GDN_STATUS_BUSY, gdn::Status::busy);
GDN_SAME(GDN_BACKEND_CPU, gdn::Backend::cpu);
GDN_SAME(GDN_BACKEND_CUDA, gdn::Backend::cuda);
GDN_SAME(GDN_MATMUL_INPUT_FLOAT32, gdn::MatmulInput::float32);
GDN_SAME(GDN_MATMUL_INPUT_BF16, gdn::MatmulInput::bf16);
GDN_SAME(GDN_LOGITS_NONE, gdn::LogitsFor::none);
GDN_SAME(GDN_LOGITS_LAST, gdn::LogitsFor::last);
GDN_SAME(GDN_LOGITS_ALL, gdn::LogitsFor::all);
GDN_SAME(GDN_FINISH_NONE, gdn::FinishReason::none);
GDN_SAME(GDN_FINISH_STOP_TOKEN, gdn::FinishReason::stop_token);
GDN_SAME(GDN_FINISH_STOP_STRING, gdn::FinishReason::stop_string);
GDN_SAME(GDN_FINISH_LENGTH, gdn::FinishReason::length);
GDN_SAME(GDN_FINISH_CANCELLED, gdn::FinishReason::cancelled);
#undef GDN_SAME
static_assert(std::is_same_v<gdn_token, gdn::Token>);
static_assert(std::is_same_v<gdn_seq_id, gdn::SeqId>);
static_assert(std::is_same_v<gdn_snapshot_id, gdn::SnapshotId>);
// Enums inside structs must stay 4 bytes (ctypes and other FFIs declare them as c_int).
static_assert(sizeof(gdn_status) == 4 && sizeof(gdn_state_dtype) == 4 && sizeof(gdn_backend) == 4 && sizeof(gdn_matmul_input) == 4 && sizeof(gdn_kv_dtype) == 4 &&
              sizeof(gdn_logits_mode) == 4 && sizeof(gdn_finish_reason) == 4);

// ---------------------------------------------------------------------------------------------
// Handles. The magic word turns a NULL, foreign (a context passed as a model, easy from ctypes) or
// already-freed handle into INVALID_ARGUMENT instead of a crash where that is detectable at all.
namespace {
constexpr std::uint32_t model_magic = 0x4744'4d4c;    // "GDML"
constexpr std::uint32_t context_magic = 0x4744'4358;  // "GDCX"
constexpr std::uint32_t batch_magic = 0x4744'4254;    // "GDBT"
constexpr std::uint32_t tokenizer_magic = 0x4744'544b;      // "GDTK"
constexpr std::uint32_t stream_decoder_magic = 0x4744'5344;  // "GDSD"
constexpr std::uint32_t sampler_magic = 0x4744'534d;         // "GDSM"
constexpr std::uint32_t generation_magic = 0x4744'4752;      // "GDGR"
constexpr std::uint32_t speculative_magic = 0x4744'5350;     // "GDSP"
constexpr std::uint32_t dead_magic = 0xdead'0000;
}  // namespace

struct gdn_model {
  std::uint32_t magic = model_magic;
  std::shared_ptr<const gdn::Model> model;
};

// The "in use" flags (use_flag.hpp) live with what they guard: a context's is shared, like the
// context, with the speculative decoders that drive it, so a decoder and a direct call exclude each
// other even after gdn_context_free.
struct gdn_context {
  std::uint32_t magic = context_magic;
  std::shared_ptr<gdn::Context> ctx;  // shared: a gdn_speculative keeps it alive
  std::shared_ptr<gdn::capi::UseFlag> use = std::make_shared<gdn::capi::UseFlag>();
};

struct gdn_batch {
  std::uint32_t magic = batch_magic;
  gdn::Batch batch;
  mutable gdn::capi::UseFlag use;  // claimed shared by the steps that read the batch
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

// The claims a call makes on the handles it uses (use_flag.hpp); each names the handle and its rule
// in the BUSY message. Every call on a context claims it exclusively, the read-only ones included:
// gdn::Context promises nothing to concurrent readers, and a step may move the outputs they read.
using gdn::capi::Claim;
constexpr char context_rule[] = "a gdn_context is used by one thread at a time (its gdn_generate and gdn_speculative calls included)";
constexpr char batch_rule[] = "a gdn_batch is changed by one thread at a time, and not while a step reads it";

Claim claim(const gdn_context* c) { return Claim(*c->use, Claim::Mode::exclusive, "the context", context_rule); }
Claim claim(gdn_batch* b) { return Claim(b->use, Claim::Mode::exclusive, "the batch", batch_rule); }
// Steps on several contexts may read one batch at once.
Claim claim_shared(const gdn_batch* b) { return Claim(b->use, Claim::Mode::shared, "the batch", batch_rule); }

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
void check(const gdn_tokenizer* t);
void check(const gdn_stream_decoder* d);
void check(const gdn_sampler* s);
void check(const gdn_generation_result* r);
void check(const gdn_speculative* s);

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
constexpr std::uint32_t memory_plan_v1 = GDN_END_OF(gdn_memory_plan, context_fits);
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

gdn::Backend to_backend(const gdn_backend& b) {  // by reference: a bad value must not be loaded as the enum (UB)
  switch (enum_int(b)) {
    case GDN_BACKEND_CPU: return gdn::Backend::cpu;
    case GDN_BACKEND_CUDA: return gdn::Backend::cuda;
    default: invalid("backend " + std::to_string(enum_int(b)) + " is not a gdn_backend");
  }
}

gdn_model_params default_model_params() {
  gdn_model_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.load_mtp = gdn::ModelParams{}.load_mtp;
  p.backend = GDN_BACKEND_CPU;
  p.device = 0;
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
  p.matmul_input = static_cast<gdn_matmul_input>(d.matmul_input);
  p.device = d.device;
  p.cuda_graphs = d.cuda_graphs;
  p.kv_dtype = GDN_KV_DTYPE_DEFAULT;
  return p;
}

// Fills a caller's params struct of any accepted size with the defaults.
template <typename S>
void init_struct(S* p, const S& defaults, std::uint32_t v1, const char* type) {
  check_out(p, type);
  write_struct(p, defaults, v1, type);
}

// gdn_state_dtype and gdn_kv_dtype share their values: DEFAULT (0) leaves the choice to the library.
std::optional<gdn::DType> to_dtype(int value, const char* field, const char* type) {
  switch (value) {
    case 0: return std::nullopt;
    case 1: return gdn::DType::f32;
    case 2: return gdn::DType::bf16;
    default: invalid(std::string(field) + " " + std::to_string(value) + " is not a " + type);
  }
}

gdn::ContextParams to_cpp(const gdn_context_params& p) {
  gdn::ContextParams cp;
  cp.max_sequences = p.max_sequences;
  cp.max_context = p.max_context;
  cp.kv_page_size = p.kv_page_size;
  cp.kv_pages = p.kv_pages;
  cp.max_batch_tokens = p.max_batch_tokens;
  cp.max_logits_rows = p.max_logits_rows;
  cp.state_dtype = to_dtype(enum_int(p.state_dtype), "state_dtype", "gdn_state_dtype");
  cp.threads = p.threads;
  cp.gdn_chunk_min_tokens = p.gdn_chunk_min_tokens;
  cp.max_rollback_tokens = p.max_rollback_tokens;
  cp.backend = to_backend(p.backend);
  cp.device = p.device;
  cp.cuda_graphs = p.cuda_graphs;
  cp.kv_dtype = to_dtype(enum_int(p.kv_dtype), "kv_dtype", "gdn_kv_dtype");
  switch (enum_int(p.matmul_input)) {
    case GDN_MATMUL_INPUT_FLOAT32: cp.matmul_input = gdn::MatmulInput::float32; break;
    case GDN_MATMUL_INPUT_BF16: cp.matmul_input = gdn::MatmulInput::bf16; break;
    default: invalid("matmul_input " + std::to_string(enum_int(p.matmul_input)) + " is not a gdn_matmul_input");
  }
  return cp;
}

gdn::WeightQuant to_quant(const gdn_weight_quant& q) {
  switch (enum_int(q)) {
    case GDN_QUANT_NONE: return gdn::WeightQuant::none;
    case GDN_QUANT_Q8_0: return gdn::WeightQuant::q8_0;
    case GDN_QUANT_Q4_0: return gdn::WeightQuant::q4_0;
    case GDN_QUANT_Q4_K: return gdn::WeightQuant::q4_k;
    case GDN_QUANT_Q4_K_M: return gdn::WeightQuant::q4_k_m;
    default: invalid("quant " + std::to_string(enum_int(q)) + " is not a gdn_weight_quant");
  }
  return gdn::WeightQuant::none;
}

gdn::LmHeadQuant to_lm_head_quant(const gdn_lm_head_quant& q) {
  switch (enum_int(q)) {
    case GDN_LM_HEAD_QUANT_AUTO: return gdn::LmHeadQuant::automatic;
    case GDN_LM_HEAD_QUANT_Q8_0: return gdn::LmHeadQuant::q8_0;
    case GDN_LM_HEAD_QUANT_Q4_0: return gdn::LmHeadQuant::q4_0;
    case GDN_LM_HEAD_QUANT_Q4_K: return gdn::LmHeadQuant::q4_k;
    default: invalid("lm_head_quant " + std::to_string(enum_int(q)) + " is not a gdn_lm_head_quant");
  }
  return gdn::LmHeadQuant::automatic;
}

gdn::ModelParams to_cpp(const gdn_model_params& p) {
  gdn::ModelParams mp;
  mp.load_mtp = p.load_mtp;
  switch (enum_int(p.weights)) {
    case GDN_WEIGHTS_AUTOMATIC: break;
    case GDN_WEIGHTS_PACKED: mp.weights = gdn::WeightPlacement::packed; break;
    case GDN_WEIGHTS_IN_PLACE: mp.weights = gdn::WeightPlacement::in_place; break;
    case GDN_WEIGHTS_IMAGE: mp.weights = gdn::WeightPlacement::image; break;
    default: invalid("weights " + std::to_string(enum_int(p.weights)) + " is not a gdn_weight_placement");
  }
  if (p.weights_in_place != 0) mp.weights = gdn::WeightPlacement::in_place;
  if (p.packed_image != nullptr) mp.packed_image = p.packed_image;
  mp.quant = to_quant(p.quant);
  mp.lm_head_quant = to_lm_head_quant(p.lm_head_quant);
  (void)gdn::lm_head_weight_quant(mp.quant, mp.lm_head_quant);  // an lm_head format without a quant
  mp.backend = to_backend(p.backend);  // CUDA uploads its own copy; weights / packed_image are the CPU backend's
  if (p.device < 0) invalid("device " + std::to_string(p.device) + " is negative");
  mp.device = p.device;
  return mp;
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
    const gdn::ModelParams mp = to_cpp(p);
    auto handle = std::make_unique<gdn_model>();
    handle->model = gdn::Model::load(path, mp);
    *out_model = handle.release();
  });
}

gdn_status gdn_model_get_weight_placement(const gdn_model* model, gdn_weight_placement* out_placement) {
  return guard("gdn_model_get_weight_placement", [&] {
    check(model);
    check_out(out_placement, "out_placement");
    *out_placement = static_cast<gdn_weight_placement>(static_cast<int>(model->model->weight_placement()));
  });
}

gdn_status gdn_memory_plan_compute(const char* path, const gdn_model_params* model_params,
                                   const gdn_context_params* context_params, gdn_memory_plan* out_plan) {
  return guard("gdn_memory_plan_compute", [&] {
    if (path == nullptr) invalid("path is NULL");
    check_out(out_plan, "out_plan");
    gdn_model_params mp = default_model_params();
    read_struct(model_params, mp, model_params_v1, "gdn_model_params");
    gdn_context_params cp = default_context_params();
    read_struct(context_params, cp, context_params_v1, "gdn_context_params");
    const gdn::MemoryPlan plan = gdn::plan_memory(path, to_cpp(cp), to_cpp(mp));
    gdn_memory_plan v;
    std::memset(&v, 0, sizeof v);
    v.size = sizeof v;
    v.weights = static_cast<gdn_weight_placement>(static_cast<int>(plan.weights));
    v.weight_bytes = plan.weight_bytes;
    v.packed_bytes = plan.packed_bytes;
    v.weights_anonymous_bytes = plan.weights_anonymous_bytes;
    v.weights_mapped_bytes = plan.weights_mapped_bytes;
    v.device_weight_bytes = plan.device_weight_bytes;
    v.gdn_recurrent_bytes_per_sequence = plan.gdn_recurrent_bytes_per_sequence;
    v.gdn_conv_bytes_per_sequence = plan.gdn_conv_bytes_per_sequence;
    v.kv_bytes_per_token = plan.kv_bytes_per_token;
    v.kv_pages = plan.kv_pages;
    v.kv_bytes = plan.kv_bytes;
    v.rollback_bytes_per_sequence = plan.rollback_bytes_per_sequence;
    v.scratch_bytes = plan.scratch_bytes;
    v.output_bytes = plan.output_bytes;
    v.context_bytes = plan.context_bytes;
    v.host_bytes = plan.host_bytes;
    v.device_bytes = plan.device_bytes;
    v.available_bytes = plan.memory.available;
    v.fits = plan.fits;
    v.context_fits = plan.context_fits;
    write_struct(out_plan, v, memory_plan_v1, "gdn_memory_plan");
  });
}

gdn_status gdn_packed_image_write(const char* model_path, const char* out_path) {
  return guard("gdn_packed_image_write", [&] {
    if (model_path == nullptr) invalid("model_path is NULL");
    gdn::PackImageOptions o;
    if (out_path != nullptr) o.out = out_path;
    gdn::write_packed_image(model_path, o);
  });
}

gdn_status gdn_packed_image_write_quant(const char* model_path, const char* out_path, gdn_weight_quant quant) {
  return guard("gdn_packed_image_write_quant", [&] {
    if (model_path == nullptr) invalid("model_path is NULL");
    gdn::PackImageOptions o;
    if (out_path != nullptr) o.out = out_path;
    o.quant = to_quant(quant);
    gdn::write_packed_image(model_path, o);
  });
}

gdn_status gdn_packed_image_write_params(const char* model_path, const char* out_path, const gdn_model_params* params) {
  return guard("gdn_packed_image_write_params", [&] {
    if (model_path == nullptr) invalid("model_path is NULL");
    gdn_model_params p = default_model_params();
    read_struct(params, p, model_params_v1, "gdn_model_params");
    const gdn::ModelParams mp = to_cpp(p);
    gdn::PackImageOptions o;
    if (out_path != nullptr) o.out = out_path;
    o.quant = mp.quant;
    o.lm_head_quant = mp.lm_head_quant;
    gdn::write_packed_image(model_path, o);
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
    const gdn::ContextParams cp = to_cpp(p);
    auto handle = std::make_unique<gdn_context>();
    handle->ctx = std::make_shared<gdn::Context>(model->model, cp);
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
    const Claim use = claim(ctx);
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
    const Claim use = claim(ctx);
    check_out(out_seq, "out_seq");
    *out_seq = ctx->ctx->create_sequence();
  });
}

gdn_status gdn_seq_reset(gdn_context* ctx, gdn_seq_id seq) {
  return guard("gdn_seq_reset", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    ctx->ctx->reset_sequence(seq);
  });
}

gdn_status gdn_seq_free(gdn_context* ctx, gdn_seq_id seq) {
  return guard("gdn_seq_free", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    ctx->ctx->free_sequence(seq);
  });
}

gdn_status gdn_seq_length(const gdn_context* ctx, gdn_seq_id seq, int64_t* out_length) {
  return guard("gdn_seq_length", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_length, "out_length");
    *out_length = ctx->ctx->sequence_length(seq);
  });
}

gdn_status gdn_seq_mtp_length(const gdn_context* ctx, gdn_seq_id seq, int64_t* out_length) {
  return guard("gdn_seq_mtp_length", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_length, "out_length");
    *out_length = ctx->ctx->mtp_length(seq);
  });
}

bool gdn_seq_is_valid(const gdn_context* ctx, gdn_seq_id seq) {
  if (ctx == nullptr || ctx->magic != context_magic) return false;
  // No status to return: a context in use reads as false, with the reason in gdn_last_error().
  try {
    const Claim use = claim(ctx);
    return ctx->ctx->is_valid(seq);
  } catch (const gdn::Error& e) {
    fail(static_cast<gdn_status>(e.status()), "gdn_seq_is_valid", e.what());
    return false;
  } catch (...) {
    return false;  // out of memory while reporting
  }
}

// --- state control ---------------------------------------------------------------------------

gdn_status gdn_seq_snapshot(gdn_context* ctx, gdn_seq_id seq, gdn_snapshot_id* out_snapshot) {
  return guard("gdn_seq_snapshot", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_snapshot, "out_snapshot");
    *out_snapshot = ctx->ctx->snapshot(seq);
  });
}

gdn_status gdn_snapshot_free(gdn_context* ctx, gdn_snapshot_id snapshot) {
  return guard("gdn_snapshot_free", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    ctx->ctx->free_snapshot(snapshot);
  });
}

gdn_status gdn_seq_restore(gdn_context* ctx, gdn_seq_id seq, gdn_snapshot_id snapshot) {
  return guard("gdn_seq_restore", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    ctx->ctx->restore(seq, snapshot);
  });
}

gdn_status gdn_seq_create_from(gdn_context* ctx, gdn_snapshot_id snapshot, gdn_seq_id* out_seq) {
  return guard("gdn_seq_create_from", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_seq, "out_seq");
    *out_seq = ctx->ctx->create_sequence_from(snapshot);
  });
}

gdn_status gdn_seq_fork(gdn_context* ctx, gdn_seq_id seq, gdn_seq_id* out_seq) {
  return guard("gdn_seq_fork", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_seq, "out_seq");
    *out_seq = ctx->ctx->fork_sequence(seq);
  });
}

gdn_status gdn_seq_rollback(gdn_context* ctx, gdn_seq_id seq, int64_t keep) {
  return guard("gdn_seq_rollback", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    ctx->ctx->rollback(seq, keep);
  });
}

gdn_status gdn_seq_rollbackable_tokens(const gdn_context* ctx, gdn_seq_id seq, int64_t* out_tokens) {
  return guard("gdn_seq_rollbackable_tokens", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_tokens, "out_tokens");
    *out_tokens = ctx->ctx->rollbackable_tokens(seq);
  });
}

gdn_status gdn_seq_truncate_mtp(gdn_context* ctx, gdn_seq_id seq, int64_t mtp_length) {
  return guard("gdn_seq_truncate_mtp", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    ctx->ctx->truncate_mtp(seq, mtp_length);
  });
}

gdn_status gdn_seq_save(const gdn_context* ctx, gdn_seq_id seq, const char* path) {
  return guard("gdn_seq_save", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    if (path == nullptr) invalid("path is NULL");
    ctx->ctx->save_sequence(seq, path);
  });
}

gdn_status gdn_seq_load(gdn_context* ctx, const char* path, gdn_seq_id* out_seq) {
  return guard("gdn_seq_load", [&] {
    check(ctx);
    const Claim use = claim(ctx);
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
    const Claim changing = claim(batch);
    batch->batch.clear();
  });
}

gdn_status gdn_batch_add(gdn_batch* batch, gdn_seq_id seq, const gdn_token* tokens, int64_t n_tokens,
                         gdn_logits_mode logits, uint32_t flags, int64_t* out_first_row) {
  return guard("gdn_batch_add", [&] {
    check(batch);
    const Claim changing = claim(batch);
    if (n_tokens < 0) invalid("n_tokens is " + std::to_string(n_tokens));
    if (tokens == nullptr && n_tokens > 0) invalid("tokens is NULL");
    const int mode = enum_int(logits);
    if (mode != GDN_LOGITS_NONE && mode != GDN_LOGITS_LAST && mode != GDN_LOGITS_ALL)
      invalid("logits mode " + std::to_string(mode) + " is not a gdn_logits_mode");
    if ((flags & ~static_cast<uint32_t>(GDN_BATCH_HIDDEN_ALL | GDN_BATCH_NO_ROLLBACK)) != 0)
      invalid("flags " + std::to_string(flags) + " has bits this libgdn " GDN_VERSION_STRING " does not know");
    const std::size_t e = batch->batch.add(seq, std::span<const gdn::Token>(tokens, static_cast<std::size_t>(n_tokens)),
                                           static_cast<gdn::LogitsFor>(logits), (flags & GDN_BATCH_HIDDEN_ALL) != 0,
                                           (flags & GDN_BATCH_NO_ROLLBACK) == 0);
    if (out_first_row != nullptr) {
      const bool has_rows = n_tokens > 0 && batch->batch.output_row(e, n_tokens - 1) >= 0;
      *out_first_row = has_rows ? batch->batch.entries()[e].output_begin : -1;
    }
  });
}

gdn_status gdn_batch_size(const gdn_batch* batch, int64_t* out_tokens, int64_t* out_output_rows) {
  return guard("gdn_batch_size", [&] {
    check(batch);
    const Claim reading = claim_shared(batch);
    if (out_tokens != nullptr) *out_tokens = batch->batch.token_count();
    if (out_output_rows != nullptr) *out_output_rows = batch->batch.output_rows();
  });
}

// --- step ------------------------------------------------------------------------------------

gdn_status gdn_context_step(gdn_context* ctx, const gdn_batch* batch) {
  return guard("gdn_context_step", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check(batch);
    const Claim reading = claim_shared(batch);
    ctx->ctx->step(batch->batch);
  });
}

gdn_status gdn_context_step_mtp(gdn_context* ctx, const gdn_batch* batch, const float* hidden, int64_t n_hidden_rows) {
  return guard("gdn_context_step_mtp", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check(batch);
    const Claim reading = claim_shared(batch);
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
    const Claim use = claim(ctx);
    check_out(out_rows, "out_rows");
    *out_rows = ctx->ctx->output_rows();
  });
}

gdn_status gdn_context_get_logits(const gdn_context* ctx, int64_t row, const float** out_logits) {
  return guard("gdn_context_get_logits", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_logits, "out_logits");
    *out_logits = ctx->ctx->logits(row).data();
  });
}

gdn_status gdn_context_copy_logits(const gdn_context* ctx, int64_t first_row, int64_t n_rows, float* dst,
                                   int64_t dst_capacity) {
  return guard("gdn_context_copy_logits", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    const gdn::Context& c = *ctx->ctx;
    copy_rows(c, first_row, n_rows, c.model().config().vocab_size, dst, dst_capacity,
              [&](std::int64_t r) { return c.logits(r); }, "logits");
  });
}

gdn_status gdn_context_get_hidden(const gdn_context* ctx, int64_t row, const float** out_hidden) {
  return guard("gdn_context_get_hidden", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_hidden, "out_hidden");
    *out_hidden = ctx->ctx->hidden(row).data();
  });
}

gdn_status gdn_context_copy_hidden(const gdn_context* ctx, int64_t first_row, int64_t n_rows, float* dst,
                                   int64_t dst_capacity) {
  return guard("gdn_context_copy_hidden", [&] {
    check(ctx);
    const Claim use = claim(ctx);
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
  p.backend = GDN_BACKEND_CPU;
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
    o.backend = to_backend(p.backend);
    const gdn::DoctorReport report = gdn::run_doctor(model_dir, o);
    std::string json = report.to_json();
    last_report.swap(json);
    if (out_json) *out_json = last_report.c_str();
    if (out_n_fail) *out_n_fail = static_cast<int32_t>(report.count(gdn::Verdict::fail));
  });
}

}  // extern "C"

// =============================================================================================
// Text: tokenizer, stream decoder, chat template, sampling, generation, speculative decoding.

struct gdn_tokenizer {
  explicit gdn_tokenizer(gdn::Tokenizer t) : tok(std::move(t)) {}
  std::uint32_t magic = tokenizer_magic;
  gdn::Tokenizer tok;
};

struct gdn_stream_decoder {
  gdn_stream_decoder(const gdn::Tokenizer& t, bool skip_special) : tok(t), dec(tok, skip_special) {}
  gdn_stream_decoder(const gdn_stream_decoder&) = delete;  // `dec` points into this object
  gdn_stream_decoder& operator=(const gdn_stream_decoder&) = delete;
  std::uint32_t magic = stream_decoder_magic;
  // A copy sharing the tables (declared before `dec`, which points to it): the decoder does not
  // depend on the gdn_tokenizer handle staying alive.
  gdn::Tokenizer tok;
  gdn::StreamDecoder dec;
  std::string text;  // the last push/flush's text, handed out by pointer
  gdn::capi::UseFlag use;
};

struct gdn_sampler {
  std::uint32_t magic = sampler_magic;
  // Shared: a gdn_speculative that samples a sequence with it holds it until the sequence ends,
  // and claims its flag for each call that samples with it.
  std::shared_ptr<gdn::Sampler> sampler;
  std::shared_ptr<gdn::capi::UseFlag> use = std::make_shared<gdn::capi::UseFlag>();
};

struct gdn_generation_result {
  std::uint32_t magic = generation_magic;
  std::vector<gdn::GenerationResult> results;
};

struct gdn_speculative {
  gdn_speculative(const gdn_context& c, const gdn::SpeculativeParams& p)
      : ctx(c.ctx), ctx_use(c.use), dec(*ctx, p), max_draft(p.max_draft) {}
  // A started sequence's sampler, with the flag its gdn_sampler handle claims.
  struct SamplerRef {
    std::shared_ptr<gdn::Sampler> sampler;
    std::shared_ptr<gdn::capi::UseFlag> use;
  };
  std::uint32_t magic = speculative_magic;
  std::shared_ptr<gdn::Context> ctx;  // declared first, so destroyed after the decoder that uses it
  std::shared_ptr<gdn::capi::UseFlag> ctx_use;  // the context's flag: the decoder's calls claim it too
  gdn::SpeculativeDecoder dec;
  int max_draft;
  std::unordered_map<gdn::SeqId, SamplerRef> samplers;  // of the started sequences
  mutable gdn::capi::UseFlag use;
};

namespace {

void check(const gdn_tokenizer* t) { check_handle(t, tokenizer_magic, "tokenizer"); }
void check(const gdn_stream_decoder* d) { check_handle(d, stream_decoder_magic, "stream decoder"); }
void check(const gdn_sampler* s) { check_handle(s, sampler_magic, "sampler"); }
void check(const gdn_generation_result* r) { check_handle(r, generation_magic, "generation result"); }
void check(const gdn_speculative* s) { check_handle(s, speculative_magic, "speculative decoder"); }

Claim claim(gdn_stream_decoder* d) {
  return Claim(d->use, Claim::Mode::exclusive, "the stream decoder", "a gdn_stream_decoder is used by one thread at a time");
}
constexpr char sampler_rule[] =
    "a gdn_sampler is used by one thread at a time (a gdn_speculative samples with it until its sequence finishes)";
Claim claim(const gdn_sampler* s) { return Claim(*s->use, Claim::Mode::exclusive, "the sampler", sampler_rule); }
// Every call on a decoder claims the context too: the decoder keeps per-sequence state that only
// makes sense together with the context's.
Claim claim(const gdn_speculative* s) {
  return Claim(s->use, Claim::Mode::exclusive, "the speculative decoder", "a gdn_speculative is used by one thread at a time");
}
Claim claim_context(const gdn_speculative* s) { return Claim(*s->ctx_use, Claim::Mode::exclusive, "its context", context_rule); }

#define GDN_END_OF(type, field) static_cast<std::uint32_t>(offsetof(type, field) + sizeof(type::field))
constexpr std::uint32_t chat_params_v1 = GDN_END_OF(gdn_chat_params, preserve_thinking);
constexpr std::uint32_t sampling_params_v1 = GDN_END_OF(gdn_sampling_params, seed);
constexpr std::uint32_t generation_params_v1 = GDN_END_OF(gdn_generation_params, mtp_adaptive);
constexpr std::uint32_t generation_info_v1 = GDN_END_OF(gdn_generation_info, decode_seconds);
constexpr std::uint32_t speculative_params_v1 = GDN_END_OF(gdn_speculative_params, adaptive);
constexpr std::uint32_t speculative_stats_v1 = GDN_END_OF(gdn_speculative_stats, draft_rounds);
#undef GDN_END_OF

void check_flags(std::uint32_t flags, std::uint32_t allowed) {
  if ((flags & ~allowed) != 0)
    invalid("flags " + std::to_string(flags) + " has bits this libgdn " GDN_VERSION_STRING " does not know or this call does not take");
}

void check_count(std::int64_t n, const void* p, const char* what) {
  if (n < 0) invalid(std::string("the number of ") + what + " is " + std::to_string(n));
  if (p == nullptr && n > 0) invalid(std::string(what) + " is NULL");
}

std::span<const gdn::Token> token_span(const gdn_token* tokens, std::int64_t n, const char* what) {
  check_count(n, tokens, what);
  return {tokens, static_cast<std::size_t>(n)};
}

// "Caller buffers" in gdn.h: the arguments are checked before any work is done ...
void check_buffer(const void* buf, std::int64_t capacity, const void* out_n, const char* buf_name, const char* n_name) {
  check_out(out_n, n_name);
  if (capacity < 0) invalid(std::string("the capacity of ") + buf_name + " is " + std::to_string(capacity));
  if (buf == nullptr && capacity != 0)
    invalid(std::string(buf_name) + " is NULL with capacity " + std::to_string(capacity) + " (a size query passes 0)");
}

// ... then the result is delivered: a size query, too small (the size needed still written), or whole.
void deliver_ids(const std::vector<gdn::Token>& ids, gdn_token* out, std::int64_t capacity, int64_t* out_n) {
  const auto n = static_cast<std::int64_t>(ids.size());
  *out_n = n;
  if (out == nullptr) return;
  if (capacity < n)
    throw gdn::Error(gdn::Status::out_of_capacity,
                     "out_ids holds " + std::to_string(capacity) + " ids, the result needs " + std::to_string(n));
  std::copy(ids.begin(), ids.end(), out);
}

void deliver_text(const std::string& text, char* out, std::size_t capacity, std::size_t* out_len) {
  *out_len = text.size();
  if (out == nullptr) return;
  if (capacity < text.size() + 1)
    throw gdn::Error(gdn::Status::out_of_capacity, "out_text holds " + std::to_string(capacity) + " bytes, the text needs " +
                                                       std::to_string(text.size() + 1) + " (with its NUL)");
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
}

void check_text_buffer(const char* out, std::size_t capacity, const std::size_t* out_len) {
  check_out(out_len, "out_len");
  if (out == nullptr && capacity != 0)
    invalid("out_text is NULL with capacity " + std::to_string(capacity) + " (a size query passes 0)");
}

gdn_chat_params default_chat_params() {
  const gdn::ChatOptions d;
  gdn_chat_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.add_generation_prompt = d.add_generation_prompt;
  p.enable_thinking = d.enable_thinking;
  p.preserve_thinking = d.preserve_thinking;
  return p;
}

gdn_sampling_params default_sampling_params() {
  const gdn::SamplingParams d;
  gdn_sampling_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.repetition_penalty = d.repetition_penalty;
  p.presence_penalty = d.presence_penalty;
  p.seed = d.seed;
  p.frequency_penalty = d.frequency_penalty;
  return p;
}

gdn::SamplingParams to_cpp(const gdn_sampling_params* in) {
  gdn_sampling_params p = default_sampling_params();
  read_struct(in, p, sampling_params_v1, "gdn_sampling_params");
  gdn::SamplingParams s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.repetition_penalty = p.repetition_penalty;
  s.presence_penalty = p.presence_penalty;
  s.seed = p.seed;
  s.frequency_penalty = p.frequency_penalty;
  return s;
}

gdn_generation_params default_generation_params() {
  const gdn::GenerationParams d;
  gdn_generation_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.max_tokens = d.max_tokens;
  p.sampling = nullptr;
  p.stop_on_eos = d.stop_on_eos;
  p.mtp_draft = d.mtp_draft;
  p.mtp_adaptive = d.mtp_adaptive;
  return p;
}

gdn::GenerationParams to_cpp(const gdn_generation_params* in) {
  gdn_generation_params p = default_generation_params();
  read_struct(in, p, generation_params_v1, "gdn_generation_params");
  gdn::GenerationParams g;
  g.sampling = to_cpp(p.sampling);
  g.max_tokens = p.max_tokens;
  g.stop_on_eos = p.stop_on_eos;
  check_count(p.n_stop_tokens, p.stop_tokens, "stop_tokens");
  g.stop_tokens.assign(p.stop_tokens, p.stop_tokens + p.n_stop_tokens);
  check_count(p.n_stop_strings, p.stop_strings, "stop_strings");
  for (std::int32_t i = 0; i < p.n_stop_strings; ++i) {
    if (p.stop_strings[i] == nullptr) invalid("stop_strings[" + std::to_string(i) + "] is NULL");
    g.stop_strings.emplace_back(p.stop_strings[i]);
  }
  g.mtp_draft = p.mtp_draft;
  g.mtp_adaptive = p.mtp_adaptive;
  return g;
}

gdn_speculative_params default_speculative_params() {
  const gdn::SpeculativeParams d;
  gdn_speculative_params p;
  std::memset(&p, 0, sizeof p);
  p.size = sizeof p;
  p.max_draft = d.max_draft;
  p.adaptive = d.adaptive;
  return p;
}

void write_stats(const gdn::SpeculativeStats& s, gdn_speculative_stats* out) {
  gdn_speculative_stats v;
  std::memset(&v, 0, sizeof v);
  v.size = sizeof v;
  v.k = s.k;
  v.rounds = s.rounds;
  v.drafted = s.drafted;
  v.accepted = s.accepted;
  v.generated = s.generated;
  v.draft_rounds = s.draft_rounds;
  write_struct(out, v, speculative_stats_v1, "gdn_speculative_stats");
}

template <typename F>
gdn_status load_tokenizer(const char* fn, gdn_tokenizer** out, F&& load) {
  return guard(fn, [&] {
    check_out(out, "out_tokenizer");
    auto handle = std::make_unique<gdn_tokenizer>(load());
    *out = handle.release();
  });
}

const gdn::GenerationResult& result_at(const gdn_generation_result* r, std::int32_t i) {
  check(r);
  if (i < 0 || static_cast<std::size_t>(i) >= r->results.size())
    invalid("sequence " + std::to_string(i) + " of a result of " + std::to_string(r->results.size()));
  return r->results[static_cast<std::size_t>(i)];
}

// Runs the Generator with the C callback; the result handle is made only when it succeeded.
gdn_generation_result* run_generate(gdn_context* ctx, const gdn_tokenizer* tokenizer,
                                    std::span<const std::vector<gdn::Token>> prompts,
                                    std::span<const gdn::GenerationParams> params, gdn_text_callback on_text,
                                    void* user_data) {
  auto handle = std::make_unique<gdn_generation_result>();  // allocated first: no failure after the work
  gdn::TextCallback cb;
  std::string piece;  // NUL-terminated copy of each piece for the C callback
  if (on_text != nullptr)
    cb = [&](std::size_t i, std::string_view text) {
      piece.assign(text);
      return on_text(user_data, static_cast<int32_t>(i), piece.c_str(), piece.size()) != 0;
    };
  // The eos ids are read from the checkpoint directory at each call, as `gdn generate` does:
  // config.json and generation_config.json (the model's config holds only the former's).
  gdn::Generator gen(*ctx->ctx, tokenizer->tok, gdn::load_eos_token_ids(ctx->ctx->model().dir()));
  handle->results = gen.generate(prompts, params, cb);
  return handle.release();
}

}  // namespace

extern "C" {

// --- tokenizer -------------------------------------------------------------------------------

gdn_status gdn_tokenizer_load(const char* path, gdn_tokenizer** out_tokenizer) {
  return load_tokenizer("gdn_tokenizer_load", out_tokenizer, [&] {
    if (path == nullptr) invalid("path is NULL");
    return gdn::Tokenizer::load(path);
  });
}

gdn_status gdn_tokenizer_load_model_dir(const char* model_dir, gdn_tokenizer** out_tokenizer) {
  return load_tokenizer("gdn_tokenizer_load_model_dir", out_tokenizer, [&] {
    if (model_dir == nullptr) invalid("model_dir is NULL");
    std::string path = model_dir;
    if (!path.empty() && path.back() != '/') path += '/';
    return gdn::Tokenizer::load(path + "tokenizer.json");
  });
}

gdn_status gdn_tokenizer_load_json(const char* json, size_t json_len, gdn_tokenizer** out_tokenizer) {
  return load_tokenizer("gdn_tokenizer_load_json", out_tokenizer, [&] {
    if (json == nullptr) invalid("json is NULL");
    return gdn::Tokenizer::from_json(std::string_view(json, json_len));
  });
}

void gdn_tokenizer_free(gdn_tokenizer* tokenizer) {
  if (tokenizer == nullptr || tokenizer->magic != tokenizer_magic) return;
  tokenizer->magic = dead_magic;
  delete tokenizer;
}

gdn_status gdn_tokenizer_vocab_size(const gdn_tokenizer* tokenizer, int32_t* out_vocab_size) {
  return guard("gdn_tokenizer_vocab_size", [&] {
    check(tokenizer);
    check_out(out_vocab_size, "out_vocab_size");
    *out_vocab_size = tokenizer->tok.vocab_size();
  });
}

gdn_status gdn_tokenizer_encode(const gdn_tokenizer* tokenizer, const char* text, size_t text_len, uint32_t flags,
                                gdn_token* out_ids, int64_t capacity, int64_t* out_n_ids) {
  return guard("gdn_tokenizer_encode", [&] {
    check(tokenizer);
    if (text == nullptr && text_len > 0) invalid("text is NULL");
    check_flags(flags, GDN_TOKENIZE_SPECIAL_AS_TEXT);
    check_buffer(out_ids, capacity, out_n_ids, "out_ids", "out_n_ids");
    const std::string_view t = text_len > 0 ? std::string_view(text, text_len) : std::string_view();
    deliver_ids(tokenizer->tok.encode(t, (flags & GDN_TOKENIZE_SPECIAL_AS_TEXT) == 0), out_ids, capacity, out_n_ids);
  });
}

gdn_status gdn_tokenizer_decode(const gdn_tokenizer* tokenizer, const gdn_token* ids, int64_t n_ids, uint32_t flags,
                                char* out_text, size_t capacity, size_t* out_len) {
  return guard("gdn_tokenizer_decode", [&] {
    check(tokenizer);
    const auto span = token_span(ids, n_ids, "ids");
    check_flags(flags, GDN_DECODE_SKIP_SPECIAL);
    check_text_buffer(out_text, capacity, out_len);
    deliver_text(tokenizer->tok.decode(span, (flags & GDN_DECODE_SKIP_SPECIAL) != 0), out_text, capacity, out_len);
  });
}

gdn_status gdn_tokenizer_token_to_id(const gdn_tokenizer* tokenizer, const char* token, size_t token_len, gdn_token* out_id) {
  return guard("gdn_tokenizer_token_to_id", [&] {
    check(tokenizer);
    check_out(out_id, "out_id");
    if (token == nullptr && token_len > 0) invalid("token is NULL");
    const auto id = tokenizer->tok.token_to_id(token_len > 0 ? std::string_view(token, token_len) : std::string_view());
    *out_id = id ? *id : -1;
  });
}

gdn_status gdn_tokenizer_id_to_token(const gdn_tokenizer* tokenizer, gdn_token id, const char** out_token, size_t* out_len,
                                     bool* out_is_special) {
  return guard("gdn_tokenizer_id_to_token", [&] {
    check(tokenizer);
    check_out(out_token, "out_token");
    check_out(out_len, "out_len");
    const std::string& s = tokenizer->tok.id_to_token(id);  // INVALID_TOKEN when out of range
    const bool special = tokenizer->tok.is_special(id);
    *out_token = s.c_str();
    *out_len = s.size();
    if (out_is_special != nullptr) *out_is_special = special;
  });
}

// --- stream decoder --------------------------------------------------------------------------

gdn_status gdn_stream_decoder_create(const gdn_tokenizer* tokenizer, uint32_t flags, gdn_stream_decoder** out_decoder) {
  return guard("gdn_stream_decoder_create", [&] {
    check(tokenizer);
    check_out(out_decoder, "out_decoder");
    check_flags(flags, GDN_DECODE_SKIP_SPECIAL);
    auto handle = std::make_unique<gdn_stream_decoder>(tokenizer->tok, (flags & GDN_DECODE_SKIP_SPECIAL) != 0);
    *out_decoder = handle.release();
  });
}

void gdn_stream_decoder_free(gdn_stream_decoder* decoder) {
  if (decoder == nullptr || decoder->magic != stream_decoder_magic) return;
  decoder->magic = dead_magic;
  delete decoder;
}

gdn_status gdn_stream_decoder_push(gdn_stream_decoder* decoder, gdn_token id, const char** out_text, size_t* out_len) {
  return guard("gdn_stream_decoder_push", [&] {
    check(decoder);
    const Claim use = claim(decoder);
    check_out(out_text, "out_text");
    check_out(out_len, "out_len");
    decoder->text = decoder->dec.push(id);  // checks the id before it changes anything
    *out_text = decoder->text.c_str();
    *out_len = decoder->text.size();
  });
}

gdn_status gdn_stream_decoder_flush(gdn_stream_decoder* decoder, const char** out_text, size_t* out_len) {
  return guard("gdn_stream_decoder_flush", [&] {
    check(decoder);
    const Claim use = claim(decoder);
    check_out(out_text, "out_text");
    check_out(out_len, "out_len");
    decoder->text = decoder->dec.flush();
    *out_text = decoder->text.c_str();
    *out_len = decoder->text.size();
  });
}

gdn_status gdn_stream_decoder_reset(gdn_stream_decoder* decoder) {
  return guard("gdn_stream_decoder_reset", [&] {
    check(decoder);
    const Claim use = claim(decoder);
    decoder->dec.reset();
  });
}

// --- chat template ---------------------------------------------------------------------------

gdn_status gdn_chat_params_init(gdn_chat_params* params) {
  return guard("gdn_chat_params_init", [&] { init_struct(params, default_chat_params(), chat_params_v1, "gdn_chat_params"); });
}

gdn_status gdn_chat_render(const char* const* roles, const char* const* contents, const char* const* reasoning_contents,
                           size_t n_messages, const gdn_chat_params* params, char* out_text, size_t capacity,
                           size_t* out_len) {
  return guard("gdn_chat_render", [&] {
    if (n_messages > 0 && roles == nullptr) invalid("roles is NULL");
    if (n_messages > 0 && contents == nullptr) invalid("contents is NULL");
    gdn_chat_params p = default_chat_params();
    read_struct(params, p, chat_params_v1, "gdn_chat_params");
    check_text_buffer(out_text, capacity, out_len);
    std::vector<gdn::ChatMessage> messages(n_messages);
    for (std::size_t i = 0; i < n_messages; ++i) {
      if (roles[i] == nullptr) invalid("roles[" + std::to_string(i) + "] is NULL");
      messages[i].role = roles[i];
      if (contents[i] != nullptr) messages[i].content = contents[i];
      if (reasoning_contents != nullptr && reasoning_contents[i] != nullptr) messages[i].reasoning_content = reasoning_contents[i];
    }
    gdn::ChatOptions o;
    o.add_generation_prompt = p.add_generation_prompt;
    o.enable_thinking = p.enable_thinking;
    o.preserve_thinking = p.preserve_thinking;
    deliver_text(gdn::render_chat(messages, o), out_text, capacity, out_len);
  });
}

gdn_status gdn_chat_render_json(const char* messages_json, const char* tools_json, const gdn_chat_params* params,
                                char* out_text, size_t capacity, size_t* out_len) {
  return guard("gdn_chat_render_json", [&] {
    if (messages_json == nullptr) invalid("messages_json is NULL");
    gdn_chat_params p = default_chat_params();
    read_struct(params, p, chat_params_v1, "gdn_chat_params");
    check_text_buffer(out_text, capacity, out_len);
    gdn::ChatOptions o;
    o.add_generation_prompt = p.add_generation_prompt;
    o.enable_thinking = p.enable_thinking;
    o.preserve_thinking = p.preserve_thinking;
    deliver_text(gdn::render_chat_json(messages_json, tools_json != nullptr ? tools_json : "", o), out_text, capacity, out_len);
  });
}

// --- sampling --------------------------------------------------------------------------------

gdn_status gdn_sampling_params_init(gdn_sampling_params* params) {
  return guard("gdn_sampling_params_init",
               [&] { init_struct(params, default_sampling_params(), sampling_params_v1, "gdn_sampling_params"); });
}

gdn_status gdn_sampler_create(const gdn_sampling_params* params, int32_t vocab_size, gdn_sampler** out_sampler) {
  return guard("gdn_sampler_create", [&] {
    check_out(out_sampler, "out_sampler");
    auto handle = std::make_unique<gdn_sampler>();
    handle->sampler = std::make_shared<gdn::Sampler>(to_cpp(params), vocab_size);  // validates the settings
    *out_sampler = handle.release();
  });
}

void gdn_sampler_free(gdn_sampler* sampler) {
  if (sampler == nullptr || sampler->magic != sampler_magic) return;
  sampler->magic = dead_magic;
  delete sampler;
}

gdn_status gdn_sampler_observe(gdn_sampler* sampler, const gdn_token* tokens, int64_t n_tokens) {
  return guard("gdn_sampler_observe", [&] {
    check(sampler);
    const Claim use = claim(sampler);
    sampler->sampler->observe(token_span(tokens, n_tokens, "tokens"));
  });
}

gdn_status gdn_sampler_sample(gdn_sampler* sampler, const float* logits, int64_t n_logits, gdn_token* out_token) {
  return guard("gdn_sampler_sample", [&] {
    check(sampler);
    const Claim use = claim(sampler);
    check_out(out_token, "out_token");
    check_count(n_logits, logits, "logits");
    *out_token = sampler->sampler->sample(std::span<const float>(logits, static_cast<std::size_t>(n_logits)));
  });
}

gdn_status gdn_sampler_sample_row(gdn_sampler* sampler, const gdn_context* ctx, int64_t row, gdn_token* out_token) {
  return guard("gdn_sampler_sample_row", [&] {
    check(sampler);
    const Claim use = claim(sampler);
    check(ctx);
    const Claim ctx_use = claim(ctx);
    check_out(out_token, "out_token");
    *out_token = sampler->sampler->sample(ctx->ctx->logits(row));
  });
}

gdn_status gdn_sampler_distribution(const gdn_sampler* sampler, const float* logits, int64_t n_logits, float* probs,
                                    int64_t capacity) {
  return guard("gdn_sampler_distribution", [&] {
    check(sampler);
    const Claim use = claim(sampler);
    check_count(n_logits, logits, "logits");
    if (probs == nullptr) invalid("probs is NULL");
    if (capacity < n_logits)
      invalid("probs holds " + std::to_string(capacity) + " floats, the distribution needs " + std::to_string(n_logits));
    sampler->sampler->distribution(std::span<const float>(logits, static_cast<std::size_t>(n_logits)),
                                   std::span<float>(probs, static_cast<std::size_t>(n_logits)));
  });
}

// --- generation ------------------------------------------------------------------------------

gdn_status gdn_generation_params_init(gdn_generation_params* params) {
  return guard("gdn_generation_params_init",
               [&] { init_struct(params, default_generation_params(), generation_params_v1, "gdn_generation_params"); });
}

gdn_status gdn_generate(gdn_context* ctx, const gdn_tokenizer* tokenizer, const gdn_token* prompt, int64_t n_prompt,
                        const gdn_generation_params* params, gdn_text_callback on_text, void* user_data,
                        gdn_generation_result** out_result) {
  return guard("gdn_generate", [&] {
    check(ctx);
    const Claim use = claim(ctx);  // held while the callback runs: a callback calling into ctx gets BUSY
    check(tokenizer);
    check_out(out_result, "out_result");
    const auto span = token_span(prompt, n_prompt, "prompt");
    const std::vector<gdn::Token> prompts[1] = {std::vector<gdn::Token>(span.begin(), span.end())};
    const gdn::GenerationParams gp[1] = {to_cpp(params)};
    *out_result = run_generate(ctx, tokenizer, prompts, gp, on_text, user_data);
  });
}

gdn_status gdn_generate_batch(gdn_context* ctx, const gdn_tokenizer* tokenizer, int32_t n_prompts,
                              const gdn_token* const* prompts, const int64_t* n_prompt_tokens,
                              const gdn_generation_params* const* params, gdn_text_callback on_text, void* user_data,
                              gdn_generation_result** out_result) {
  return guard("gdn_generate_batch", [&] {
    check(ctx);
    const Claim use = claim(ctx);  // held while the callback runs: a callback calling into ctx gets BUSY
    check(tokenizer);
    check_out(out_result, "out_result");
    if (n_prompts < 1) invalid("n_prompts is " + std::to_string(n_prompts));
    if (prompts == nullptr) invalid("prompts is NULL");
    if (n_prompt_tokens == nullptr) invalid("n_prompt_tokens is NULL");
    std::vector<std::vector<gdn::Token>> ps;
    std::vector<gdn::GenerationParams> gps;
    for (std::int32_t i = 0; i < n_prompts; ++i) {
      const auto span = token_span(prompts[i], n_prompt_tokens[i], "prompts[i]");
      ps.emplace_back(span.begin(), span.end());
      gps.push_back(to_cpp(params != nullptr ? params[i] : nullptr));
    }
    *out_result = run_generate(ctx, tokenizer, ps, gps, on_text, user_data);
  });
}

void gdn_generation_result_free(gdn_generation_result* result) {
  if (result == nullptr || result->magic != generation_magic) return;
  result->magic = dead_magic;
  delete result;
}

gdn_status gdn_generation_result_count(const gdn_generation_result* result, int32_t* out_count) {
  return guard("gdn_generation_result_count", [&] {
    check(result);
    check_out(out_count, "out_count");
    *out_count = static_cast<int32_t>(result->results.size());
  });
}

gdn_status gdn_generation_result_tokens(const gdn_generation_result* result, int32_t i, const gdn_token** out_tokens,
                                        int64_t* out_n_tokens) {
  return guard("gdn_generation_result_tokens", [&] {
    const gdn::GenerationResult& r = result_at(result, i);
    check_out(out_tokens, "out_tokens");
    check_out(out_n_tokens, "out_n_tokens");
    *out_tokens = r.tokens.empty() ? nullptr : r.tokens.data();
    *out_n_tokens = static_cast<int64_t>(r.tokens.size());
  });
}

gdn_status gdn_generation_result_text(const gdn_generation_result* result, int32_t i, const char** out_text, size_t* out_len) {
  return guard("gdn_generation_result_text", [&] {
    const gdn::GenerationResult& r = result_at(result, i);
    check_out(out_text, "out_text");
    check_out(out_len, "out_len");
    *out_text = r.text.c_str();
    *out_len = r.text.size();
  });
}

gdn_status gdn_generation_result_get_info(const gdn_generation_result* result, int32_t i, gdn_generation_info* out_info) {
  return guard("gdn_generation_result_get_info", [&] {
    const gdn::GenerationResult& r = result_at(result, i);
    gdn_generation_info v;
    std::memset(&v, 0, sizeof v);
    v.size = sizeof v;
    v.finish = static_cast<gdn_finish_reason>(r.finish);
    v.prompt_tokens = r.prompt_tokens;
    v.generated_tokens = static_cast<int64_t>(r.tokens.size());
    v.prefill_seconds = r.prefill_seconds;
    v.decode_seconds = r.decode_seconds;
    write_struct(out_info, v, generation_info_v1, "gdn_generation_info");
  });
}

gdn_status gdn_generation_result_get_speculative_stats(const gdn_generation_result* result, int32_t i,
                                                       gdn_speculative_stats* out_stats) {
  return guard("gdn_generation_result_get_speculative_stats", [&] { write_stats(result_at(result, i).speculative, out_stats); });
}

// --- speculative decoding --------------------------------------------------------------------

gdn_status gdn_speculative_params_init(gdn_speculative_params* params) {
  return guard("gdn_speculative_params_init",
               [&] { init_struct(params, default_speculative_params(), speculative_params_v1, "gdn_speculative_params"); });
}

gdn_status gdn_speculative_create(gdn_context* ctx, const gdn_speculative_params* params, gdn_speculative** out_spec) {
  return guard("gdn_speculative_create", [&] {
    check(ctx);
    const Claim use = claim(ctx);
    check_out(out_spec, "out_spec");
    gdn_speculative_params p = default_speculative_params();
    read_struct(params, p, speculative_params_v1, "gdn_speculative_params");
    // The C++ constructor refuses a model without an MTP head (UNSUPPORTED_MODEL), a max_draft out
    // of range and a context that cannot roll back max_draft + 1 tokens (INVALID_ARGUMENT).
    auto handle = std::make_unique<gdn_speculative>(*ctx, gdn::SpeculativeParams{p.max_draft, p.adaptive});
    *out_spec = handle.release();
  });
}

void gdn_speculative_free(gdn_speculative* spec) {
  if (spec == nullptr || spec->magic != speculative_magic) return;
  spec->magic = dead_magic;
  delete spec;
}

gdn_status gdn_speculative_start(gdn_speculative* spec, gdn_seq_id seq, const gdn_token* prompt, int64_t n_prompt,
                                 gdn_sampler* sampler, gdn_token* out_token) {
  return guard("gdn_speculative_start", [&] {
    check(spec);
    const Claim use = claim(spec);
    const Claim ctx_use = claim_context(spec);
    check(sampler);
    const Claim sampler_use = claim(sampler);
    check_out(out_token, "out_token");
    const auto span = token_span(prompt, n_prompt, "prompt");
    gdn_speculative::SamplerRef s{sampler->sampler, sampler->use};
    // Reserve the map entry first, so nothing can fail once the decoder has taken the sequence.
    auto& slot = spec->samplers[seq];
    gdn_speculative::SamplerRef previous = slot;
    // start() records the prompt in the sampler before its step can fail: keep a copy to put back.
    const gdn::Sampler saved = *s.sampler;
    try {
      const gdn::Token first = spec->dec.start(seq, span, *s.sampler);
      slot = std::move(s);
      *out_token = first;
    } catch (...) {
      *sampler->sampler = saved;
      if (previous.sampler) slot = std::move(previous);
      else spec->samplers.erase(seq);
      throw;
    }
  });
}

gdn_status gdn_speculative_advance(gdn_speculative* spec, const gdn_seq_id* seqs, int32_t n_seqs, gdn_token* const* out_tokens,
                                   int64_t capacity, int64_t* out_counts) {
  return guard("gdn_speculative_advance", [&] {
    check(spec);
    const Claim use = claim(spec);
    const Claim ctx_use = claim_context(spec);
    check_count(n_seqs, seqs, "seqs");
    if (n_seqs > 0 && out_tokens == nullptr) invalid("out_tokens is NULL");
    if (n_seqs > 0 && out_counts == nullptr) invalid("out_counts is NULL");
    if (capacity < spec->max_draft + 1)
      invalid("each out_tokens buffer must hold max_draft + 1 = " + std::to_string(spec->max_draft + 1) + " tokens, capacity is " +
              std::to_string(capacity));
    const gdn::Context& c = *spec->ctx;
    std::unordered_set<gdn::SeqId> seen;
    for (std::int32_t i = 0; i < n_seqs; ++i) {
      if (out_tokens[i] == nullptr) invalid("out_tokens[" + std::to_string(i) + "] is NULL");
      if (!seen.insert(seqs[i]).second) invalid("sequence " + std::to_string(seqs[i]) + " appears twice");
      if (spec->samplers.count(seqs[i]) == 0)
        throw gdn::Error(gdn::Status::invalid_sequence, "sequence " + std::to_string(seqs[i]) + " was not started");
      // Refused here, before any work, rather than by the verify step after the drafts.
      if (c.sequence_length(seqs[i]) + spec->max_draft + 1 > c.params().max_context)
        throw gdn::Error(gdn::Status::context_overflow, "sequence " + std::to_string(seqs[i]) + " has fewer than max_draft + 1 = " +
                                                            std::to_string(spec->max_draft + 1) + " positions left");
    }
    // The samplers the round draws with (a gdn_sampler may serve several of the sequences).
    std::vector<gdn::capi::UseFlag*> flags;
    for (std::int32_t i = 0; i < n_seqs; ++i) flags.push_back(spec->samplers.at(seqs[i]).use.get());
    std::sort(flags.begin(), flags.end());
    flags.erase(std::unique(flags.begin(), flags.end()), flags.end());
    std::deque<Claim> sampler_uses;  // Claim cannot move; a deque builds each in place
    for (auto* f : flags) sampler_uses.emplace_back(*f, Claim::Mode::exclusive, "the sampler of a sequence", sampler_rule);
    std::vector<std::vector<gdn::Token>> produced(static_cast<std::size_t>(n_seqs));
    std::vector<std::vector<gdn::Token>*> outs;
    for (auto& v : produced) outs.push_back(&v);
    spec->dec.advance(std::span<const gdn::SeqId>(seqs, static_cast<std::size_t>(n_seqs)), outs);
    for (std::size_t i = 0; i < produced.size(); ++i) {
      std::copy(produced[i].begin(), produced[i].end(), out_tokens[i]);
      out_counts[i] = static_cast<int64_t>(produced[i].size());
    }
  });
}

gdn_status gdn_speculative_finish(gdn_speculative* spec, gdn_seq_id seq) {
  return guard("gdn_speculative_finish", [&] {
    check(spec);
    const Claim use = claim(spec);
    spec->dec.finish(seq);
    spec->samplers.erase(seq);
  });
}

gdn_status gdn_speculative_get_stats(const gdn_speculative* spec, gdn_speculative_stats* out_stats) {
  return guard("gdn_speculative_get_stats", [&] {
    check(spec);
    const Claim use = claim(spec);
    write_stats(spec->dec.stats(), out_stats);
  });
}

}  // extern "C"
