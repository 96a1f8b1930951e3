// The C ABI (capi/gdn.h) against the C++ API it wraps: the same logits bit for bit, every status
// code and message, NULL and foreign handles, struct sizes (older, newer, garbage), the
// thread-local last error; and the text API (tokenizer, chat template, sampling, generation, MTP
// speculative decoding) against gdn::Tokenizer, gdn::Sampler, gdn::Generator and
// gdn::SpeculativeDecoder on the real Qwen tokenizer and the trained models/gdn-tiny.
// tests/test_capi_c.c drives the shared library from plain C.

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gdn.h"
#include "backend/cpu/linear.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/model/memory_plan.hpp"
#include "safetensors_writer.hpp"
#include "gdn/runtime/generator.hpp"
#include "gdn/text/chat_template.hpp"
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

std::int32_t vocab_size(const gdn_model* m) {
  gdn_model_config cfg;
  cfg.size = sizeof cfg;
  REQUIRE(gdn_model_get_config(m, &cfg) == GDN_STATUS_OK);
  return cfg.vocab_size;
}

// gdn_context_create refuses `p` with INVALID_ARGUMENT, leaves no context and says `why`.
void check_refused(gdn_model* m, const gdn_context_params& p, const char* why) {
  gdn_context* c = nullptr;
  CHECK(gdn_context_create(m, &p, &c) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK(c == nullptr);
  CHECK_THAT(last_error(), Catch::Contains(why));
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
  // A fixture's name, or an absolute path.
  explicit CModel(const std::string& name) {
    const std::string path = name.front() == '/' ? name : test::fixture_model(name);
    REQUIRE(gdn_model_load(path.c_str(), nullptr, &m) == GDN_STATUS_OK);
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
  for (int s = 0; s <= static_cast<int>(Status::busy); ++s)
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

TEST_CASE("weights packed for the CPU kernel or used in place: bit-identical logits", "[capi][fixtures]") {
  // On an AMX CPU the default load copies the projections into the kernel's tile order; in place
  // they are read from the mapping. A caller compiled before weights_in_place existed (the older,
  // smaller struct) gets the default. All three must give the same logits bit for bit.
  const std::string path = test::fixture_model("qwen35_cond_mtp");
  test::Reference ref("qwen35_cond_mtp");
  const auto tokens = ref.tokens("prompt5.tokens");
  std::vector<std::vector<float>> logits;
  for (int mode = 0; mode < 3; ++mode) {
    gdn_model_params mp = gdn_model_default_params();
    if (mode == 1) mp.weights_in_place = 1;
    if (mode == 2) mp.size = static_cast<std::uint32_t>(offsetof(gdn_model_params, weights_in_place));
    gdn_model* m = nullptr;
    REQUIRE(gdn_model_load(path.c_str(), &mp, &m) == GDN_STATUS_OK);
    gdn_model_config cfg;
    cfg.size = sizeof cfg;
    REQUIRE(gdn_model_get_config(m, &cfg) == GDN_STATUS_OK);
    {
      CContext cc(m, small_c_params());
      logits.push_back(c_prefill(cc.c, tokens, cfg.vocab_size));
    }
    gdn_model_free(m);
  }
  CHECK(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0);
  CHECK(std::memcmp(logits[0].data(), logits[2].data(), logits[0].size() * sizeof(float)) == 0);
  const auto expect = ref.floats("prompt5.logits");
  CHECK(test::max_abs_diff(logits[0].data(), expect.data(), expect.size()) <= logit_tolerance);
  const bool images = cpu::weight_image_layout(cpu::linear_kernel()) != cpu::WeightImage::none;
  CHECK((Model::load(path)->packed_bytes() > 0) == images);
  ModelParams in_place;
  in_place.weights = WeightPlacement::in_place;
  CHECK(Model::load(path, in_place)->packed_bytes() == 0);
  if (!images) WARN("this CPU's kernel reads weights in place (no AMX, no AVX-512): both loads used the weights in place");
}

TEST_CASE("the lm_head's quantised format through C", "[capi][fixtures][quant]") {
  const std::string fixture = test::fixture_model("qwen35_cond_mtp");
  test::TempDir dir("capi_lm_head");
  const std::string path = dir.str() + "/m";
  std::filesystem::copy(fixture, path, std::filesystem::copy_options::recursive);
  test::Reference ref("qwen35_cond_mtp");
  const auto tokens = ref.tokens("prompt5.tokens");
  // Logits of a load with these params (size: the caller's struct size).
  const auto run = [&](gdn_weight_quant q, gdn_lm_head_quant lm, std::uint32_t size, gdn_weight_placement w) {
    gdn_model_params mp = gdn_model_default_params();
    mp.quant = q;
    mp.lm_head_quant = lm;
    mp.weights = w;
    mp.size = size;
    gdn_model* m = nullptr;
    REQUIRE(gdn_model_load(path.c_str(), &mp, &m) == GDN_STATUS_OK);
    std::vector<float> out;
    {
      CContext cc(m, small_c_params());
      out = c_prefill(cc.c, tokens, 256);
    }
    gdn_model_free(m);
    return out;
  };
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const std::uint32_t full = sizeof(gdn_model_params);
  // A caller compiled before lm_head_quant gets AUTO: q8_0 under Q4_0.
  const auto before = static_cast<std::uint32_t>(offsetof(gdn_model_params, lm_head_quant));
  const auto automatic = run(GDN_QUANT_Q4_0, GDN_LM_HEAD_QUANT_AUTO, full, GDN_WEIGHTS_PACKED);
  CHECK(same(run(GDN_QUANT_Q4_0, GDN_LM_HEAD_QUANT_AUTO, before, GDN_WEIGHTS_PACKED), automatic));
  CHECK(same(run(GDN_QUANT_Q4_0, GDN_LM_HEAD_QUANT_Q8_0, full, GDN_WEIGHTS_PACKED), automatic));
  const auto all_q4 = run(GDN_QUANT_Q4_0, GDN_LM_HEAD_QUANT_Q4_0, full, GDN_WEIGHTS_PACKED);
  CHECK_FALSE(same(all_q4, automatic));
  // Each policy's image, written through C where a load with those params looks, maps to the same logits.
  gdn_model_params wp = gdn_model_default_params();
  wp.quant = GDN_QUANT_Q4_0;
  REQUIRE(gdn_packed_image_write_params(path.c_str(), nullptr, &wp) == GDN_STATUS_OK);
  CHECK(std::filesystem::exists(path + "/gdn-packed.q4_0.gdnimg"));
  wp.lm_head_quant = GDN_LM_HEAD_QUANT_Q4_0;
  REQUIRE(gdn_packed_image_write_params(path.c_str(), nullptr, &wp) == GDN_STATUS_OK);
  CHECK(std::filesystem::exists(path + "/gdn-packed.q4_0.lm_head-q4_0.gdnimg"));
  CHECK(same(run(GDN_QUANT_Q4_0, GDN_LM_HEAD_QUANT_AUTO, full, GDN_WEIGHTS_IMAGE), automatic));
  CHECK(same(run(GDN_QUANT_Q4_0, GDN_LM_HEAD_QUANT_Q4_0, full, GDN_WEIGHTS_IMAGE), all_q4));
  // Q4_K: its own format (not Q4_0's logits), its own image, mapped == packed.
  const auto q4k = run(GDN_QUANT_Q4_K, GDN_LM_HEAD_QUANT_AUTO, full, GDN_WEIGHTS_PACKED);
  CHECK_FALSE(same(q4k, automatic));
  wp = gdn_model_default_params();
  wp.quant = GDN_QUANT_Q4_K;
  REQUIRE(gdn_packed_image_write_params(path.c_str(), nullptr, &wp) == GDN_STATUS_OK);
  CHECK(std::filesystem::exists(path + "/gdn-packed.q4_k.gdnimg"));
  CHECK(same(run(GDN_QUANT_Q4_K, GDN_LM_HEAD_QUANT_AUTO, full, GDN_WEIGHTS_IMAGE), q4k));
  // Q4_K_M: Q4_K with 8-bit projections where llama.cpp's Q4_K_M gives more bits: other logits again.
  CHECK_FALSE(same(run(GDN_QUANT_Q4_K_M, GDN_LM_HEAD_QUANT_AUTO, full, GDN_WEIGHTS_PACKED), q4k));
  // The image of the other policy, named explicitly, is refused (never read as this one).
  gdn_model_params mp = gdn_model_default_params();
  mp.quant = GDN_QUANT_Q4_0;
  mp.weights = GDN_WEIGHTS_IMAGE;
  const std::string other = path + "/gdn-packed.q4_0.lm_head-q4_0.gdnimg";
  mp.packed_image = other.c_str();
  gdn_model* m = nullptr;
  CHECK(gdn_model_load(path.c_str(), &mp, &m) == GDN_STATUS_INVALID_FILE);
  CHECK_THAT(gdn_last_error(), Catch::Contains("lm_head_quant q8_0"));
  // Bad values name the field.
  mp = gdn_model_default_params();
  mp.lm_head_quant = GDN_LM_HEAD_QUANT_Q8_0;  // without a quant
  CHECK(gdn_model_load(path.c_str(), &mp, &m) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(gdn_last_error(), Catch::Contains("lm_head_quant q8_0 needs a quant"));
  mp.quant = GDN_QUANT_Q4_0;
  mp.lm_head_quant = static_cast<gdn_lm_head_quant>(4);
  CHECK(gdn_model_load(path.c_str(), &mp, &m) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(gdn_last_error(), Catch::Contains("lm_head_quant 4 is not a gdn_lm_head_quant"));
  CHECK(gdn_packed_image_write_params(path.c_str(), nullptr, &mp) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK(m == nullptr);
}

TEST_CASE("weight placement, packed images and memory plans through C", "[capi][fixtures]") {
  const std::string fixture = test::fixture_model("qwen35_cond_mtp");
  test::TempDir dir("capi_image");
  const std::string path = dir.str() + "/m";
  std::filesystem::copy(fixture, path, std::filesystem::copy_options::recursive);
  const bool images = cpu::weight_image_layout(cpu::linear_kernel()) != cpu::WeightImage::none;
  // Each placement; an older caller's struct (before weights / packed_image) gets automatic.
  const std::string image = path + "/my.gdnimg";
  if (images) {
    REQUIRE(gdn_packed_image_write(path.c_str(), image.c_str()) == GDN_STATUS_OK);
  } else {
    CHECK(gdn_packed_image_write(path.c_str(), image.c_str()) == GDN_STATUS_UNSUPPORTED_MODEL);
  }
  CHECK(gdn_packed_image_write(nullptr, nullptr) == GDN_STATUS_INVALID_ARGUMENT);
  struct Case {
    gdn_weight_placement ask;
    const char* image;
    std::uint32_t size;
    gdn_weight_placement want;
  };
  const auto old_size = static_cast<std::uint32_t>(offsetof(gdn_model_params, weights));
  const std::vector<Case> cases = {
      {GDN_WEIGHTS_AUTOMATIC, nullptr, sizeof(gdn_model_params), images ? GDN_WEIGHTS_PACKED : GDN_WEIGHTS_IN_PLACE},
      {GDN_WEIGHTS_AUTOMATIC, image.c_str(), sizeof(gdn_model_params), images ? GDN_WEIGHTS_IMAGE : GDN_WEIGHTS_IN_PLACE},
      {GDN_WEIGHTS_IN_PLACE, image.c_str(), sizeof(gdn_model_params), GDN_WEIGHTS_IN_PLACE},
      {GDN_WEIGHTS_PACKED, nullptr, sizeof(gdn_model_params), images ? GDN_WEIGHTS_PACKED : GDN_WEIGHTS_IN_PLACE},
      {GDN_WEIGHTS_AUTOMATIC, nullptr, old_size, images ? GDN_WEIGHTS_PACKED : GDN_WEIGHTS_IN_PLACE},
  };
  std::vector<std::vector<float>> logits;
  test::Reference ref("qwen35_cond_mtp");
  const auto tokens = ref.tokens("prompt5.tokens");
  for (const Case& c : cases) {
    gdn_model_params mp = gdn_model_default_params();
    mp.weights = c.ask;
    mp.packed_image = c.image;
    mp.size = c.size;
    gdn_model* m = nullptr;
    REQUIRE(gdn_model_load(path.c_str(), &mp, &m) == GDN_STATUS_OK);
    gdn_weight_placement got = GDN_WEIGHTS_AUTOMATIC;
    REQUIRE(gdn_model_get_weight_placement(m, &got) == GDN_STATUS_OK);
    CHECK(got == c.want);
    {
      CContext cc(m, small_c_params());
      logits.push_back(c_prefill(cc.c, tokens, 256));
    }
    gdn_model_free(m);
  }
  for (const auto& l : logits) CHECK(std::memcmp(l.data(), logits[0].data(), l.size() * sizeof(float)) == 0);
  gdn_model_params bad = gdn_model_default_params();
  bad.weights = static_cast<gdn_weight_placement>(9);
  gdn_model* m = nullptr;
  CHECK(gdn_model_load(path.c_str(), &bad, &m) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(gdn_last_error(), Catch::Contains("is not a gdn_weight_placement"));

  // The plan through C equals the C++ one.
  gdn_context_params cp = small_c_params();
  gdn_memory_plan plan;
  plan.size = sizeof plan;
  REQUIRE(gdn_memory_plan_compute(path.c_str(), nullptr, &cp, &plan) == GDN_STATUS_OK);
  ContextParams p;
  p.max_sequences = cp.max_sequences;
  p.max_context = cp.max_context;
  p.kv_page_size = cp.kv_page_size;
  p.max_batch_tokens = cp.max_batch_tokens;
  p.max_logits_rows = cp.max_logits_rows;
  p.threads = cp.threads;
  const MemoryPlan cpp = plan_memory(path, p);
  CHECK(plan.context_bytes == cpp.context_bytes);
  CHECK(plan.gdn_recurrent_bytes_per_sequence == cpp.gdn_recurrent_bytes_per_sequence);
  CHECK(plan.kv_bytes_per_token == cpp.kv_bytes_per_token);
  CHECK(plan.packed_bytes == cpp.packed_bytes);
  CHECK(plan.weights == static_cast<gdn_weight_placement>(static_cast<int>(cpp.weights)));
  CHECK(plan.context_fits);
  plan.size = 8;
  CHECK(gdn_memory_plan_compute(path.c_str(), nullptr, &cp, &plan) == GDN_STATUS_INVALID_ARGUMENT);
  plan.size = sizeof plan;
  CHECK(gdn_memory_plan_compute("/nonexistent", nullptr, nullptr, &plan) == GDN_STATUS_IO_ERROR);
}

TEST_CASE("matmul_input through C: bf16 equals the C++ context bit for bit; an older struct gets float32", "[capi][fixtures]") {
  CModel cm("qwen35_cond_mtp");
  test::Reference ref("qwen35_cond_mtp");
  const auto tokens = ref.tokens("prompt4.tokens");
  const std::int32_t V = vocab_size(cm.m);
  CHECK(gdn_context_default_params().matmul_input == GDN_MATMUL_INPUT_FLOAT32);
  const auto c_logits = [&](gdn_context_params p) {
    CContext cc(cm.m, p);
    return c_prefill(cc.c, tokens, V);
  };
  gdn_context_params bf = small_c_params();
  bf.matmul_input = GDN_MATMUL_INPUT_BF16;
  gdn_context_params older = small_c_params();
  older.matmul_input = GDN_MATMUL_INPUT_BF16;  // past the older caller's size: never read
  older.size = static_cast<std::uint32_t>(offsetof(gdn_context_params, matmul_input));
  const auto c_bf16 = c_logits(bf), c_old = c_logits(older), c_f32 = c_logits(small_c_params());
  ContextParams cpp = small_cpp_params();
  cpp.matmul_input = MatmulInput::bf16;
  Context ctx(Model::load(test::fixture_model("qwen35_cond_mtp")), cpp);
  const auto cpp_bf16 = test::prefill_logits(ctx, tokens);
  const std::size_t last = c_bf16.size() - static_cast<std::size_t>(V);
  REQUIRE(cpp_bf16.size() == c_bf16.size());
  CHECK(std::memcmp(c_bf16.data(), cpp_bf16.data(), c_bf16.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(c_old.data(), c_f32.data(), c_f32.size() * sizeof(float)) == 0);
  CHECK(test::max_abs_diff(c_bf16.data() + last, c_f32.data() + last, static_cast<std::size_t>(V)) > 0.0f);
  gdn_context_params bad = small_c_params();
  bad.matmul_input = static_cast<gdn_matmul_input>(7);
  check_refused(cm.m, bad, "matmul_input 7");
}

TEST_CASE("kv_dtype through C: bf16 equals the C++ context bit for bit and halves the KV bytes; an older struct gets float32", "[capi][fixtures]") {
  CModel cm("qwen35_cond_mtp");
  test::Reference ref("qwen35_cond_mtp");
  const auto tokens = ref.tokens("prompt4.tokens");
  const std::int32_t V = vocab_size(cm.m);
  CHECK(gdn_context_default_params().kv_dtype == GDN_KV_DTYPE_DEFAULT);
  const auto kv_bytes = [](gdn_context* c) {
    gdn_context_memory m;
    m.size = sizeof m;
    REQUIRE(gdn_context_get_memory(c, &m) == GDN_STATUS_OK);
    return m.kv_bytes_per_token;
  };
  gdn_context_params bf = small_c_params();
  bf.kv_dtype = GDN_KV_DTYPE_BF16;
  gdn_context_params f32 = small_c_params();
  f32.kv_dtype = GDN_KV_DTYPE_F32;
  gdn_context_params older = small_c_params();
  older.kv_dtype = GDN_KV_DTYPE_BF16;  // past the older caller's size: never read
  older.size = static_cast<std::uint32_t>(offsetof(gdn_context_params, kv_dtype));
  CContext c_bf(cm.m, bf), c_f32(cm.m, f32), c_old(cm.m, older), c_def(cm.m, small_c_params());
  CHECK(kv_bytes(c_bf.c) * 2 == kv_bytes(c_f32.c));
  CHECK(kv_bytes(c_old.c) == kv_bytes(c_f32.c));
  CHECK(kv_bytes(c_def.c) == kv_bytes(c_f32.c));  // the CPU default is float32
  const auto l_bf = c_prefill(c_bf.c, tokens, V), l_f32 = c_prefill(c_f32.c, tokens, V);
  const auto l_old = c_prefill(c_old.c, tokens, V);
  ContextParams cpp = small_cpp_params();
  cpp.kv_dtype = DType::bf16;
  Context ctx(Model::load(test::fixture_model("qwen35_cond_mtp")), cpp);
  const auto cpp_bf = test::prefill_logits(ctx, tokens);
  REQUIRE(cpp_bf.size() == l_bf.size());
  CHECK(std::memcmp(l_bf.data(), cpp_bf.data(), l_bf.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(l_old.data(), l_f32.data(), l_f32.size() * sizeof(float)) == 0);
  const std::size_t last = l_bf.size() - static_cast<std::size_t>(V);
  CHECK(test::max_abs_diff(l_bf.data() + last, l_f32.data() + last, static_cast<std::size_t>(V)) > 0.0f);
  gdn_context_params bad = small_c_params();
  bad.kv_dtype = static_cast<gdn_kv_dtype>(9);
  check_refused(cm.m, bad, "kv_dtype 9");
}

TEST_CASE("an output pointer used past a step that grows the output buffer reads stale data, not freed memory", "[capi]") {
  // The contract is "valid until the next step"; a host (or a numpy view) that breaks it must not
  // read freed memory. Under ASan this fails if the outgrown buffer is freed.
  CModel cm("qwen35_tied");
  gdn_model_config cfg;
  cfg.size = sizeof cfg;
  REQUIRE(gdn_model_get_config(cm.m, &cfg) == GDN_STATUS_OK);
  gdn_context_params p = small_c_params(1);
  p.max_logits_rows = 2;
  CContext cc(cm.m, p);
  gdn_seq_id s = 0;
  REQUIRE(gdn_seq_create(cc.c, &s) == GDN_STATUS_OK);
  CBatch b;
  const std::vector<Token> one = {5};
  std::int64_t row = -1;
  REQUIRE(gdn_batch_add(b.b, s, one.data(), 1, GDN_LOGITS_LAST, 0, &row) == GDN_STATUS_OK);
  REQUIRE(gdn_context_step(cc.c, b.b) == GDN_STATUS_OK);
  const float* old = nullptr;
  REQUIRE(gdn_context_get_logits(cc.c, row, &old) == GDN_STATUS_OK);
  const std::vector<float> before(old, old + cfg.vocab_size);
  // 40 rows of logits: past max_logits_rows, so the buffer grows.
  std::vector<Token> many(40);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<Token>(i % 200);
  REQUIRE(gdn_batch_clear(b.b) == GDN_STATUS_OK);
  REQUIRE(gdn_batch_add(b.b, s, many.data(), 40, GDN_LOGITS_ALL, 0, &row) == GDN_STATUS_OK);
  REQUIRE(gdn_context_step(cc.c, b.b) == GDN_STATUS_OK);
  const float* now = nullptr;
  REQUIRE(gdn_context_get_logits(cc.c, 39, &now) == GDN_STATUS_OK);
  CHECK(now != old);
  CHECK(std::memcmp(old, before.data(), before.size() * sizeof(float)) == 0);  // stale, intact
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
  CHECK(gdn_model_default_params().weights_in_place == 0);
  CHECK(gdn_model_default_params().weights == GDN_WEIGHTS_AUTOMATIC);
  CHECK(gdn_model_default_params().packed_image == nullptr);

  CModel cm("qwen35_tied");
  gdn_context* ctx = nullptr;

  SECTION("the CUDA backend where there is no GPU: BACKEND_UNAVAILABLE with the reason") {
    gdn_context_params cp = small_c_params();
    cp.backend = GDN_BACKEND_CUDA;
    CHECK(gdn_context_create(cm.m, &cp, &ctx) == GDN_STATUS_BACKEND_UNAVAILABLE);
    CHECK_THAT(last_error(), Catch::Contains("the CUDA backend is not available"));
    CHECK(ctx == nullptr);
    gdn_model_params mp = gdn_model_default_params();
    mp.backend = GDN_BACKEND_CUDA;
    gdn_model* m = nullptr;
    CHECK(gdn_model_load(test::fixture_model("qwen35_tied").c_str(), &mp, &m) == GDN_STATUS_BACKEND_UNAVAILABLE);
    CHECK(m == nullptr);
  }
  SECTION("wrong size") {
    gdn_context_params bad = small_c_params();
    for (const std::uint32_t size : {0u, 1u, 8u, static_cast<std::uint32_t>(offsetof(gdn_context_params, backend)), 1u << 20}) {
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

// =============================================================================================
// Text generation through the C ABI.

namespace {

const std::string tiny_dir = std::string(GDN_SOURCE_DIR) + "/models/gdn-tiny";

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  gzclose(f);
  if (n < 0) throw std::runtime_error("cannot decompress " + path);
  return out;
}

const std::string& qwen_json() {
  static const std::string json = read_gz(std::string(GDN_SOURCE_DIR) + "/tests/assets/qwen35_tokenizer/tokenizer.json.gz");
  return json;
}

struct CTokenizer {
  gdn_tokenizer* t = nullptr;
  CTokenizer() { REQUIRE(gdn_tokenizer_load_json(qwen_json().data(), qwen_json().size(), &t) == GDN_STATUS_OK); }
  explicit CTokenizer(const std::string& model_dir) {
    REQUIRE(gdn_tokenizer_load_model_dir(model_dir.c_str(), &t) == GDN_STATUS_OK);
  }
  ~CTokenizer() { gdn_tokenizer_free(t); }
};

// Encode / decode with the two-call protocol of "Caller buffers".
std::vector<Token> c_encode(const gdn_tokenizer* t, const std::string& text, uint32_t flags = 0) {
  std::int64_t n = -1;
  REQUIRE(gdn_tokenizer_encode(t, text.data(), text.size(), flags, nullptr, 0, &n) == GDN_STATUS_OK);
  std::vector<Token> ids(static_cast<std::size_t>(n));
  std::int64_t m = -1;
  REQUIRE(gdn_tokenizer_encode(t, text.data(), text.size(), flags, ids.data(), n, &m) == GDN_STATUS_OK);
  CHECK(m == n);
  return ids;
}

std::string c_decode(const gdn_tokenizer* t, const std::vector<Token>& ids, uint32_t flags = 0) {
  std::size_t len = 0;
  REQUIRE(gdn_tokenizer_decode(t, ids.data(), static_cast<std::int64_t>(ids.size()), flags, nullptr, 0, &len) == GDN_STATUS_OK);
  std::string out(len + 1, '?');
  std::size_t len2 = 0;
  REQUIRE(gdn_tokenizer_decode(t, ids.data(), static_cast<std::int64_t>(ids.size()), flags, out.data(), out.size(), &len2) ==
          GDN_STATUS_OK);
  CHECK(len2 == len);
  CHECK(out[len] == '\0');
  out.resize(len);
  return out;
}

const std::vector<std::string> varied_texts = {
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\nand new\r\nlines   ",
    "中文分词测试：今天天气很好。日本語のテキストも。한국어 문장",
    "emoji 🦀🚀 family 👩‍👩‍👧 flags 🇩🇪 and 🫠🧪",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "code: for (int i = 0; i < n; ++i) { x[i] = 12345678 * i; }",
    "",
};

struct TextCollector {
  std::vector<std::string> text = std::vector<std::string>(4);
  std::vector<int> calls = std::vector<int>(4, 0);
  int cancel_after = -1;  // return 0 on this call (counted over all sequences); -1: never
  int total = 0;
  bool bad_index = false;
  static int cb(void* user, int32_t seq, const char* piece, size_t len) {
    auto* self = static_cast<TextCollector*>(user);
    if (seq < 0 || seq >= 4 || piece == nullptr || piece[len] != '\0') {
      self->bad_index = true;
      return 0;
    }
    self->text[static_cast<std::size_t>(seq)].append(piece, len);
    ++self->calls[static_cast<std::size_t>(seq)];
    return self->total++ == self->cancel_after ? 0 : 1;
  }
};

struct COutcome {
  std::vector<Token> tokens;
  std::string text;
  gdn_generation_info info{};
  gdn_speculative_stats spec{};
};

std::vector<COutcome> read_result(gdn_generation_result* r) {
  int32_t n = 0;
  REQUIRE(gdn_generation_result_count(r, &n) == GDN_STATUS_OK);
  std::vector<COutcome> out(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    COutcome& o = out[static_cast<std::size_t>(i)];
    const gdn_token* t = nullptr;
    std::int64_t nt = 0;
    REQUIRE(gdn_generation_result_tokens(r, i, &t, &nt) == GDN_STATUS_OK);
    o.tokens.assign(t, t + nt);
    const char* text = nullptr;
    std::size_t len = 0;
    REQUIRE(gdn_generation_result_text(r, i, &text, &len) == GDN_STATUS_OK);
    CHECK(text[len] == '\0');
    o.text.assign(text, len);
    o.info.size = sizeof o.info;
    REQUIRE(gdn_generation_result_get_info(r, i, &o.info) == GDN_STATUS_OK);
    o.spec.size = sizeof o.spec;
    REQUIRE(gdn_generation_result_get_speculative_stats(r, i, &o.spec) == GDN_STATUS_OK);
  }
  gdn_generation_result_free(r);
  return out;
}

COutcome c_generate(gdn_context* ctx, const gdn_tokenizer* tok, const std::vector<Token>& prompt,
                    const gdn_generation_params* gp, TextCollector* collect = nullptr) {
  gdn_generation_result* r = nullptr;
  REQUIRE(gdn_generate(ctx, tok, prompt.data(), static_cast<std::int64_t>(prompt.size()), gp,
                       collect ? &TextCollector::cb : nullptr, collect, &r) == GDN_STATUS_OK);
  REQUIRE(r != nullptr);
  auto out = read_result(r);
  REQUIRE(out.size() == 1);
  return out[0];
}

gdn_context_params tiny_c_params(int sequences = 3, int rollback = 4) {
  gdn_context_params p = gdn_context_default_params();
  p.max_sequences = sequences;
  p.max_context = 256;
  p.threads = 2;
  p.max_rollback_tokens = rollback;
  return p;
}

ContextParams tiny_cpp_params(int sequences = 3, int rollback = 4) {
  ContextParams p;
  p.max_sequences = sequences;
  p.max_context = 256;
  p.threads = 2;
  p.max_rollback_tokens = rollback;
  return p;
}

int32_t live_sequences(const gdn_context* c) {
  gdn_context_memory mem;
  mem.size = sizeof mem;
  REQUIRE(gdn_context_get_memory(c, &mem) == GDN_STATUS_OK);
  return mem.live_sequences;
}

// The same run through the C++ API.
struct Tiny {
  Tokenizer tok = Tokenizer::load(tiny_dir + "/tokenizer.json");
  std::shared_ptr<const Model> model = Model::load(tiny_dir);
  Context ctx{model, tiny_cpp_params()};
  Generator gen{ctx, tok, load_eos_token_ids(tiny_dir)};
  std::vector<Token> ids(const std::string& prompt) const { return tok.encode(prompt); }
};

}  // namespace

TEST_CASE("tokenizer through the C ABI equals the C++ tokenizer on varied text", "[capi][text]") {
  const Tokenizer cpp = Tokenizer::from_json(qwen_json());
  CTokenizer c;
  int32_t vocab = 0;
  REQUIRE(gdn_tokenizer_vocab_size(c.t, &vocab) == GDN_STATUS_OK);
  CHECK(vocab == cpp.vocab_size());
  CHECK(vocab > 150000);  // the real Qwen3.5 vocabulary, not a toy one

  for (const std::string& text : varied_texts) {
    INFO(text);
    const auto ids = c_encode(c.t, text);
    CHECK(ids == cpp.encode(text, true));
    CHECK(c_encode(c.t, text, GDN_TOKENIZE_SPECIAL_AS_TEXT) == cpp.encode(text, false));
    CHECK(c_decode(c.t, ids) == cpp.decode(ids));
    CHECK(c_decode(c.t, ids, GDN_DECODE_SKIP_SPECIAL) == cpp.decode(ids, true));
  }
  // Special tokens are single ids unless read as text; skip_special drops them.
  const std::string chat = "<|im_start|>user\nhi<|im_end|>";
  const auto with_special = c_encode(c.t, chat);
  const auto as_text = c_encode(c.t, chat, GDN_TOKENIZE_SPECIAL_AS_TEXT);
  CHECK(with_special.front() == *cpp.token_to_id("<|im_start|>"));
  CHECK(as_text.size() > with_special.size());
  CHECK(c_decode(c.t, with_special) == chat);
  CHECK(c_decode(c.t, with_special, GDN_DECODE_SKIP_SPECIAL) == "user\nhi");

  SECTION("from a file and from a model directory") {
    const auto dir = std::filesystem::path(GDN_BINARY_DIR) / "test_capi_tokenizer";
    std::filesystem::create_directories(dir);
    {
      std::ofstream f(dir / "tokenizer.json", std::ios::binary);
      f << qwen_json();
    }
    gdn_tokenizer* a = nullptr;
    REQUIRE(gdn_tokenizer_load((dir / "tokenizer.json").string().c_str(), &a) == GDN_STATUS_OK);
    CTokenizer b(dir.string());
    CHECK(c_encode(a, varied_texts[2]) == cpp.encode(varied_texts[2]));
    CHECK(c_encode(b.t, varied_texts[3]) == cpp.encode(varied_texts[3]));
    gdn_tokenizer_free(a);
    std::filesystem::remove_all(dir);
    gdn_tokenizer* none = nullptr;
    CHECK(gdn_tokenizer_load_model_dir("/nonexistent/model", &none) == GDN_STATUS_IO_ERROR);
    CHECK_THAT(last_error(), Catch::StartsWith("gdn_tokenizer_load_model_dir: ") && Catch::Contains("/nonexistent/model"));
    CHECK(gdn_tokenizer_load_json("{\"model\": 3}", 12, &none) == GDN_STATUS_INVALID_FILE);
    CHECK(none == nullptr);
  }
  SECTION("token <-> id") {
    gdn_token id = -2;
    REQUIRE(gdn_tokenizer_token_to_id(c.t, "<|im_end|>", 10, &id) == GDN_STATUS_OK);
    CHECK(id == *cpp.token_to_id("<|im_end|>"));
    const char* spelled = nullptr;
    std::size_t len = 0;
    bool special = false;
    REQUIRE(gdn_tokenizer_id_to_token(c.t, id, &spelled, &len, &special) == GDN_STATUS_OK);
    CHECK(std::string(spelled, len) == "<|im_end|>");
    CHECK(special);
    const Token hello = cpp.encode("Hello").front();
    REQUIRE(gdn_tokenizer_id_to_token(c.t, hello, &spelled, &len, &special) == GDN_STATUS_OK);
    CHECK(std::string(spelled, len) == cpp.id_to_token(hello));
    CHECK(!special);
    REQUIRE(gdn_tokenizer_token_to_id(c.t, "no such token!", 14, &id) == GDN_STATUS_OK);
    CHECK(id == -1);
    CHECK(gdn_tokenizer_id_to_token(c.t, vocab, &spelled, &len, nullptr) == GDN_STATUS_INVALID_TOKEN);
    CHECK(gdn_tokenizer_id_to_token(c.t, -1, &spelled, &len, nullptr) == GDN_STATUS_INVALID_TOKEN);
  }
  SECTION("the stream decoder gives complete characters that concatenate to decode()") {
    const std::string text = varied_texts[3] + " " + varied_texts[2];
    const auto ids = cpp.encode(text);
    gdn_stream_decoder* d = nullptr;
    REQUIRE(gdn_stream_decoder_create(c.t, 0, &d) == GDN_STATUS_OK);
    gdn_tokenizer_free(c.t);  // the decoder keeps the tables alive
    c.t = nullptr;
    std::string all;
    int empty_pushes = 0;
    const char* piece = nullptr;
    std::size_t len = 0;
    StreamDecoder ref(cpp);
    for (const Token t : ids) {
      REQUIRE(gdn_stream_decoder_push(d, t, &piece, &len) == GDN_STATUS_OK);
      CHECK(std::string(piece, len) == ref.push(t));
      CHECK(detail::utf8_error_offset(std::string_view(piece, len)) == std::string_view::npos);
      empty_pushes += len == 0;
      all.append(piece, len);
    }
    CHECK(empty_pushes > 0);  // emoji and rare CJK are split into byte pieces: some are held back
    REQUIRE(gdn_stream_decoder_flush(d, &piece, &len) == GDN_STATUS_OK);
    all.append(piece, len);
    CHECK(all == cpp.decode(ids));
    CHECK(all == text);
    // A bad id changes nothing; reset drops what is held.
    CHECK(gdn_stream_decoder_push(d, vocab, &piece, &len) == GDN_STATUS_INVALID_TOKEN);
    const auto crab = cpp.encode("🦀");
    REQUIRE(crab.size() > 1);
    REQUIRE(gdn_stream_decoder_push(d, crab[0], &piece, &len) == GDN_STATUS_OK);
    CHECK(len == 0);
    REQUIRE(gdn_stream_decoder_reset(d) == GDN_STATUS_OK);
    REQUIRE(gdn_stream_decoder_flush(d, &piece, &len) == GDN_STATUS_OK);
    CHECK(len == 0);
    gdn_stream_decoder_free(d);
  }
}

TEST_CASE("caller buffers: size query, too small (size still told), exact fit", "[capi][text]") {
  CTokenizer c;
  const std::string text = varied_texts[2];
  std::int64_t n = 0;
  REQUIRE(gdn_tokenizer_encode(c.t, text.data(), text.size(), 0, nullptr, 0, &n) == GDN_STATUS_OK);
  REQUIRE(n > 2);
  std::vector<Token> ids(static_cast<std::size_t>(n), -7);
  std::int64_t told = 0;
  CHECK(gdn_tokenizer_encode(c.t, text.data(), text.size(), 0, ids.data(), n - 1, &told) == GDN_STATUS_OUT_OF_CAPACITY);
  CHECK(told == n);
  CHECK_THAT(last_error(), Catch::Contains("needs " + std::to_string(n)));
  CHECK(std::all_of(ids.begin(), ids.end(), [](Token t) { return t == -7; }));  // untouched
  REQUIRE(gdn_tokenizer_encode(c.t, text.data(), text.size(), 0, ids.data(), n, &told) == GDN_STATUS_OK);
  CHECK(told == n);
  CHECK(ids == c_encode(c.t, text));
  CHECK(gdn_tokenizer_encode(c.t, text.data(), text.size(), 0, nullptr, 5, &told) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK(gdn_tokenizer_encode(c.t, text.data(), text.size(), 0, ids.data(), -1, &told) == GDN_STATUS_INVALID_ARGUMENT);

  std::size_t len = 0;
  REQUIRE(gdn_tokenizer_decode(c.t, ids.data(), n, 0, nullptr, 0, &len) == GDN_STATUS_OK);
  CHECK(len == text.size());
  std::string buf(len + 1, 'x');
  std::size_t told_len = 0;
  CHECK(gdn_tokenizer_decode(c.t, ids.data(), n, 0, buf.data(), len, &told_len) == GDN_STATUS_OUT_OF_CAPACITY);
  CHECK(told_len == len);  // the NUL needs one more byte
  CHECK(buf == std::string(len + 1, 'x'));
  REQUIRE(gdn_tokenizer_decode(c.t, ids.data(), n, 0, buf.data(), len + 1, &told_len) == GDN_STATUS_OK);
  CHECK(std::string(buf.c_str()) == text);

  // Empty text: zero ids, and decoding none gives "".
  REQUIRE(gdn_tokenizer_encode(c.t, nullptr, 0, 0, nullptr, 0, &told) == GDN_STATUS_OK);
  CHECK(told == 0);
  char one = 'x';
  REQUIRE(gdn_tokenizer_decode(c.t, nullptr, 0, 0, &one, 1, &told_len) == GDN_STATUS_OK);
  CHECK(told_len == 0);
  CHECK(one == '\0');

  // Invalid UTF-8 in, a bad id in.
  const char bad_utf8[] = {'a', static_cast<char>(0xff), 'b'};
  CHECK(gdn_tokenizer_encode(c.t, bad_utf8, 3, 0, nullptr, 0, &told) == GDN_STATUS_INVALID_ARGUMENT);
  const Token bad_id = 1 << 30;
  CHECK(gdn_tokenizer_decode(c.t, &bad_id, 1, 0, nullptr, 0, &told_len) == GDN_STATUS_INVALID_TOKEN);
}

TEST_CASE("chat template through the C ABI equals render_chat", "[capi][text]") {
  const char* roles[] = {"system", "user", "assistant", "user"};
  const char* contents[] = {"You are terse.", "Hi!", "<think>\nGreet back.\n</think>\n\nHello.", "Add 2 and 3."};
  std::vector<ChatMessage> msgs;
  for (int i = 0; i < 4; ++i) msgs.push_back({roles[i], std::string(contents[i]), std::nullopt});
  const auto render = [&](const gdn_chat_params* p, const char* const* reasoning = nullptr) {
    std::size_t len = 0;
    REQUIRE(gdn_chat_render(roles, contents, reasoning, 4, p, nullptr, 0, &len) == GDN_STATUS_OK);
    std::string out(len + 1, '\0');
    REQUIRE(gdn_chat_render(roles, contents, reasoning, 4, p, out.data(), out.size(), &len) == GDN_STATUS_OK);
    out.resize(len);
    return out;
  };
  ChatOptions o;
  CHECK(render(nullptr) == render_chat(msgs, o));
  gdn_chat_params p = gdn_chat_default_params();
  CHECK(p.enable_thinking == o.enable_thinking);
  CHECK(p.add_generation_prompt == o.add_generation_prompt);
  p.add_generation_prompt = true;
  p.enable_thinking = false;
  o.add_generation_prompt = true;
  o.enable_thinking = false;
  const std::string rendered = render(&p);
  CHECK(rendered == render_chat(msgs, o));
  CHECK_THAT(rendered, Catch::EndsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  const char* reasoning[] = {nullptr, nullptr, "Other reasoning.", nullptr};
  msgs[2].reasoning_content = "Other reasoning.";
  p.preserve_thinking = true;
  o.preserve_thinking = true;
  CHECK(render(&p, reasoning) == render_chat(msgs, o));

  // The template's own errors, wrong sizes, NULLs.
  const char* only_system[] = {"system"};
  const char* sys_content[] = {"x"};
  std::size_t len = 0;
  CHECK(gdn_chat_render(only_system, sys_content, nullptr, 1, nullptr, nullptr, 0, &len) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("No user query found in messages."));
  p.size = 2;
  CHECK(gdn_chat_render(roles, contents, nullptr, 4, &p, nullptr, 0, &len) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("wrong-size parameter struct"));
  CHECK(gdn_chat_render(nullptr, contents, nullptr, 4, nullptr, nullptr, 0, &len) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK(gdn_chat_render(roles, contents, nullptr, 4, nullptr, nullptr, 0, nullptr) == GDN_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("chat template with tools through the C ABI equals render_chat_json", "[capi][text]") {
  const char* messages = R"([{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])";
  const char* tools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";
  gdn_chat_params p = gdn_chat_default_params();
  p.add_generation_prompt = true;
  std::size_t len = 0;
  REQUIRE(gdn_chat_render_json(messages, tools, &p, nullptr, 0, &len) == GDN_STATUS_OK);
  std::string out(len + 1, '\0');
  REQUIRE(gdn_chat_render_json(messages, tools, &p, out.data(), out.size(), &len) == GDN_STATUS_OK);
  out.resize(len);
  ChatOptions o;
  o.add_generation_prompt = true;
  CHECK(out == render_chat_json(messages, tools, o));
  CHECK_THAT(out, Catch::Contains("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>"));
  CHECK_THAT(out, Catch::StartsWith("<|im_start|>system\n# Tools\n"));
  // No tools: NULL and "null" are the same as none.
  REQUIRE(gdn_chat_render_json(messages, nullptr, nullptr, nullptr, 0, &len) == GDN_STATUS_OK);
  const std::size_t without = len;
  REQUIRE(gdn_chat_render_json(messages, "null", nullptr, nullptr, 0, &len) == GDN_STATUS_OK);
  CHECK(len == without);
  CHECK(len < out.size());
  // Refusals say why.
  CHECK(gdn_chat_render_json(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])", nullptr,
                             nullptr, nullptr, 0, &len) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("is an image: this model takes text only"));
  CHECK(gdn_chat_render_json("[{", nullptr, nullptr, nullptr, 0, &len) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("messages is not valid JSON"));
  CHECK(gdn_chat_render_json(nullptr, nullptr, nullptr, nullptr, 0, &len) == GDN_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("sampler through the C ABI equals the C++ Sampler", "[capi][sampling]") {
  const SamplingParams d;
  const gdn_sampling_params dp = gdn_sampling_default_params();
  CHECK(dp.size == sizeof dp);
  CHECK(dp.temperature == d.temperature);
  CHECK(dp.top_k == d.top_k);
  CHECK(dp.top_p == d.top_p);
  CHECK(dp.min_p == d.min_p);
  CHECK(dp.repetition_penalty == d.repetition_penalty);
  CHECK(dp.presence_penalty == d.presence_penalty);
  CHECK(dp.seed == d.seed);

  constexpr int V = 97;
  std::vector<float> logits(V);
  for (int i = 0; i < V; ++i) logits[static_cast<std::size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  gdn_sampling_params cp = dp;
  cp.temperature = 0.9f;
  cp.top_k = 40;
  cp.top_p = 0.95f;
  cp.min_p = 0.01f;
  cp.repetition_penalty = 1.3f;
  cp.presence_penalty = 0.5f;
  cp.seed = 1234;
  SamplingParams sp;
  sp.temperature = cp.temperature;
  sp.top_k = cp.top_k;
  sp.top_p = cp.top_p;
  sp.min_p = cp.min_p;
  sp.repetition_penalty = cp.repetition_penalty;
  sp.presence_penalty = cp.presence_penalty;
  sp.seed = cp.seed;
  Sampler ref(sp, V);
  gdn_sampler* s = nullptr;
  REQUIRE(gdn_sampler_create(&cp, V, &s) == GDN_STATUS_OK);
  const Token prompt[] = {3, 5, 8};
  REQUIRE(gdn_sampler_observe(s, prompt, 3) == GDN_STATUS_OK);
  ref.observe(std::span<const Token>(prompt, 3));
  std::vector<Token> got, expect;
  for (int i = 0; i < 40; ++i) {
    gdn_token t = -1;
    REQUIRE(gdn_sampler_sample(s, logits.data(), V, &t) == GDN_STATUS_OK);
    REQUIRE(gdn_sampler_observe(s, &t, 1) == GDN_STATUS_OK);
    got.push_back(t);
    expect.push_back(ref.sample(logits));
    ref.observe(expect.back());
  }
  CHECK(got == expect);
  CHECK(std::set<Token>(got.begin(), got.end()).size() > 5);  // it really samples
  std::vector<float> probs(V), ref_probs(V);
  REQUIRE(gdn_sampler_distribution(s, logits.data(), V, probs.data(), V) == GDN_STATUS_OK);
  ref.distribution(logits, ref_probs);
  CHECK(probs == ref_probs);
  double sum = 0;
  for (const float p : probs) sum += p;
  CHECK(sum == Approx(1.0).epsilon(1e-5));

  gdn_token t = -1;
  CHECK(gdn_sampler_sample(s, logits.data(), V - 1, &t) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK(gdn_sampler_distribution(s, logits.data(), V, probs.data(), V - 1) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK(t == -1);
  gdn_sampler_free(s);

  SECTION("greedy (NULL params) is the argmax; sample_row reads a context row") {
    CModel cm("qwen35_tied");
    CContext cc(cm.m, small_c_params(1));
    gdn_seq_id seq = 0;
    REQUIRE(gdn_seq_create(cc.c, &seq) == GDN_STATUS_OK);
    CBatch cb;
    const Token p3[] = {1, 2, 3};
    REQUIRE(gdn_batch_add(cb.b, seq, p3, 3, GDN_LOGITS_LAST, 0, nullptr) == GDN_STATUS_OK);
    REQUIRE(gdn_context_step(cc.c, cb.b) == GDN_STATUS_OK);
    const float* row = nullptr;
    REQUIRE(gdn_context_get_logits(cc.c, 0, &row) == GDN_STATUS_OK);
    gdn_sampler* g = nullptr;
    REQUIRE(gdn_sampler_create(nullptr, 256, &g) == GDN_STATUS_OK);
    REQUIRE(gdn_sampler_sample_row(g, cc.c, 0, &t) == GDN_STATUS_OK);
    CHECK(t == static_cast<Token>(std::max_element(row, row + 256) - row));
    CHECK(gdn_sampler_sample_row(g, cc.c, 1, &t) == GDN_STATUS_INVALID_ARGUMENT);  // no such row
    gdn_sampler_free(g);
  }
  SECTION("settings out of range, wrong sizes") {
    gdn_sampler* bad = nullptr;
    gdn_sampling_params q = dp;
    q.temperature = -1.0f;
    CHECK(gdn_sampler_create(&q, V, &bad) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("temperature"));
    q = dp;
    q.top_p = 0.0f;
    CHECK(gdn_sampler_create(&q, V, &bad) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(gdn_sampler_create(nullptr, 0, &bad) == GDN_STATUS_INVALID_ARGUMENT);
    q = dp;
    q.size = 8;
    CHECK(gdn_sampler_create(&q, V, &bad) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(bad == nullptr);
    q.size = 8;
    CHECK(gdn_sampling_params_init(&q) == GDN_STATUS_INVALID_ARGUMENT);
  }
}

TEST_CASE("NULL and foreign handles of the text API are refused", "[capi][text]") {
  CTokenizer c;
  CModel cm("qwen35_tied");
  CContext cc(cm.m, small_c_params(1));
  gdn_sampler* s = nullptr;
  REQUIRE(gdn_sampler_create(nullptr, 256, &s) == GDN_STATUS_OK);
  gdn_tokenizer* t = nullptr;
  gdn_stream_decoder* d = nullptr;
  gdn_generation_result* r = nullptr;
  gdn_speculative* sp = nullptr;
  gdn_sampler* s2 = nullptr;
  int32_t i32 = 0;
  std::int64_t n = 0;
  std::size_t len = 0;
  const char* text = nullptr;
  const gdn_token* toks = nullptr;
  gdn_token tok = 0;
  float f[4] = {};
  const Token one = 1;
  gdn_generation_info info;
  info.size = sizeof info;
  gdn_speculative_stats stats;
  stats.size = sizeof stats;
  const auto refused = [](gdn_status st) {
    CHECK(st == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(!last_error().empty());
  };
  refused(gdn_tokenizer_load(nullptr, &t));
  refused(gdn_tokenizer_load("x", nullptr));
  refused(gdn_tokenizer_load_model_dir(nullptr, &t));
  refused(gdn_tokenizer_load_json(nullptr, 3, &t));
  refused(gdn_tokenizer_vocab_size(nullptr, &i32));
  refused(gdn_tokenizer_vocab_size(c.t, nullptr));
  refused(gdn_tokenizer_encode(nullptr, "a", 1, 0, nullptr, 0, &n));
  refused(gdn_tokenizer_encode(c.t, nullptr, 1, 0, nullptr, 0, &n));
  refused(gdn_tokenizer_encode(c.t, "a", 1, 0, nullptr, 0, nullptr));
  refused(gdn_tokenizer_encode(c.t, "a", 1, GDN_DECODE_SKIP_SPECIAL, nullptr, 0, &n));  // a decode flag
  refused(gdn_tokenizer_encode(c.t, "a", 1, 1u << 9, nullptr, 0, &n));
  refused(gdn_tokenizer_decode(nullptr, &one, 1, 0, nullptr, 0, &len));
  refused(gdn_tokenizer_decode(c.t, nullptr, 1, 0, nullptr, 0, &len));
  refused(gdn_tokenizer_decode(c.t, &one, -1, 0, nullptr, 0, &len));
  refused(gdn_tokenizer_decode(c.t, &one, 1, GDN_TOKENIZE_SPECIAL_AS_TEXT, nullptr, 0, &len));
  refused(gdn_tokenizer_token_to_id(nullptr, "a", 1, &tok));
  refused(gdn_tokenizer_token_to_id(c.t, "a", 1, nullptr));
  refused(gdn_tokenizer_id_to_token(nullptr, 1, &text, &len, nullptr));
  refused(gdn_tokenizer_id_to_token(c.t, 1, nullptr, &len, nullptr));
  refused(gdn_stream_decoder_create(nullptr, 0, &d));
  refused(gdn_stream_decoder_create(c.t, 0, nullptr));
  refused(gdn_stream_decoder_create(c.t, GDN_TOKENIZE_SPECIAL_AS_TEXT, &d));
  refused(gdn_stream_decoder_push(nullptr, 1, &text, &len));
  refused(gdn_stream_decoder_flush(nullptr, &text, &len));
  refused(gdn_stream_decoder_reset(nullptr));
  refused(gdn_chat_params_init(nullptr));
  refused(gdn_sampling_params_init(nullptr));
  refused(gdn_sampler_create(nullptr, 256, nullptr));
  refused(gdn_sampler_observe(nullptr, &one, 1));
  refused(gdn_sampler_observe(s, nullptr, 1));
  refused(gdn_sampler_sample(nullptr, f, 4, &tok));
  refused(gdn_sampler_sample(s, nullptr, 4, &tok));
  refused(gdn_sampler_sample(s, f, 4, nullptr));
  refused(gdn_sampler_sample_row(s, nullptr, 0, &tok));
  refused(gdn_sampler_sample_row(nullptr, cc.c, 0, &tok));
  refused(gdn_sampler_distribution(nullptr, f, 4, f, 4));
  refused(gdn_sampler_distribution(s, f, 4, nullptr, 4));
  refused(gdn_generation_params_init(nullptr));
  refused(gdn_generate(nullptr, c.t, &one, 1, nullptr, nullptr, nullptr, &r));
  refused(gdn_generate(cc.c, nullptr, &one, 1, nullptr, nullptr, nullptr, &r));
  refused(gdn_generate(cc.c, c.t, nullptr, 1, nullptr, nullptr, nullptr, &r));
  refused(gdn_generate(cc.c, c.t, &one, 1, nullptr, nullptr, nullptr, nullptr));
  refused(gdn_generate_batch(cc.c, c.t, 0, nullptr, nullptr, nullptr, nullptr, nullptr, &r));
  refused(gdn_generate_batch(cc.c, c.t, 1, nullptr, &n, nullptr, nullptr, nullptr, &r));
  refused(gdn_generation_result_count(nullptr, &i32));
  refused(gdn_generation_result_tokens(nullptr, 0, &toks, &n));
  refused(gdn_generation_result_text(nullptr, 0, &text, &len));
  refused(gdn_generation_result_get_info(nullptr, 0, &info));
  refused(gdn_generation_result_get_speculative_stats(nullptr, 0, &stats));
  refused(gdn_speculative_params_init(nullptr));
  refused(gdn_speculative_create(nullptr, nullptr, &sp));
  refused(gdn_speculative_create(cc.c, nullptr, nullptr));
  refused(gdn_speculative_start(nullptr, 0, &one, 1, s, &tok));
  refused(gdn_speculative_advance(nullptr, nullptr, 0, nullptr, 4, nullptr));
  refused(gdn_speculative_finish(nullptr, 0));
  refused(gdn_speculative_get_stats(nullptr, &stats));
  // One handle type passed as another.
  refused(gdn_tokenizer_vocab_size(reinterpret_cast<gdn_tokenizer*>(s), &i32));
  CHECK_THAT(last_error(), Catch::Contains("not a live tokenizer handle"));
  refused(gdn_sampler_observe(reinterpret_cast<gdn_sampler*>(c.t), &one, 1));
  refused(gdn_generate(cc.c, reinterpret_cast<gdn_tokenizer*>(cc.c), &one, 1, nullptr, nullptr, nullptr, &r));
  refused(gdn_generation_result_count(reinterpret_cast<gdn_generation_result*>(c.t), &i32));
  refused(gdn_speculative_get_stats(reinterpret_cast<gdn_speculative*>(cc.c), &stats));
  CHECK(t == nullptr);
  CHECK(d == nullptr);
  CHECK(r == nullptr);
  CHECK(sp == nullptr);
  CHECK(s2 == nullptr);
  gdn_tokenizer_free(nullptr);
  gdn_stream_decoder_free(nullptr);
  gdn_sampler_free(nullptr);
  gdn_generation_result_free(nullptr);
  gdn_speculative_free(nullptr);
  gdn_sampler_free(s);
}

TEST_CASE("generation parameter structs: defaults, sizes, newer callers", "[capi][generate]") {
  const GenerationParams d;
  const gdn_generation_params p = gdn_generation_default_params();
  CHECK(p.size == sizeof p);
  CHECK(p.max_tokens == d.max_tokens);
  CHECK(p.sampling == nullptr);
  CHECK(p.stop_on_eos == d.stop_on_eos);
  CHECK(p.n_stop_tokens == 0);
  CHECK(p.stop_tokens == nullptr);
  CHECK(p.n_stop_strings == 0);
  CHECK(p.stop_strings == nullptr);
  CHECK(p.mtp_draft == d.mtp_draft);
  CHECK(p.mtp_adaptive == d.mtp_adaptive);
  const gdn_speculative_params sp = gdn_speculative_default_params();
  CHECK(sp.max_draft == SpeculativeParams{}.max_draft);
  CHECK(sp.adaptive == SpeculativeParams{}.adaptive);

  CModel cm("qwen35_tied");
  CContext cc(cm.m, small_c_params(1));
  CTokenizer c;
  const Token prompt[] = {1, 2, 3};
  gdn_generation_result* r = nullptr;
  struct Newer {
    gdn_generation_params known;
    std::int64_t future;
  } n;
  n.known.size = sizeof n;
  REQUIRE(gdn_generation_params_init(&n.known) == GDN_STATUS_OK);
  CHECK(n.future == 0);
  n.known.max_tokens = 3;
  n.known.stop_on_eos = false;
  REQUIRE(gdn_generate(cc.c, c.t, prompt, 3, &n.known, nullptr, nullptr, &r) == GDN_STATUS_OK);
  const auto out = read_result(r);
  CHECK(out[0].tokens.size() == 3);
  CHECK(out[0].info.finish == GDN_FINISH_LENGTH);
  r = nullptr;
  n.future = 1;
  CHECK(gdn_generate(cc.c, c.t, prompt, 3, &n.known, nullptr, nullptr, &r) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("does not know"));
  n.future = 0;
  n.known.size = 4;
  CHECK(gdn_generate(cc.c, c.t, prompt, 3, &n.known, nullptr, nullptr, &r) == GDN_STATUS_INVALID_ARGUMENT);
  gdn_sampling_params bad_sampling = gdn_sampling_default_params();
  bad_sampling.size = 3;
  gdn_generation_params q = gdn_generation_default_params();
  q.sampling = &bad_sampling;
  CHECK(gdn_generate(cc.c, c.t, prompt, 3, &q, nullptr, nullptr, &r) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("gdn_sampling_params.size"));
  q = gdn_generation_default_params();
  q.n_stop_strings = 1;
  CHECK(gdn_generate(cc.c, c.t, prompt, 3, &q, nullptr, nullptr, &r) == GDN_STATUS_INVALID_ARGUMENT);  // stop_strings NULL
  CHECK(r == nullptr);
  CHECK(live_sequences(cc.c) == 0);
}

TEST_CASE("gdn_generate on the trained gdn-tiny equals gdn::Generator", "[capi][generate][tiny]") {
  Tiny cpp;
  CModel cm(tiny_dir);
  CContext cc(cm.m, tiny_c_params());
  CTokenizer ct(tiny_dir);
  const auto prompt = c_encode(ct.t, "reverse 12478 =");
  REQUIRE(prompt == cpp.ids("reverse 12478 ="));

  GenerationParams gp;
  gp.max_tokens = 16;
  const GenerationResult ref = cpp.gen.generate(prompt, gp);
  REQUIRE(ref.text == "87421");  // the trained answer (scripts/demo.sh)

  gdn_generation_params p = gdn_generation_default_params();
  p.max_tokens = 16;
  TextCollector col;
  const COutcome greedy = c_generate(cc.c, ct.t, prompt, &p, &col);
  CHECK(greedy.tokens == ref.tokens);
  CHECK(greedy.text == "87421");
  CHECK(greedy.tokens.back() == 0);  // eos, from the checkpoint's config
  CHECK(greedy.info.finish == GDN_FINISH_STOP_TOKEN);
  CHECK(greedy.info.prompt_tokens == static_cast<std::int64_t>(prompt.size()));
  CHECK(greedy.info.generated_tokens == static_cast<std::int64_t>(ref.tokens.size()));
  CHECK(greedy.info.prefill_seconds > 0);
  CHECK(greedy.info.decode_seconds > 0);
  CHECK(greedy.spec.rounds == 0);
  CHECK(!col.bad_index);
  CHECK(col.text[0] == greedy.text);  // the streamed pieces concatenate to the text
  CHECK(col.calls[0] >= 2);
  CHECK(live_sequences(cc.c) == 0);   // the call's sequence is gone

  SECTION("a callback returning 0 cancels the sequence") {
    TextCollector cancel;
    cancel.cancel_after = 0;
    const COutcome r = c_generate(cc.c, ct.t, prompt, &p, &cancel);
    CHECK(r.info.finish == GDN_FINISH_CANCELLED);
    CHECK(r.text == cancel.text[0]);
    CHECK(cancel.calls[0] == 1);
    CHECK(r.tokens.size() < greedy.tokens.size());
    CHECK(r.tokens == std::vector<Token>(greedy.tokens.begin(), greedy.tokens.begin() + static_cast<std::ptrdiff_t>(r.tokens.size())));
  }
  SECTION("stop string, stop token, max_tokens, eos off") {
    const char* stops[] = {"42"};
    gdn_generation_params q = p;
    q.n_stop_strings = 1;
    q.stop_strings = stops;
    TextCollector c1;
    const COutcome s = c_generate(cc.c, ct.t, prompt, &q, &c1);
    CHECK(s.info.finish == GDN_FINISH_STOP_STRING);
    CHECK(s.text == "87");
    CHECK(c1.text[0] == "87");  // nothing after (or of) the stop string was streamed

    q = p;
    const Token four = greedy.tokens[2];
    q.n_stop_tokens = 1;
    q.stop_tokens = &four;
    const COutcome t = c_generate(cc.c, ct.t, prompt, &q);
    CHECK(t.info.finish == GDN_FINISH_STOP_TOKEN);
    CHECK(t.tokens == std::vector<Token>(greedy.tokens.begin(), greedy.tokens.begin() + 3));

    q = p;
    q.max_tokens = 2;
    const COutcome l = c_generate(cc.c, ct.t, prompt, &q);
    CHECK(l.info.finish == GDN_FINISH_LENGTH);
    CHECK(l.tokens == std::vector<Token>(greedy.tokens.begin(), greedy.tokens.begin() + 2));
    CHECK(l.text == "87");

    q = p;
    q.stop_on_eos = false;
    q.max_tokens = 9;
    const COutcome e = c_generate(cc.c, ct.t, prompt, &q);
    CHECK(e.info.finish == GDN_FINISH_LENGTH);
    CHECK(e.tokens.size() == 9);
    GenerationParams g2 = gp;
    g2.stop_on_eos = false;
    g2.max_tokens = 9;
    CHECK(e.tokens == cpp.gen.generate(prompt, g2).tokens);
  }
  SECTION("MTP speculative decoding: the same tokens as plain greedy, statistics as in C++") {
    gdn_generation_params q = p;
    q.mtp_draft = 2;
    q.mtp_adaptive = false;
    TextCollector c2;
    const COutcome m = c_generate(cc.c, ct.t, prompt, &q, &c2);
    CHECK(m.tokens == greedy.tokens);
    CHECK(m.text == "87421");
    CHECK(c2.text[0] == m.text);
    GenerationParams g2 = gp;
    g2.mtp_draft = 2;
    g2.mtp_adaptive = false;
    const GenerationResult rm = cpp.gen.generate(prompt, g2);
    CHECK(m.spec.rounds == rm.speculative.rounds);
    CHECK(m.spec.drafted == rm.speculative.drafted);
    CHECK(m.spec.accepted == rm.speculative.accepted);
    CHECK(m.spec.generated == rm.speculative.generated);
    CHECK(m.spec.k == 2);
    CHECK(m.spec.drafted > 0);
    CHECK(m.spec.accepted > 0);
    CHECK(m.spec.rounds < static_cast<std::int64_t>(m.tokens.size()) - 1);  // fewer main steps than tokens
  }
  SECTION("a seeded temperature > 0 run repeats exactly, and equals C++") {
    gdn_sampling_params sp = gdn_sampling_default_params();
    sp.temperature = 1.5f;
    sp.seed = 99;
    gdn_generation_params q = p;
    q.sampling = &sp;
    q.stop_on_eos = false;
    const COutcome a = c_generate(cc.c, ct.t, prompt, &q);
    const COutcome b = c_generate(cc.c, ct.t, prompt, &q);
    CHECK(a.tokens == b.tokens);
    CHECK(a.text == b.text);
    CHECK(a.tokens.size() == 16);
    GenerationParams g2 = gp;
    g2.stop_on_eos = false;
    g2.sampling.temperature = 1.5f;
    g2.sampling.seed = 99;
    CHECK(a.tokens == cpp.gen.generate(prompt, g2).tokens);
    sp.seed = 100;
    const COutcome other = c_generate(cc.c, ct.t, prompt, &q);
    GenerationParams g3 = g2;
    g3.sampling.seed = 100;
    CHECK(other.tokens == cpp.gen.generate(prompt, g3).tokens);
  }
  SECTION("batched, each sequence with its own sampler settings") {
    const std::vector<std::vector<Token>> prompts = {cpp.ids("reverse 12478 ="), cpp.ids("copy 6275 ="), cpp.ids("add 31+13=")};
    gdn_sampling_params topk1 = gdn_sampling_default_params();
    topk1.temperature = 0.8f;
    topk1.top_k = 1;  // sampling from the argmax alone: greedy
    topk1.seed = 5;
    gdn_sampling_params hot = gdn_sampling_default_params();
    hot.temperature = 1.3f;
    hot.seed = 11;
    gdn_generation_params p0 = p, p1 = p, p2 = p;
    p1.sampling = &topk1;
    p2.sampling = &hot;
    p2.stop_on_eos = false;
    const gdn_generation_params* ps[] = {&p0, &p1, &p2};
    const gdn_token* pp[] = {prompts[0].data(), prompts[1].data(), prompts[2].data()};
    const std::int64_t np[] = {static_cast<std::int64_t>(prompts[0].size()), static_cast<std::int64_t>(prompts[1].size()),
                               static_cast<std::int64_t>(prompts[2].size())};
    TextCollector col3;
    gdn_generation_result* r = nullptr;
    REQUIRE(gdn_generate_batch(cc.c, ct.t, 3, pp, np, ps, &TextCollector::cb, &col3, &r) == GDN_STATUS_OK);
    const auto out = read_result(r);
    REQUIRE(out.size() == 3);
    CHECK(out[0].tokens == greedy.tokens);
    CHECK(out[1].tokens == cpp.gen.generate(prompts[1], gp).tokens);  // top_k = 1 is greedy
    CHECK(out[1].text == "6275");
    GenerationParams hot_cpp = gp;
    hot_cpp.stop_on_eos = false;
    hot_cpp.sampling.temperature = 1.3f;
    hot_cpp.sampling.seed = 11;
    CHECK(out[2].tokens == cpp.gen.generate(prompts[2], hot_cpp).tokens);  // in a batch as alone
    CHECK(out[2].tokens.size() == 16);
    for (int i = 0; i < 3; ++i) CHECK(col3.text[static_cast<std::size_t>(i)] == out[static_cast<std::size_t>(i)].text);
    CHECK(!col3.bad_index);
    // NULL params: all defaults (greedy, 256 tokens, eos).
    REQUIRE(gdn_generate_batch(cc.c, ct.t, 2, pp, np, nullptr, nullptr, nullptr, &r) == GDN_STATUS_OK);
    const auto dflt = read_result(r);
    CHECK(dflt[0].tokens == greedy.tokens);
    CHECK(dflt[1].text == "6275");
  }
  SECTION("refusals leave no sequence behind") {
    gdn_generation_result* r = nullptr;
    gdn_generation_params q = p;
    q.max_tokens = 0;
    CHECK(gdn_generate(cc.c, ct.t, prompt.data(), static_cast<std::int64_t>(prompt.size()), &q, nullptr, nullptr, &r) ==
          GDN_STATUS_INVALID_ARGUMENT);
    CHECK(gdn_generate(cc.c, ct.t, prompt.data(), 0, &p, nullptr, nullptr, &r) == GDN_STATUS_INVALID_ARGUMENT);
    // Four prompts for three slots.
    const gdn_token* pp[] = {prompt.data(), prompt.data(), prompt.data(), prompt.data()};
    const std::int64_t np[] = {8, 8, 8, 8};
    CHECK(gdn_generate_batch(cc.c, ct.t, 4, pp, np, nullptr, nullptr, nullptr, &r) == GDN_STATUS_OUT_OF_CAPACITY);
    // Different mtp_draft in one batch.
    gdn_generation_params m1 = p, m2 = p;
    m2.mtp_draft = 1;
    const gdn_generation_params* mixed[] = {&m1, &m2};
    CHECK(gdn_generate_batch(cc.c, ct.t, 2, pp, np, mixed, nullptr, nullptr, &r) == GDN_STATUS_INVALID_ARGUMENT);
    // MTP on a context that cannot roll back, and on a model loaded without its MTP head.
    CContext no_rollback(cm.m, tiny_c_params(1, 0));
    q = p;
    q.mtp_draft = 2;
    CHECK(gdn_generate(no_rollback.c, ct.t, prompt.data(), 8, &q, nullptr, nullptr, &r) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("max_rollback_tokens"));
    CHECK(live_sequences(no_rollback.c) == 0);
    gdn_model_params mp = gdn_model_default_params();
    mp.load_mtp = false;
    gdn_model* no_mtp = nullptr;
    REQUIRE(gdn_model_load(tiny_dir.c_str(), &mp, &no_mtp) == GDN_STATUS_OK);
    CContext nm(no_mtp, tiny_c_params(1));
    gdn_model_free(no_mtp);
    CHECK(gdn_generate(nm.c, ct.t, prompt.data(), 8, &q, nullptr, nullptr, &r) == GDN_STATUS_UNSUPPORTED_MODEL);
    CHECK_THAT(last_error(), Catch::Contains("MTP"));
    CHECK(live_sequences(nm.c) == 0);
    // A prompt that overflows the context, an id past the vocabulary.
    std::vector<Token> long_prompt(300, prompt[0]);
    CHECK(gdn_generate(cc.c, ct.t, long_prompt.data(), 300, &p, nullptr, nullptr, &r) == GDN_STATUS_CONTEXT_OVERFLOW);
    const Token bad = 512;
    CHECK(gdn_generate(cc.c, ct.t, &bad, 1, &p, nullptr, nullptr, &r) == GDN_STATUS_INVALID_TOKEN);
    CHECK(r == nullptr);
    CHECK(live_sequences(cc.c) == 0);
    // Result accessors out of range.
    REQUIRE(gdn_generate(cc.c, ct.t, prompt.data(), 8, &p, nullptr, nullptr, &r) == GDN_STATUS_OK);
    const char* text = nullptr;
    std::size_t len = 0;
    CHECK(gdn_generation_result_text(r, 1, &text, &len) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(gdn_generation_result_text(r, -1, &text, &len) == GDN_STATUS_INVALID_ARGUMENT);
    gdn_generation_info small;
    small.size = 8;
    CHECK(gdn_generation_result_get_info(r, 0, &small) == GDN_STATUS_INVALID_ARGUMENT);
    gdn_generation_result_free(r);
  }
}

TEST_CASE("the gdn_speculative handle, driven by the host, equals plain greedy", "[capi][spec][tiny]") {
  Tiny cpp;
  GenerationParams gp;
  gp.max_tokens = 16;
  const std::vector<std::string> texts = {"reverse 12478 =", "copy 6275 =", "add 71+52="};
  std::vector<std::vector<Token>> plain;
  for (const auto& t : texts) plain.push_back(cpp.gen.generate(cpp.ids(t), gp).tokens);

  CModel cm(tiny_dir);
  gdn_context* ctx = nullptr;
  const gdn_context_params cp = tiny_c_params(3, 4);
  REQUIRE(gdn_context_create(cm.m, &cp, &ctx) == GDN_STATUS_OK);
  gdn_speculative_params sp = gdn_speculative_default_params();
  sp.max_draft = 3;
  sp.adaptive = false;
  gdn_speculative* spec = nullptr;
  REQUIRE(gdn_speculative_create(ctx, &sp, &spec) == GDN_STATUS_OK);

  std::vector<gdn_seq_id> seqs(texts.size());
  std::vector<std::vector<Token>> got(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    REQUIRE(gdn_seq_create(ctx, &seqs[i]) == GDN_STATUS_OK);
    gdn_sampler* s = nullptr;
    REQUIRE(gdn_sampler_create(nullptr, 512, &s) == GDN_STATUS_OK);
    const auto prompt = cpp.ids(texts[i]);
    gdn_token first = -1;
    REQUIRE(gdn_speculative_start(spec, seqs[i], prompt.data(), static_cast<std::int64_t>(prompt.size()), s, &first) ==
            GDN_STATUS_OK);
    gdn_sampler_free(s);  // the decoder holds it while the sequence runs
    got[i].push_back(first);
  }
  gdn_context_free(ctx);  // the decoder keeps the context alive

  // All three advance together until each reaches eos (0) or 16 tokens.
  std::vector<gdn_seq_id> live = seqs;
  std::vector<std::size_t> index = {0, 1, 2};
  const auto done = [&](std::size_t i) {
    return got[i].size() >= 16 || std::find(got[i].begin(), got[i].end(), 0) != got[i].end();
  };
  int rounds = 0;
  while (!live.empty()) {
    std::vector<std::array<gdn_token, 4>> bufs(live.size());
    std::vector<gdn_token*> outs;
    for (auto& b : bufs) outs.push_back(b.data());
    std::vector<std::int64_t> counts(live.size(), -1);
    REQUIRE(gdn_speculative_advance(spec, live.data(), static_cast<int32_t>(live.size()), outs.data(), 4, counts.data()) ==
            GDN_STATUS_OK);
    ++rounds;
    std::vector<gdn_seq_id> next_live;
    std::vector<std::size_t> next_index;
    for (std::size_t j = 0; j < live.size(); ++j) {
      REQUIRE(counts[j] >= 1);
      REQUIRE(counts[j] <= 4);
      got[index[j]].insert(got[index[j]].end(), bufs[j].begin(), bufs[j].begin() + counts[j]);
      if (done(index[j])) {
        REQUIRE(gdn_speculative_finish(spec, live[j]) == GDN_STATUS_OK);
      } else {
        next_live.push_back(live[j]);
        next_index.push_back(index[j]);
      }
    }
    live = next_live;
    index = next_index;
  }
  for (std::size_t i = 0; i < texts.size(); ++i) {
    INFO(texts[i]);
    // A round may run past eos; what comes before it is the answer.
    auto& g = got[i];
    const auto eos = std::find(g.begin(), g.end(), 0);
    if (eos != g.end()) g.erase(eos + 1, g.end());
    if (g.size() > 16) g.resize(16);
    CHECK(g == plain[i]);
  }
  gdn_speculative_stats st;
  st.size = sizeof st;
  REQUIRE(gdn_speculative_get_stats(spec, &st) == GDN_STATUS_OK);
  CHECK(st.rounds == rounds);
  CHECK(st.k == 3);
  CHECK(st.drafted > 0);
  CHECK(st.accepted > 0);
  CHECK(st.accepted <= st.drafted);
  CHECK(st.rounds < st.generated);  // more than one token per main-model step on average

  SECTION("refusals") {
    gdn_token buf[4];
    gdn_token* out[] = {buf};
    std::int64_t count = 0;
    const gdn_seq_id never = seqs[0];  // finished: no longer tracked
    CHECK(gdn_speculative_advance(spec, &never, 1, out, 4, &count) == GDN_STATUS_INVALID_SEQUENCE);
    CHECK(gdn_speculative_advance(spec, &never, 1, out, 3, &count) == GDN_STATUS_INVALID_ARGUMENT);  // < max_draft + 1
    CHECK(count == 0);
    gdn_sampler* s = nullptr;
    REQUIRE(gdn_sampler_create(nullptr, 512, &s) == GDN_STATUS_OK);
    const Token p1[] = {5, 6};
    gdn_token first = -1;
    CHECK(gdn_speculative_start(spec, seqs[0], p1, 2, s, &first) == GDN_STATUS_INVALID_ARGUMENT);  // not a fresh sequence
    CHECK(gdn_speculative_start(spec, seqs[0], p1, 0, s, &first) == GDN_STATUS_INVALID_ARGUMENT);
    CHECK(first == -1);
    gdn_sampler_free(s);
  }
  gdn_speculative_free(spec);

  SECTION("no MTP head, too little rollback, max_draft out of range") {
    gdn_context_params p0 = tiny_c_params(1, 3);
    CContext small_rollback(cm.m, p0);
    gdn_speculative* bad = nullptr;
    CHECK(gdn_speculative_create(small_rollback.c, &sp, &bad) == GDN_STATUS_INVALID_ARGUMENT);  // needs 4
    CHECK_THAT(last_error(), Catch::Contains("max_rollback_tokens >= 4"));
    sp.max_draft = 2;
    REQUIRE(gdn_speculative_create(small_rollback.c, &sp, &bad) == GDN_STATUS_OK);
    gdn_speculative_free(bad);
    bad = nullptr;
    sp.max_draft = 17;
    CHECK(gdn_speculative_create(small_rollback.c, &sp, &bad) == GDN_STATUS_INVALID_ARGUMENT);
    sp.max_draft = 2;
    sp.size = 1;
    CHECK(gdn_speculative_create(small_rollback.c, &sp, &bad) == GDN_STATUS_INVALID_ARGUMENT);
    CModel tied("qwen35_tied");
    gdn_context_params p1 = small_c_params(1);
    p1.max_rollback_tokens = 4;
    CContext no_mtp(tied.m, p1);
    CHECK(gdn_speculative_create(no_mtp.c, nullptr, &bad) == GDN_STATUS_UNSUPPORTED_MODEL);
    CHECK_THAT(last_error(), Catch::Contains("no MTP head"));
    CHECK(bad == nullptr);
  }
  SECTION("a round that could run past max_context is refused before any work") {
    CContext c2(cm.m, tiny_c_params(1, 4));
    gdn_speculative* s2 = nullptr;
    REQUIRE(gdn_speculative_create(c2.c, &sp, &s2) == GDN_STATUS_OK);  // max_draft 3: a round needs 4 positions
    gdn_seq_id q = 0;
    REQUIRE(gdn_seq_create(c2.c, &q) == GDN_STATUS_OK);
    gdn_sampler* s = nullptr;
    REQUIRE(gdn_sampler_create(nullptr, 512, &s) == GDN_STATUS_OK);
    const std::vector<Token> prompt(253, cpp.ids("7").front());
    gdn_token first = -1;
    REQUIRE(gdn_speculative_start(s2, q, prompt.data(), 253, s, &first) == GDN_STATUS_OK);
    gdn_token buf[4];
    gdn_token* out[] = {buf};
    std::int64_t count = -1;
    CHECK(gdn_speculative_advance(s2, &q, 1, out, 4, &count) == GDN_STATUS_CONTEXT_OVERFLOW);
    CHECK(count == -1);
    std::int64_t len = 0, mtp_len = 0;
    REQUIRE(gdn_seq_length(c2.c, q, &len) == GDN_STATUS_OK);
    REQUIRE(gdn_seq_mtp_length(c2.c, q, &mtp_len) == GDN_STATUS_OK);
    CHECK(len == 253);
    CHECK(mtp_len == 252);  // the MTP layer caught up on the prompt, and no further
    gdn_sampler_free(s);
    gdn_speculative_free(s2);
  }
  SECTION("a failed start puts the sampler back and leaves the sequence fresh") {
    CContext c2(cm.m, tiny_c_params(1, 4));
    gdn_speculative* s2 = nullptr;
    REQUIRE(gdn_speculative_create(c2.c, nullptr, &s2) == GDN_STATUS_OK);
    gdn_seq_id q = 0;
    REQUIRE(gdn_seq_create(c2.c, &q) == GDN_STATUS_OK);
    gdn_sampling_params pen = gdn_sampling_default_params();
    pen.repetition_penalty = 5.0f;  // the prompt's tokens would be penalised if the failed start had recorded them
    gdn_sampler* s = nullptr;
    REQUIRE(gdn_sampler_create(&pen, 512, &s) == GDN_STATUS_OK);
    // The answer to "add 31+13=" is "44": a sampler that had recorded the refused prompt's 4s
    // would penalise it.
    const auto prompt = cpp.ids("add 31+13=");
    std::vector<Token> bad_prompt = cpp.ids("4444 4 44 =");
    bad_prompt.push_back(512);
    gdn_token first = -1;
    CHECK(gdn_speculative_start(s2, q, bad_prompt.data(), static_cast<std::int64_t>(bad_prompt.size()), s, &first) ==
          GDN_STATUS_INVALID_TOKEN);
    CHECK(first == -1);
    std::int64_t len = -1;
    REQUIRE(gdn_seq_length(c2.c, q, &len) == GDN_STATUS_OK);
    CHECK(len == 0);
    REQUIRE(gdn_speculative_start(s2, q, prompt.data(), static_cast<std::int64_t>(prompt.size()), s, &first) == GDN_STATUS_OK);
    Sampler ref(SamplingParams{0.0f, 0, 1.0f, 0.0f, 5.0f, 0.0f, 0}, 512);
    Context c3(cpp.model, tiny_cpp_params(1, 4));
    SpeculativeDecoder d3(c3, SpeculativeParams{});
    const Token expect = d3.start(c3.create_sequence(), prompt, ref);
    CHECK(first == expect);
    CHECK(cpp.tok.decode(std::vector<Token>{first}) == "4");
    // The check has teeth: with the refused prompt recorded, the first token differs.
    Sampler polluted(SamplingParams{0.0f, 0, 1.0f, 0.0f, 5.0f, 0.0f, 0}, 512);
    polluted.observe(bad_prompt);
    Context c4(cpp.model, tiny_cpp_params(1, 4));
    SpeculativeDecoder d4(c4, SpeculativeParams{});
    CHECK(d4.start(c4.create_sequence(), prompt, polluted) != expect);
    gdn_sampler_free(s);
    gdn_speculative_free(s2);
  }
}
