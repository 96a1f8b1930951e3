// The C ABI (capi/gdn.h) against the C++ API it wraps: the same logits bit for bit, every status
// code and message, NULL and foreign handles, struct sizes (older, newer, garbage), the
// thread-local last error. tests/test_capi_c.c drives the shared library from plain C.

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gdn.h"
#include "test_util.hpp"

using namespace gdn;

namespace {

constexpr float logit_tolerance = 2e-3f;  // as tests/test_model_fixtures.cpp

std::string last_error() { return gdn_last_error(); }

gdn_context_params small_c_params(int sequences = 3) {
  gdn_context_params p = gdn_context_default_params();
  p.max_sequences = sequences;
  p.max_context = 512;
  p.threads = 2;
  p.max_logits_rows = 256;
  p.max_batch_tokens = 512;
  return p;
}

ContextParams small_cpp_params(int sequences = 3) {
  ContextParams p;
  p.max_sequences = sequences;
  p.max_context = 512;
  p.threads = 2;
  p.max_logits_rows = 256;
  p.max_batch_tokens = 512;
  return p;
}

struct CModel {
  gdn_model* m = nullptr;
  explicit CModel(const std::string& name) {
    REQUIRE(gdn_model_load(test::fixture_model(name).c_str(), nullptr, &m) == GDN_STATUS_OK);
  }
  ~CModel() { gdn_model_free(m); }
};

struct CContext {
  gdn_context* c = nullptr;
  CContext(gdn_model* m, const gdn_context_params& p) { REQUIRE(gdn_context_create(m, &p, &c) == GDN_STATUS_OK); }
  ~CContext() { gdn_context_free(c); }
};

struct CBatch {
  gdn_batch* b = nullptr;
  CBatch() { REQUIRE(gdn_batch_init(4, 256, &b) == GDN_STATUS_OK); }
  ~CBatch() { gdn_batch_free(b); }
};

std::vector<float> c_prefill(gdn_context* ctx, const std::vector<Token>& tokens, int vocab) {
  gdn_seq_id s = 0;
  REQUIRE(gdn_seq_create(ctx, &s) == GDN_STATUS_OK);
  CBatch b;
  std::int64_t row = -2;
  REQUIRE(gdn_batch_add(b.b, s, tokens.data(), static_cast<std::int64_t>(tokens.size()), GDN_LOGITS_ALL, 0, &row) ==
          GDN_STATUS_OK);
  CHECK(row == 0);
  REQUIRE(gdn_context_step(ctx, b.b) == GDN_STATUS_OK);
  std::int64_t rows = 0;
  REQUIRE(gdn_context_n_outputs(ctx, &rows) == GDN_STATUS_OK);
  REQUIRE(rows == static_cast<std::int64_t>(tokens.size()));
  std::vector<float> out(tokens.size() * static_cast<std::size_t>(vocab));
  REQUIRE(gdn_context_copy_logits(ctx, 0, rows, out.data(), static_cast<std::int64_t>(out.size())) == GDN_STATUS_OK);
  // The pointer accessor shows the same rows, contiguously.
  const float* p0 = nullptr;
  const float* plast = nullptr;
  REQUIRE(gdn_context_get_logits(ctx, 0, &p0) == GDN_STATUS_OK);
  REQUIRE(gdn_context_get_logits(ctx, rows - 1, &plast) == GDN_STATUS_OK);
  CHECK(plast == p0 + (rows - 1) * vocab);
  CHECK(std::memcmp(p0, out.data(), out.size() * sizeof(float)) == 0);
  REQUIRE(gdn_seq_free(ctx, s) == GDN_STATUS_OK);
  return out;
}

}  // namespace

TEST_CASE("library version, ABI version and status names", "[capi]") {
  CHECK(gdn_abi_version() == GDN_ABI_VERSION);
  CHECK(std::string(gdn_version_string()) ==
        fmt::format("{}.{}.{}", gdn::version / 10000, gdn::version / 100 % 100, gdn::version % 100));
  for (int s = 0; s <= static_cast<int>(Status::internal); ++s)
    CHECK(std::string(gdn_status_string(static_cast<gdn_status>(s))) == status_name(static_cast<Status>(s)));
  CHECK(std::string(gdn_status_string(static_cast<gdn_status>(999))) == "unknown");
  CHECK(gdn_last_error() != nullptr);
}

TEST_CASE("C ABI logits equal the C++ API's, bit for bit, and transformers' within tolerance", "[capi][fixtures]") {
  for (const std::string name : {"qwen35_tied", "qwen35_cond_mtp", "qwen3next_dense"}) {
    CModel cm(name);
    gdn_model_config cfg;
    cfg.size = sizeof cfg;
    REQUIRE(gdn_model_get_config(cm.m, &cfg) == GDN_STATUS_OK);
    CContext cc(cm.m, small_c_params());
    auto model = Model::load(test::fixture_model(name));
    Context ctx(model, small_cpp_params());
    test::Reference ref(name);
    for (int i = 0; i < 6; ++i) {
      const auto tokens = ref.tokens(fmt::format("prompt{}.tokens", i));
      const auto expect = ref.floats(fmt::format("prompt{}.logits", i));
      const auto via_c = c_prefill(cc.c, tokens, cfg.vocab_size);
      const auto via_cpp = test::prefill_logits(ctx, tokens);
      REQUIRE(via_c.size() == via_cpp.size());
      INFO(fmt::format("{} prompt {}", name, i));
      CHECK(std::memcmp(via_c.data(), via_cpp.data(), via_c.size() * sizeof(float)) == 0);
      CHECK(test::max_abs_diff(via_c.data(), expect.data(), expect.size()) <= logit_tolerance);
    }
  }
}

TEST_CASE("model config through the C ABI", "[capi]") {
  CModel cm("qwen35_cond_mtp");
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  const ModelConfig& c = model->config();
  gdn_model_config cfg;
  cfg.size = sizeof cfg;
  REQUIRE(gdn_model_get_config(cm.m, &cfg) == GDN_STATUS_OK);
  CHECK(cfg.size == sizeof cfg);
  CHECK(cfg.vocab_size == c.vocab_size);
  CHECK(cfg.hidden_size == c.hidden_size);
  CHECK(cfg.num_layers == c.num_layers);
  CHECK(cfg.num_linear_attention_layers == 3);
  CHECK(cfg.num_full_attention_layers == 1);
  CHECK(cfg.linear_num_value_heads == c.linear_num_value_heads);
  CHECK(cfg.head_dim == c.head_dim);
  CHECK(cfg.rotary_dim == c.rotary_dim);
  CHECK(cfg.has_mtp);
  CHECK(!cfg.tie_word_embeddings);
  CHECK(cfg.rope_theta == c.rope_theta);
  CHECK(cfg.state_dtype == GDN_STATE_DTYPE_F32);
  CHECK(std::string(cfg.architecture) == c.architecture);
  CHECK(std::string(cfg.model_type) == c.model_type);
  REQUIRE(cfg.n_eos_token_ids == static_cast<int>(c.eos_token_ids.size()));
  for (int i = 0; i < cfg.n_eos_token_ids; ++i) CHECK(cfg.eos_token_ids[i] == c.eos_token_ids[static_cast<std::size_t>(i)]);

  SECTION("a newer caller's larger struct: the fields this library does not know come back zero") {
    struct Newer {
      gdn_model_config known;
      std::uint64_t future[4];
    } n;
    std::memset(&n, 0xab, sizeof n);
    n.known.size = sizeof n;
    REQUIRE(gdn_model_get_config(cm.m, &n.known) == GDN_STATUS_OK);
    CHECK(n.known.size == sizeof n);
    CHECK(n.known.vocab_size == c.vocab_size);
    for (const auto f : n.future) CHECK(f == 0);
  }
  SECTION("a size below the first version's, or garbage, is refused") {
    for (const std::uint32_t bad : {0u, 4u, static_cast<std::uint32_t>(sizeof cfg - 8), 0xffffffffu}) {
      cfg.size = bad;
      CHECK(gdn_model_get_config(cm.m, &cfg) == GDN_STATUS_INVALID_ARGUMENT);
      CHECK_THAT(last_error(), Catch::Contains("wrong-size parameter struct"));
    }
  }
}

TEST_CASE("parameter structs: defaults, sizes, newer and older callers", "[capi]") {
  const ContextParams d;
  const gdn_context_params p = gdn_context_default_params();
  CHECK(p.size == sizeof p);
  CHECK(p.max_sequences == d.max_sequences);
  CHECK(p.max_context == d.max_context);
  CHECK(p.kv_page_size == d.kv_page_size);
  CHECK(p.kv_pages == d.kv_pages);
  CHECK(p.max_batch_tokens == d.max_batch_tokens);
  CHECK(p.max_logits_rows == d.max_logits_rows);
  CHECK(p.state_dtype == GDN_STATE_DTYPE_DEFAULT);
  CHECK(p.threads == d.threads);
  CHECK(p.gdn_chunk_min_tokens == d.gdn_chunk_min_tokens);
  CHECK(p.max_rollback_tokens == d.max_rollback_tokens);
  CHECK(p.backend == GDN_BACKEND_CPU);
  CHECK(gdn_model_default_params().load_mtp == ModelParams{}.load_mtp);

  CModel cm("qwen35_tied");
  gdn_context* ctx = nullptr;

  SECTION("wrong size") {
    gdn_context_params bad = small_c_params();
    for (const std::uint32_t size : {0u, 1u, 8u, static_cast<std::uint32_t>(sizeof bad - 8), 1u << 20}) {
      bad.size = size;
      CHECK(gdn_context_create(cm.m, &bad, &ctx) == GDN_STATUS_INVALID_ARGUMENT);
      CHECK_THAT(last_error(), Catch::Contains("wrong-size parameter struct"));
      CHECK(ctx == nullptr);
      gdn_context_params init;
      init.size = size;
      CHECK(gdn_context_params_init(&init) == GDN_STATUS_INVALID_ARGUMENT);
    }
    gdn_model_params mp;
    mp.size = 0;
    gdn_model* m = nullptr;
    CHECK(gdn_model_load(test::fixture_model("qwen35_tied").c_str(), &mp, &m) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(m == nullptr);
  }
  SECTION("a newer caller: zero tail accepted, a set unknown field refused") {
    struct Newer {
      gdn_context_params known;
      std::int32_t future_option;
      std::int32_t pad;
    } n;
    n.known.size = sizeof n;
    REQUIRE(gdn_context_params_init(&n.known) == GDN_STATUS_OK);
    CHECK(n.known.size == sizeof n);
    CHECK(n.future_option == 0);  // the initialiser zeroes what it does not know
    n.known.max_sequences = 2;
    REQUIRE(gdn_context_create(cm.m, &n.known, &ctx) == GDN_STATUS_OK);
    gdn_context_memory mem;
    mem.size = sizeof mem;
    REQUIRE(gdn_context_get_memory(ctx, &mem) == GDN_STATUS_OK);
    gdn_context_free(ctx);
    ctx = nullptr;
    n.future_option = 1;
    CHECK(gdn_context_create(cm.m, &n.known, &ctx) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("does not know"));
    CHECK(ctx == nullptr);
  }
  SECTION("NULL params mean defaults") {
    REQUIRE(gdn_context_create(cm.m, nullptr, &ctx) == GDN_STATUS_OK);
    gdn_context_free(ctx);
    gdn_model* m = nullptr;
    REQUIRE(gdn_model_load(test::fixture_model("qwen35_tied").c_str(), nullptr, &m) == GDN_STATUS_OK);
    gdn_model_free(m);
  }
  SECTION("enum values out of range") {
    gdn_context_params q = small_c_params();
    q.state_dtype = static_cast<gdn_state_dtype>(7);
    CHECK(gdn_context_create(cm.m, &q, &ctx) == GDN_STATUS_INVALID_ARGUMENT);
    q = small_c_params();
    q.backend = static_cast<gdn_backend>(5);
    CHECK(gdn_context_create(cm.m, &q, &ctx) == GDN_STATUS_INVALID_ARGUMENT);
    q = small_c_params();
    q.max_sequences = 0;
    CHECK(gdn_context_create(cm.m, &q, &ctx) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(ctx == nullptr);
  }
  SECTION("bf16 state through the C ABI is smaller") {
    gdn_context_params q = small_c_params(1);
    q.state_dtype = GDN_STATE_DTYPE_BF16;
    CContext a(cm.m, small_c_params(1)), b(cm.m, q);
    gdn_context_memory ma, mb;
    ma.size = mb.size = sizeof ma;
    REQUIRE(gdn_context_get_memory(a.c, &ma) == GDN_STATUS_OK);
    REQUIRE(gdn_context_get_memory(b.c, &mb) == GDN_STATUS_OK);
    CHECK(mb.gdn_state_bytes_per_sequence < ma.gdn_state_bytes_per_sequence);
  }
}

TEST_CASE("NULL and foreign handles are refused, never dereferenced", "[capi]") {
  CModel cm("qwen35_tied");
  CContext cc(cm.m, small_c_params());
  CBatch cb;
  gdn_model* m = nullptr;
  gdn_context* c = nullptr;
  gdn_batch* b = nullptr;
  gdn_seq_id s = 0;
  std::int64_t n = 0;
  const float* p = nullptr;
  float buf[4];
  gdn_model_config cfg;
  cfg.size = sizeof cfg;
  gdn_context_memory mem;
  mem.size = sizeof mem;
  const Token t = 1;

  const auto refused = [](gdn_status st) {
    CHECK(st == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(!last_error().empty());
  };
  refused(gdn_model_load(nullptr, nullptr, &m));
  refused(gdn_model_load(test::fixture_model("qwen35_tied").c_str(), nullptr, nullptr));
  refused(gdn_model_get_config(nullptr, &cfg));
  refused(gdn_model_get_config(cm.m, nullptr));
  refused(gdn_model_params_init(nullptr));
  refused(gdn_context_params_init(nullptr));
  refused(gdn_context_create(nullptr, nullptr, &c));
  refused(gdn_context_create(cm.m, nullptr, nullptr));
  refused(gdn_context_get_memory(nullptr, &mem));
  refused(gdn_seq_create(nullptr, &s));
  refused(gdn_seq_create(cc.c, nullptr));
  refused(gdn_seq_reset(nullptr, 0));
  refused(gdn_seq_free(nullptr, 0));
  refused(gdn_seq_length(nullptr, 0, &n));
  refused(gdn_seq_mtp_length(nullptr, 0, &n));
  refused(gdn_batch_init(1, 1, nullptr));
  refused(gdn_batch_init(-1, 1, &b));
  refused(gdn_batch_clear(nullptr));
  refused(gdn_batch_add(nullptr, 0, &t, 1, GDN_LOGITS_LAST, 0, nullptr));
  refused(gdn_batch_add(cb.b, 0, nullptr, 1, GDN_LOGITS_LAST, 0, nullptr));
  refused(gdn_batch_add(cb.b, 0, &t, -1, GDN_LOGITS_LAST, 0, nullptr));
  refused(gdn_batch_add(cb.b, 0, &t, 1, static_cast<gdn_logits_mode>(9), 0, nullptr));
  refused(gdn_batch_add(cb.b, 0, &t, 1, GDN_LOGITS_LAST, 1u << 7, nullptr));
  refused(gdn_batch_size(nullptr, &n, &n));
  refused(gdn_context_step(nullptr, cb.b));
  refused(gdn_context_step(cc.c, nullptr));
  refused(gdn_context_step_mtp(nullptr, cb.b, nullptr, 0));
  refused(gdn_context_step_mtp(cc.c, nullptr, nullptr, 0));
  refused(gdn_context_n_outputs(nullptr, &n));
  refused(gdn_context_get_logits(nullptr, 0, &p));
  refused(gdn_context_get_logits(cc.c, 0, nullptr));
  refused(gdn_context_copy_logits(nullptr, 0, 0, buf, 4));
  refused(gdn_context_get_hidden(nullptr, 0, &p));
  refused(gdn_context_copy_hidden(nullptr, 0, 0, buf, 4));
  CHECK(!gdn_seq_is_valid(nullptr, 0));

  // A handle of one type passed as another (all are void* to ctypes).
  refused(gdn_model_get_config(reinterpret_cast<gdn_model*>(cc.c), &cfg));
  CHECK_THAT(last_error(), Catch::Contains("not a live model handle"));
  refused(gdn_context_step(reinterpret_cast<gdn_context*>(cm.m), cb.b));
  refused(gdn_context_step(cc.c, reinterpret_cast<gdn_batch*>(cc.c)));

  // Outputs are untouched on failure.
  CHECK(m == nullptr);
  CHECK(c == nullptr);
  CHECK(b == nullptr);
  CHECK(p == nullptr);

  // Freeing NULL is a no-op.
  gdn_model_free(nullptr);
  gdn_context_free(nullptr);
  gdn_batch_free(nullptr);
}

TEST_CASE("statuses and messages of the C++ errors come through the C ABI", "[capi]") {
  gdn_model* m = nullptr;
  CHECK(gdn_model_load("/nonexistent/checkpoint", nullptr, &m) == GDN_STATUS_IO_ERROR);
  CHECK_THAT(last_error(), Catch::StartsWith("gdn_model_load: ") && Catch::Contains("/nonexistent/checkpoint"));
  CHECK(m == nullptr);

  CModel cm("qwen35_tied");
  gdn_model_config cfg;
  cfg.size = sizeof cfg;
  REQUIRE(gdn_model_get_config(cm.m, &cfg) == GDN_STATUS_OK);
  CHECK(last_error().empty());  // success clears
  CContext cc(cm.m, small_c_params(2));
  CBatch cb;
  gdn_seq_id a = 0, b = 0, c = 0;
  REQUIRE(gdn_seq_create(cc.c, &a) == GDN_STATUS_OK);
  REQUIRE(gdn_seq_create(cc.c, &b) == GDN_STATUS_OK);
  CHECK(gdn_seq_create(cc.c, &c) == GDN_STATUS_OUT_OF_CAPACITY);
  CHECK_THAT(last_error(), Catch::Contains("slots"));

  const std::vector<Token> prompt = {1, 2, 3};
  REQUIRE(gdn_batch_add(cb.b, a, prompt.data(), 3, GDN_LOGITS_LAST, 0, nullptr) == GDN_STATUS_OK);
  REQUIRE(gdn_context_step(cc.c, cb.b) == GDN_STATUS_OK);
  std::int64_t len = 0;
  REQUIRE(gdn_seq_length(cc.c, a, &len) == GDN_STATUS_OK);
  CHECK(len == 3);

  SECTION("invalid token: the whole step is refused, nothing changes") {
    const Token bad[] = {5, cfg.vocab_size};
    REQUIRE(gdn_batch_clear(cb.b) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(cb.b, a, prompt.data(), 1, GDN_LOGITS_LAST, 0, nullptr) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(cb.b, b, bad, 2, GDN_LOGITS_LAST, 0, nullptr) == GDN_STATUS_OK);
    CHECK(gdn_context_step(cc.c, cb.b) == GDN_STATUS_INVALID_TOKEN);
    CHECK_THAT(last_error(), Catch::StartsWith("gdn_context_step: "));
    REQUIRE(gdn_seq_length(cc.c, a, &len) == GDN_STATUS_OK);
    CHECK(len == 3);
  }
  SECTION("a sequence twice in one batch") {
    REQUIRE(gdn_batch_add(cb.b, a, prompt.data(), 1, GDN_LOGITS_LAST, 0, nullptr) == GDN_STATUS_OK);
    CHECK(gdn_context_step(cc.c, cb.b) == GDN_STATUS_INVALID_ARGUMENT);
  }
  SECTION("context overflow") {
    std::vector<Token> longer(600, 1);
    REQUIRE(gdn_batch_clear(cb.b) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(cb.b, b, longer.data(), 600, GDN_LOGITS_NONE, 0, nullptr) == GDN_STATUS_OK);
    CHECK(gdn_context_step(cc.c, cb.b) == GDN_STATUS_CONTEXT_OVERFLOW);
  }
  SECTION("stale sequence after free; reset clears") {
    REQUIRE(gdn_seq_reset(cc.c, a) == GDN_STATUS_OK);
    REQUIRE(gdn_seq_length(cc.c, a, &len) == GDN_STATUS_OK);
    CHECK(len == 0);
    REQUIRE(gdn_seq_free(cc.c, a) == GDN_STATUS_OK);
    CHECK(!gdn_seq_is_valid(cc.c, a));
    CHECK(gdn_seq_is_valid(cc.c, b));
    CHECK(gdn_seq_length(cc.c, a, &len) == GDN_STATUS_INVALID_SEQUENCE);
    CHECK(gdn_seq_free(cc.c, a) == GDN_STATUS_INVALID_SEQUENCE);
    REQUIRE(gdn_seq_create(cc.c, &c) == GDN_STATUS_OK);  // reuses the slot ...
    CHECK(c != a);                                          // ... under a new handle
    CHECK(gdn_context_step(cc.c, cb.b) == GDN_STATUS_INVALID_SEQUENCE);
  }
  SECTION("output rows out of range, a row without logits, a small buffer") {
    const float* p = nullptr;
    std::int64_t rows = 0;
    REQUIRE(gdn_context_n_outputs(cc.c, &rows) == GDN_STATUS_OK);
    CHECK(rows == 1);
    CHECK(gdn_context_get_logits(cc.c, 1, &p) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(gdn_context_get_logits(cc.c, -1, &p) == GDN_STATUS_INVALID_ARGUMENT);
    std::vector<float> buf(static_cast<std::size_t>(cfg.vocab_size));
    CHECK(gdn_context_copy_logits(cc.c, 0, 1, buf.data(), cfg.vocab_size - 1) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(gdn_context_copy_logits(cc.c, 0, 2, buf.data(), 2 * cfg.vocab_size) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(gdn_context_copy_logits(cc.c, 0, 1, buf.data(), cfg.vocab_size) == GDN_STATUS_OK);
    REQUIRE(gdn_context_get_logits(cc.c, 0, &p) == GDN_STATUS_OK);
    CHECK(std::memcmp(p, buf.data(), buf.size() * sizeof(float)) == 0);

    // hidden rows for every token, logits only for the last: the other rows refuse logits.
    std::int64_t first = -2;
    REQUIRE(gdn_batch_clear(cb.b) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(cb.b, b, prompt.data(), 3, GDN_LOGITS_LAST, GDN_BATCH_HIDDEN_ALL, &first) == GDN_STATUS_OK);
    CHECK(first == 0);
    std::int64_t tokens = 0;
    REQUIRE(gdn_batch_size(cb.b, &tokens, &rows) == GDN_STATUS_OK);
    CHECK(tokens == 3);
    CHECK(rows == 3);
    REQUIRE(gdn_context_step(cc.c, cb.b) == GDN_STATUS_OK);
    CHECK(gdn_context_get_hidden(cc.c, 0, &p) == GDN_STATUS_OK);
    CHECK(gdn_context_get_logits(cc.c, 0, &p) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(gdn_context_get_logits(cc.c, 2, &p) == GDN_STATUS_OK);
    std::vector<float> h(3 * static_cast<std::size_t>(cfg.hidden_size));
    CHECK(gdn_context_copy_hidden(cc.c, 0, 3, h.data(), static_cast<std::int64_t>(h.size())) == GDN_STATUS_OK);
  }
  SECTION("no MTP head") {
    std::vector<float> hidden(static_cast<std::size_t>(cfg.hidden_size), 0.0f);
    REQUIRE(gdn_batch_clear(cb.b) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(cb.b, a, prompt.data(), 1, GDN_LOGITS_LAST, 0, nullptr) == GDN_STATUS_OK);
    CHECK(gdn_context_step_mtp(cc.c, cb.b, hidden.data(), 1) == GDN_STATUS_UNSUPPORTED_MODEL);
  }
}

TEST_CASE("the last error is per thread", "[capi]") {
  gdn_model* m = nullptr;
  REQUIRE(gdn_model_load(nullptr, nullptr, &m) == GDN_STATUS_INVALID_ARGUMENT);
  const std::string mine = last_error();
  REQUIRE(!mine.empty());
  std::string other_before, other_after;
  std::thread t([&] {
    other_before = gdn_last_error();
    gdn_context_step(nullptr, nullptr);
    other_after = gdn_last_error();
  });
  t.join();
  CHECK(other_before.empty());
  CHECK_THAT(other_after, Catch::StartsWith("gdn_context_step: "));
  CHECK(last_error() == mine);
}

TEST_CASE("batched decode and MTP through the C ABI equal the C++ API", "[capi][mtp]") {
  CModel cm("qwen35_cond_mtp");
  gdn_model_config cfg;
  cfg.size = sizeof cfg;
  REQUIRE(gdn_model_get_config(cm.m, &cfg) == GDN_STATUS_OK);
  const auto V = static_cast<std::size_t>(cfg.vocab_size), H = static_cast<std::size_t>(cfg.hidden_size);
  test::Reference ref("qwen35_cond_mtp");
  const std::vector<std::vector<Token>> prompts = {ref.tokens("prompt1.tokens"), ref.tokens("prompt4.tokens")};

  // C++: both prompts in one step (hidden rows for every token), 3 decode steps together, MTP.
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  Context ctx(model, small_cpp_params(2));
  std::vector<float> cpp;
  std::vector<SeqId> ids;
  Batch b;
  for (const auto& p : prompts) {
    ids.push_back(ctx.create_sequence());
    b.add(ids.back(), p, LogitsFor::last, true);
  }
  ctx.step(b);
  const auto hidden_rows = ctx.output_rows();
  std::vector<float> hidden;
  for (std::int64_t r = 0; r < hidden_rows; ++r) hidden.insert(hidden.end(), ctx.hidden(r).begin(), ctx.hidden(r).end());
  for (std::size_t e = 0; e < ids.size(); ++e) cpp.insert(cpp.end(), ctx.logits(b.last_row(e)).begin(), ctx.logits(b.last_row(e)).end());
  for (const Token t : {7, 8, 9}) {
    b.clear();
    for (const SeqId s : ids) b.add(s, t);
    ctx.step(b);
    for (std::size_t e = 0; e < ids.size(); ++e) cpp.insert(cpp.end(), ctx.logits(b.last_row(e)).begin(), ctx.logits(b.last_row(e)).end());
  }
  // MTP over the first prompt's pairs (h_t, x_{t+1}).
  const auto& p0 = prompts[0];
  Batch mb;
  mb.add(ids[0], std::span(p0).subspan(1), LogitsFor::all);
  ctx.step_mtp(mb, std::span(hidden).first((p0.size() - 1) * H));
  std::vector<float> cpp_mtp;
  for (std::int64_t r = 0; r < ctx.output_rows(); ++r) cpp_mtp.insert(cpp_mtp.end(), ctx.logits(r).begin(), ctx.logits(r).end());

  // The same through the C ABI.
  CContext cc(cm.m, small_c_params(2));
  CBatch cb;
  std::vector<float> c;
  gdn_seq_id cid[2];
  std::int64_t first[2], rows = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(gdn_seq_create(cc.c, &cid[i]) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(cb.b, cid[i], prompts[i].data(), static_cast<std::int64_t>(prompts[i].size()), GDN_LOGITS_LAST,
                          GDN_BATCH_HIDDEN_ALL, &first[i]) == GDN_STATUS_OK);
  }
  CHECK(first[0] == 0);
  CHECK(first[1] == static_cast<std::int64_t>(prompts[0].size()));
  REQUIRE(gdn_context_step(cc.c, cb.b) == GDN_STATUS_OK);
  REQUIRE(gdn_context_n_outputs(cc.c, &rows) == GDN_STATUS_OK);
  REQUIRE(rows == hidden_rows);
  std::vector<float> c_hidden(static_cast<std::size_t>(rows) * H);
  REQUIRE(gdn_context_copy_hidden(cc.c, 0, rows, c_hidden.data(), static_cast<std::int64_t>(c_hidden.size())) ==
          GDN_STATUS_OK);
  CHECK(std::memcmp(c_hidden.data(), hidden.data(), hidden.size() * sizeof(float)) == 0);
  const auto take = [&](std::int64_t row) {
    const float* p = nullptr;
    REQUIRE(gdn_context_get_logits(cc.c, row, &p) == GDN_STATUS_OK);
    c.insert(c.end(), p, p + V);
  };
  for (std::size_t i = 0; i < 2; ++i) take(first[i] + static_cast<std::int64_t>(prompts[i].size()) - 1);
  for (const Token t : {7, 8, 9}) {
    REQUIRE(gdn_batch_clear(cb.b) == GDN_STATUS_OK);
    for (std::size_t i = 0; i < 2; ++i) REQUIRE(gdn_batch_add(cb.b, cid[i], &t, 1, GDN_LOGITS_LAST, 0, &first[i]) == GDN_STATUS_OK);
    CHECK(first[1] == 1);
    REQUIRE(gdn_context_step(cc.c, cb.b) == GDN_STATUS_OK);
    for (std::size_t i = 0; i < 2; ++i) take(first[i]);
  }
  REQUIRE(c.size() == cpp.size());
  CHECK(std::memcmp(c.data(), cpp.data(), c.size() * sizeof(float)) == 0);

  REQUIRE(gdn_batch_clear(cb.b) == GDN_STATUS_OK);
  REQUIRE(gdn_batch_add(cb.b, cid[0], p0.data() + 1, static_cast<std::int64_t>(p0.size() - 1), GDN_LOGITS_ALL, 0, nullptr) ==
          GDN_STATUS_OK);
  CHECK(gdn_context_step_mtp(cc.c, cb.b, c_hidden.data(), static_cast<std::int64_t>(p0.size())) ==
        GDN_STATUS_INVALID_ARGUMENT);  // one row too many
  REQUIRE(gdn_context_step_mtp(cc.c, cb.b, c_hidden.data(), static_cast<std::int64_t>(p0.size() - 1)) == GDN_STATUS_OK);
  std::vector<float> c_mtp(cpp_mtp.size());
  REQUIRE(gdn_context_copy_logits(cc.c, 0, static_cast<std::int64_t>(p0.size() - 1), c_mtp.data(),
                                  static_cast<std::int64_t>(c_mtp.size())) == GDN_STATUS_OK);
  CHECK(std::memcmp(c_mtp.data(), cpp_mtp.data(), c_mtp.size() * sizeof(float)) == 0);
  std::int64_t mtp_len = 0;
  REQUIRE(gdn_seq_mtp_length(cc.c, cid[0], &mtp_len) == GDN_STATUS_OK);
  CHECK(mtp_len == static_cast<std::int64_t>(p0.size() - 1));
  const auto expect = ref.floats("prompt1.mtp_logits");
  CHECK(test::max_abs_diff(c_mtp.data(), expect.data(), expect.size()) <= logit_tolerance);
}

TEST_CASE("a context outlives gdn_model_free; memory figures equal the C++ ones", "[capi]") {
  gdn_model* m = nullptr;
  REQUIRE(gdn_model_load(test::fixture_model("qwen35_tied").c_str(), nullptr, &m) == GDN_STATUS_OK);
  gdn_context_params p = small_c_params(2);
  gdn_context* c = nullptr;
  REQUIRE(gdn_context_create(m, &p, &c) == GDN_STATUS_OK);
  gdn_model_free(m);  // the context keeps the weights alive

  test::Reference ref("qwen35_tied");
  const auto tokens = ref.tokens("prompt2.tokens");
  const auto expect = ref.floats("prompt2.logits");
  const auto got = c_prefill(c, tokens, 256);
  CHECK(test::max_abs_diff(got.data(), expect.data(), expect.size()) <= logit_tolerance);

  auto model = Model::load(test::fixture_model("qwen35_tied"));
  Context ctx(model, small_cpp_params(2));
  gdn_seq_id s = 0;
  REQUIRE(gdn_seq_create(c, &s) == GDN_STATUS_OK);
  ctx.create_sequence();
  gdn_context_memory mem;
  mem.size = sizeof mem;
  REQUIRE(gdn_context_get_memory(c, &mem) == GDN_STATUS_OK);
  CHECK(mem.live_sequences == 1);
  CHECK(mem.gdn_state_bytes_per_sequence == ctx.gdn_state_bytes_per_sequence());
  CHECK(mem.kv_bytes_per_token == ctx.kv_bytes_per_token());
  CHECK(mem.kv_free_pages == ctx.kv_free_pages());
  gdn_context_free(c);
}

TEST_CASE("state control through the C ABI is exact", "[capi][state]") {
  CModel cm("qwen35_tied");
  test::Reference ref("qwen35_tied");
  const auto prompt = ref.tokens("prompt2.tokens");
  const std::vector<Token> cont = {11, 22, 33, 44};
  const std::int64_t n = static_cast<std::int64_t>(cont.size()), V = 256;
  gdn_context_params p = small_c_params(3);
  p.max_rollback_tokens = 8;
  CContext cc(cm.m, p);
  CBatch cb;
  const auto run = [&](gdn_seq_id s, const Token* tokens, std::int64_t count) {
    REQUIRE(gdn_batch_clear(cb.b) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(cb.b, s, tokens, count, GDN_LOGITS_ALL, 0, nullptr) == GDN_STATUS_OK);
    REQUIRE(gdn_context_step(cc.c, cb.b) == GDN_STATUS_OK);
    std::vector<float> out(static_cast<std::size_t>(count * V));
    REQUIRE(gdn_context_copy_logits(cc.c, 0, count, out.data(), count * V) == GDN_STATUS_OK);
    return out;
  };
  gdn_seq_id s = 0, from = 0, loaded = 0;
  gdn_snapshot_id snap = 0;
  std::int64_t len = 0, undo = 0;
  REQUIRE(gdn_seq_create(cc.c, &s) == GDN_STATUS_OK);
  run(s, prompt.data(), static_cast<std::int64_t>(prompt.size()));
  REQUIRE(gdn_seq_snapshot(cc.c, s, &snap) == GDN_STATUS_OK);
  const auto la = run(s, cont.data(), n);

  // Roll the 4-token step back to 1 token, then feed the other 3 again: the same logits.
  REQUIRE(gdn_seq_rollbackable_tokens(cc.c, s, &undo) == GDN_STATUS_OK);
  CHECK(undo == n);
  REQUIRE(gdn_seq_rollback(cc.c, s, 1) == GDN_STATUS_OK);
  REQUIRE(gdn_seq_length(cc.c, s, &len) == GDN_STATUS_OK);
  CHECK(len == static_cast<std::int64_t>(prompt.size()) + 1);
  const auto lb = run(s, cont.data() + 1, n - 1);
  CHECK(std::memcmp(lb.data(), la.data() + V, lb.size() * sizeof(float)) == 0);
  CHECK(gdn_seq_rollback(cc.c, s, 9) == GDN_STATUS_INVALID_ARGUMENT);

  // Restore, and a new sequence from the snapshot: both continue exactly as the first time.
  REQUIRE(gdn_seq_restore(cc.c, s, snap) == GDN_STATUS_OK);
  CHECK(run(s, cont.data(), n) == la);
  REQUIRE(gdn_seq_create_from(cc.c, snap, &from) == GDN_STATUS_OK);
  CHECK(run(from, cont.data(), n) == la);
  REQUIRE(gdn_snapshot_free(cc.c, snap) == GDN_STATUS_OK);
  CHECK(gdn_seq_restore(cc.c, s, snap) != GDN_STATUS_OK);

  // Save, free, load: the loaded sequence continues like the saved one.
  const std::string path = std::string(GDN_BINARY_DIR) + "/test_capi_state.gdnstate";
  REQUIRE(gdn_seq_save(cc.c, from, path.c_str()) == GDN_STATUS_OK);
  gdn_seq_id fork = 0;
  REQUIRE(gdn_seq_fork(cc.c, from, &fork) == GDN_STATUS_OK);
  const auto lf = run(fork, cont.data(), 1);
  REQUIRE(gdn_seq_free(cc.c, fork) == GDN_STATUS_OK);
  REQUIRE(gdn_seq_free(cc.c, from) == GDN_STATUS_OK);
  REQUIRE(gdn_seq_load(cc.c, path.c_str(), &loaded) == GDN_STATUS_OK);
  REQUIRE(gdn_seq_length(cc.c, loaded, &len) == GDN_STATUS_OK);
  CHECK(len == static_cast<std::int64_t>(prompt.size()) + n);
  CHECK(run(loaded, cont.data(), 1) == lf);
  CHECK(gdn_seq_load(cc.c, "/nonexistent/state", &loaded) == GDN_STATUS_IO_ERROR);
  std::remove(path.c_str());

  gdn_context_memory mem;
  mem.size = sizeof mem;
  REQUIRE(gdn_context_get_memory(cc.c, &mem) == GDN_STATUS_OK);
  CHECK(mem.snapshot_bytes > 0);
  CHECK(mem.rollback_bytes_per_sequence > 0);
}
