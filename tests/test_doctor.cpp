// gdn doctor: it passes on every project checkpoint, and each check fails, naming the cause, on a
// copy broken on purpose (written here into temporary directories) or with the engine broken on
// purpose (FaultInjection, injected through the engine's test hook). The degeneration metrics are also tested on synthetic sequences.

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "gdn.h"
#include "engine/testing.hpp"
#include "gdn/diagnostics/doctor.hpp"
#include "safetensors_writer.hpp"
#include "test_util.hpp"

using namespace gdn;
using nlohmann::json;

namespace {

const char* const fixtures[] = {"qwen35_tied", "qwen35_cond_mtp", "qwen35_cond_mtp_single", "qwen35_f32params",
                                "qwen3next_dense"};

DoctorOptions quick() {
  DoctorOptions o;
  o.quick = true;
  o.threads = 2;
  return o;
}

// The project's trained model; GDN_DOCTOR_TRAINED_MODEL points the trained-model cases elsewhere.
std::string tiny_model() {
  const char* other = std::getenv("GDN_DOCTOR_TRAINED_MODEL");
  return other ? std::string(other) : std::string(GDN_SOURCE_DIR) + "/models/gdn-tiny";
}
bool have_tiny() { return std::filesystem::exists(tiny_model() + "/config.json"); }

const DoctorCheck& get(const DoctorReport& r, const std::string& name) {
  const DoctorCheck* c = r.find(name);
  INFO("check " << name);
  REQUIRE(c != nullptr);
  return *c;
}

Verdict verdict(const DoctorReport& r, const std::string& name) { return get(r, name).verdict; }

bool mentions(const DoctorCheck& c, const std::string& s) {
  if (c.message.find(s) != std::string::npos) return true;
  for (const auto& d : c.details)
    if (d.find(s) != std::string::npos) return true;
  return false;
}

// A copy of fixture/model `src` with `edit` applied to its tensors and `edit_config` to config.json.
template <typename EditTensors, typename EditConfig>
void broken_copy(const std::string& src, const test::TempDir& dst, EditTensors edit, EditConfig edit_config) {
  auto tensors = test::read_tensors(src);
  auto config = test::read_config(src);
  edit(tensors);
  edit_config(config);
  test::write_checkpoint(src, dst.str(), tensors, config);
}
void no_tensor_edit(test::TensorMap&) {}
void no_config_edit(json&) {}

bool is_zero_centred_norm(const std::string& n) {
  const auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
  return !ends("linear_attn.norm.weight") && (ends("layernorm.weight") || ends("q_norm.weight") || ends("k_norm.weight") ||
                                              n == "model.norm.weight" || n == "model.language_model.norm.weight" ||
                                              (n.rfind("mtp.", 0) == 0 && ends("norm.weight")));
}

// Value heads into GGUF order: value head j (paired with key head j / r) moves to position
// p = (j % r)·Hk + j / r, so that pairing head p with key head p % Hk (tiled) finds the same key
// head. Applied consistently to every per-value-head tensor of every GDN layer (separate layout).
void reorder_value_heads_to_tiled(test::TensorMap& t, const std::string& prefix, int Hk, int Hv, int dk, int dv) {
  const int r = Hv / Hk;
  std::vector<int> old_of_new(static_cast<std::size_t>(Hv));
  for (int p = 0; p < Hv; ++p) old_of_new[static_cast<std::size_t>(p)] = (p % Hk) * r + p / Hk;
  const std::int64_t Kd = static_cast<std::int64_t>(Hk) * dk;
  // Rows [offset + head·block, +block) of a [rows, cols] tensor.
  const auto permute_rows = [&](test::TensorData& d, std::int64_t offset, std::int64_t block) {
    const std::int64_t cols = d.numel() / d.shape[0];
    const std::size_t es = dtype_size(d.dtype), row_bytes = static_cast<std::size_t>(cols) * es;
    const auto orig = d.bytes;
    for (int p = 0; p < Hv; ++p)
      std::memcpy(d.bytes.data() + static_cast<std::size_t>(offset + p * block) * row_bytes,
                  orig.data() + static_cast<std::size_t>(offset + old_of_new[static_cast<std::size_t>(p)] * block) * row_bytes,
                  static_cast<std::size_t>(block) * row_bytes);
  };
  const auto permute_cols = [&](test::TensorData& d, std::int64_t block) {
    const std::int64_t rows = d.shape[0], cols = d.shape[1];
    const std::size_t es = dtype_size(d.dtype);
    const auto orig = d.bytes;
    for (std::int64_t i = 0; i < rows; ++i)
      for (int p = 0; p < Hv; ++p)
        std::memcpy(d.bytes.data() + static_cast<std::size_t>(i * cols + p * block) * es,
                    orig.data() + static_cast<std::size_t>(i * cols + old_of_new[static_cast<std::size_t>(p)] * block) * es,
                    static_cast<std::size_t>(block) * es);
  };
  for (int layer = 0;; ++layer) {
    const std::string g = fmt::format("{}layers.{}.linear_attn.", prefix, layer);
    if (!t.count(fmt::format("{}layers.{}.input_layernorm.weight", prefix, layer))) break;
    if (!t.count(g + "in_proj_qkv.weight")) continue;  // an attention layer
    permute_rows(t.at(g + "in_proj_qkv.weight"), 2 * Kd, dv);
    permute_rows(t.at(g + "conv1d.weight"), 2 * Kd, dv);
    permute_rows(t.at(g + "in_proj_z.weight"), 0, dv);
    permute_rows(t.at(g + "in_proj_b.weight"), 0, 1);
    permute_rows(t.at(g + "in_proj_a.weight"), 0, 1);
    permute_rows(t.at(g + "A_log"), 0, 1);
    permute_rows(t.at(g + "dt_bias"), 0, 1);
    permute_cols(t.at(g + "out_proj.weight"), dv);
  }
}

void reorder_model_dir(const std::string& src, const test::TempDir& dst) {
  const auto cfg = load_model_config(src);
  REQUIRE(cfg.gdn_layout == GdnProjectionLayout::separate);
  auto tensors = test::read_tensors(src);
  const std::string prefix = tensors.count("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  reorder_value_heads_to_tiled(tensors, prefix, cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                               cfg.linear_key_head_dim, cfg.linear_value_head_dim);
  test::write_checkpoint(src, dst.str(), tensors, test::read_config(src));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Degeneration metrics on synthetic sequences.

TEST_CASE("degeneration metrics: collapse fails, looping warns, varied text passes", "[doctor][metrics]") {
  const std::vector<Token> prime(64, 4321);  // "prime prime prime ..."
  auto s = generation_stats(prime);
  CHECK(s.tokens == 64);
  CHECK(s.entropy_bits == Approx(0.0));
  CHECK(s.distinct_ratio == Approx(1.0 / 64));
  CHECK(s.repeated_ngram_rate == Approx(60.0 / 61));  // every 4-gram after the first repeats
  CHECK(classify_generation(s) == Verdict::fail);

  std::vector<Token> my_my;  // "my my my" with a period now and then: still one or two tokens
  for (int i = 0; i < 64; ++i) my_my.push_back(i % 9 == 8 ? 13 : 1820);
  s = generation_stats(my_my);
  CHECK(s.entropy_bits < doctor_limits::degenerate_entropy_bits);
  CHECK(classify_generation(s) == Verdict::fail);

  std::vector<Token> two_cycle;  // "! ?" alternating: 1 bit
  for (int i = 0; i < 64; ++i) two_cycle.push_back(i % 2 ? 0 : 5);
  CHECK(generation_stats(two_cycle).entropy_bits == Approx(1.0));
  CHECK(classify_generation(generation_stats(two_cycle)) == Verdict::fail);

  std::vector<Token> phrase_loop;  // a 7-token phrase over and over: looping, not collapsed
  for (int i = 0; i < 64; ++i) phrase_loop.push_back(100 + i % 7);
  s = generation_stats(phrase_loop);
  CHECK(s.entropy_bits == Approx(std::log2(7.0)).epsilon(0.02));
  CHECK(s.repeated_ngram_rate > doctor_limits::looping_repeated_4gram_rate);
  CHECK(classify_generation(s) == Verdict::warn);

  std::vector<Token> varied(64);  // text-like: some repeats, no loop
  std::uint64_t x = 12345;
  for (auto& t : varied) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    t = static_cast<Token>((x >> 33) % 40);
  }
  s = generation_stats(varied);
  CHECK(s.entropy_bits > 4.0);
  CHECK(s.repeated_ngram_rate < 0.1);
  CHECK(classify_generation(s) == Verdict::pass);

  // Exact figures on a small case: a b a b a → 4-grams abab, baba (none repeated); bigrams ab ba ab ba.
  const std::vector<Token> abab = {1, 2, 1, 2, 1};
  CHECK(generation_stats(abab, 4).repeated_ngram_rate == Approx(0.0));
  CHECK(generation_stats(abab, 2).repeated_ngram_rate == Approx(0.5));
  CHECK(generation_stats(abab).distinct_ratio == Approx(0.4));
  CHECK(classify_generation(generation_stats(std::vector<Token>{7, 7, 7})) == Verdict::pass);  // too short to judge
}

// ---------------------------------------------------------------------------------------------
// Good checkpoints pass.

TEST_CASE("gdn doctor passes on every fixture checkpoint", "[doctor]") {
  for (const std::string name : fixtures) {
    const auto r = run_doctor(test::fixture_model(name), quick());
    INFO(r.to_table());
    CHECK(r.ok());
    CHECK(r.count(Verdict::fail) == 0);
    for (const char* c : {"config.architecture", "config.fields", "config.state_dtype", "config.weights", "weights.finite",
                          "weights.norm_convention", "weights.gated_norm", "weights.A_log", "weights.dt_bias",
                          "identity.chunked_vs_recurrent", "identity.split_prefill", "identity.prefill_vs_decode",
                          "identity.batch_vs_alone", "identity.bf16_state_drift", "generation.degeneration"})
      CHECK(verdict(r, c) == Verdict::pass);
    // Random weights predict nothing: the value-head probe says so instead of guessing.
    CHECK(verdict(r, "gdn.value_head_grouping") == Verdict::skip);
    CHECK(get(r, "identity.chunked_vs_recurrent").measured <= doctor_limits::identity_logits);
    CHECK(get(r, "identity.batch_vs_alone").measured == 0.0);
    WARN(fmt::format("{}: chunked vs recurrent {:.2g}, split prefill {:.2g}, prefill vs decode {:.2g}, bf16 drift {:.2g}, "
                     "norm mean {:.3g}, gated norm mean {:.3g}, median entropy {:.3g} bits ({:.1f} s)",
                     name, get(r, "identity.chunked_vs_recurrent").measured, get(r, "identity.split_prefill").measured,
                     get(r, "identity.prefill_vs_decode").measured, get(r, "identity.bf16_state_drift").measured,
                     get(r, "weights.norm_convention").measured, get(r, "weights.gated_norm").measured,
                     get(r, "generation.degeneration").measured, r.seconds));
  }
}

TEST_CASE("the doctor's report as JSON", "[doctor]") {
  const auto r = run_doctor(test::fixture_model("qwen35_cond_mtp"), quick());
  const json j = json::parse(r.to_json());
  CHECK(j["ok"] == true);
  CHECK(j["model_dir"] == test::fixture_model("qwen35_cond_mtp"));
  REQUIRE(j["checks"].size() == r.checks.size());
  CHECK(j["counts"]["FAIL"] == 0);
  int n = 0;
  for (const auto& c : j["checks"]) {
    CHECK(c.contains("name"));
    CHECK(c.contains("verdict"));
    CHECK(c.contains("message"));
    if (c["name"] == "identity.chunked_vs_recurrent") {
      CHECK(c["verdict"] == "PASS");
      CHECK(c["measured"].is_number());
      CHECK(c["threshold"].is_string());
      ++n;
    }
  }
  CHECK(n == 1);
  const std::string table = r.to_table();
  CHECK(table.find("identity.prefill_vs_decode") != std::string::npos);
  CHECK(table.find("no check failed") != std::string::npos);
}

TEST_CASE("gdn doctor passes on the trained tiny model, value-head pairing measured", "[doctor][tiny]") {
  if (!have_tiny()) {
    WARN("SKIPPED: models/gdn-tiny is not there (tools/train_tiny/train.py writes it)");
    return;
  }
  const auto r = run_doctor(tiny_model(), quick());
  INFO(r.to_table());
  CHECK(r.ok());
  CHECK(verdict(r, "gdn.value_head_grouping") == Verdict::pass);
  CHECK(verdict(r, "config.tokenizer") == Verdict::pass);
  CHECK(verdict(r, "generation.degeneration") != Verdict::fail);
  WARN("gdn-tiny: " << get(r, "gdn.value_head_grouping").message);
  // The silent failure itself: with the conv state dropped at every step the trained model answers
  // "99999999..." and the degeneration probe, not only the identities, says so.
  DoctorOptions o = quick();
  o.faults.drop_conv_state = true;
  const auto rd = run_doctor(tiny_model(), o);
  INFO(rd.to_table());
  CHECK(verdict(rd, "generation.degeneration") == Verdict::fail);
  CHECK(verdict(rd, "identity.prefill_vs_decode") == Verdict::fail);
}

// A quantised model is still the same GDN model: every identity holds (the quantised kernels are
// deterministic and batch-invariant), the trained model still pairs value heads grouped and does
// not degenerate, at either format.
TEST_CASE("gdn doctor passes on the quantised models (q8_0, q4_0, q4_k, q4_k_m)", "[doctor][quant]") {
  for (const WeightQuant q : {WeightQuant::q8_0, WeightQuant::q4_0, WeightQuant::q4_k, WeightQuant::q4_k_m}) {
    for (const std::string& dir : {test::fixture_model("qwen35_cond_mtp"), test::fixture_model("qwen3next_dense"), tiny_model()}) {
      if (dir == tiny_model() && !have_tiny()) continue;
      DoctorOptions o = quick();
      o.load.quant = q;
      const auto r = run_doctor(dir, o);
      INFO(weight_quant_name(q) << " " << dir << "\n" << r.to_table());
      CHECK(r.ok());
      for (const char* c : {"identity.chunked_vs_recurrent", "identity.split_prefill", "identity.prefill_vs_decode",
                            "identity.batch_vs_alone"})
        CHECK(verdict(r, c) == Verdict::pass);
      CHECK(get(r, "identity.batch_vs_alone").measured == 0.0);
      if (dir == tiny_model()) {
        CHECK(verdict(r, "gdn.value_head_grouping") == Verdict::pass);
        CHECK(verdict(r, "generation.degeneration") != Verdict::fail);
      }
      WARN(fmt::format("{} {}: chunked vs recurrent {:.2g}, split prefill {:.2g}, prefill vs decode {:.2g}",
                       weight_quant_name(q), std::filesystem::path(dir).filename().string(),
                       get(r, "identity.chunked_vs_recurrent").measured, get(r, "identity.split_prefill").measured,
                       get(r, "identity.prefill_vs_decode").measured));
    }
  }
  // The looser quantised bound still catches the known server bug.
  DoctorOptions o = quick();
  o.load.quant = WeightQuant::q4_0;
  o.faults.drop_conv_state = true;
  const auto rd = run_doctor(test::fixture_model("qwen35_cond_mtp"), o);
  INFO(rd.to_table());
  CHECK(verdict(rd, "identity.prefill_vs_decode") == Verdict::fail);
}

// ---------------------------------------------------------------------------------------------
// Broken copies fail, naming the cause.

TEST_CASE("doctor: (1+w) norms with the +1 baked in fail the norm fingerprint, naming the tensors", "[doctor][broken]") {
  test::TempDir dir("norm_plus_one");
  broken_copy(test::fixture_model("qwen35_tied"), dir, [](test::TensorMap& t) {
    for (auto& [name, d] : t)
      if (is_zero_centred_norm(name)) d.map_floats([](float x) { return x + 1.0f; });
  }, no_config_edit);
  const auto r = run_doctor(dir.str(), quick());
  INFO(r.to_table());
  CHECK_FALSE(r.ok());
  const auto& c = get(r, "weights.norm_convention");
  CHECK(c.verdict == Verdict::fail);
  CHECK(mentions(c, "baked in"));
  CHECK(mentions(c, "model.layers.0.input_layernorm.weight"));
  CHECK(mentions(c, "model.norm.weight"));
  CHECK(c.measured == Approx(1.0).margin(0.05));
  CHECK(verdict(r, "weights.gated_norm") == Verdict::pass);
}

TEST_CASE("doctor: a zero-centred (or zeroed) GDN gated norm fails, naming the tensors", "[doctor][broken]") {
  test::TempDir dir("gated_norm_minus_one");
  broken_copy(test::fixture_model("qwen35_f32params"), dir, [](test::TensorMap& t) {
    for (auto& [name, d] : t)
      if (name.find("linear_attn.norm.weight") != std::string::npos) d.map_floats([](float x) { return x - 1.0f; });
  }, no_config_edit);
  const auto r = run_doctor(dir.str(), quick());
  const auto& c = get(r, "weights.gated_norm");
  INFO(r.to_table());
  CHECK(c.verdict == Verdict::fail);
  CHECK(mentions(c, "model.layers.0.linear_attn.norm.weight"));
  CHECK(verdict(r, "weights.norm_convention") == Verdict::pass);
}

TEST_CASE("doctor: value heads in GGUF (tiled) order", "[doctor][broken]") {
  // The reordering is exact: the reordered copy run with tiled pairing is the original model.
  test::TempDir dir("vheads_tiled");
  reorder_model_dir(test::fixture_model("qwen35_tied"), dir);
  {
    auto original = Model::load(test::fixture_model("qwen35_tied"));
    auto reordered = Model::load(dir.str());
    ContextParams p;
    p.max_sequences = 1;
    p.max_context = 256;
    p.threads = 2;
    p.max_logits_rows = 256;
    FaultInjection tiled;
    tiled.tiled_value_heads = true;
    test::Reference ref("qwen35_tied");
    const auto tokens = ref.tokens("prompt4.tokens");
    Context a(original, p), c(reordered, p);
    const auto b_owner = detail::make_context_for_tests(reordered, p, tiled);
    Context& b = *b_owner;
    const auto la = test::prefill_logits(a, tokens), lb = test::prefill_logits(b, tokens), lc = test::prefill_logits(c, tokens);
    CHECK(test::max_abs_diff(la.data(), lb.data(), la.size()) < 1e-4f);
    CHECK(test::max_abs_diff(la.data(), lc.data(), la.size()) > 0.1f);  // read grouped, it is another model
  }
  // Random weights predict no text, so on a fixture the probe must not guess: SKIP, not a false
  // PASS or FAIL. (Identities still hold: they are true for any weights.)
  const auto r = run_doctor(dir.str(), quick());
  INFO(r.to_table());
  CHECK(verdict(r, "gdn.value_head_grouping") == Verdict::skip);
  CHECK(verdict(r, "identity.chunked_vs_recurrent") == Verdict::pass);

  // On the trained model the probe decides: the reordered copy FAILs, naming the cause.
  if (!have_tiny()) {
    WARN("SKIPPED (trained model): models/gdn-tiny is not there");
    return;
  }
  test::TempDir tiny("tiny_vheads_tiled");
  reorder_model_dir(tiny_model(), tiny);
  const auto rt = run_doctor(tiny.str(), quick());
  INFO(rt.to_table());
  const auto& c = get(rt, "gdn.value_head_grouping");
  CHECK(c.verdict == Verdict::fail);
  CHECK(mentions(c, "value heads look tiled (GGUF order)"));
  CHECK_FALSE(rt.ok());
  // And the engine told to pair tiled on the good model fails the same check.
  DoctorOptions o = quick();
  o.faults.tiled_value_heads = true;
  const auto rf = run_doctor(tiny_model(), o);
  CHECK(verdict(rf, "gdn.value_head_grouping") == Verdict::fail);
}

TEST_CASE("doctor: a config asking for a bf16 recurrent state fails, naming mamba_ssm_dtype", "[doctor][broken]") {
  test::TempDir dir("bf16_state");
  broken_copy(test::fixture_model("qwen35_tied"), dir, no_tensor_edit, [](json& c) { c["mamba_ssm_dtype"] = "bfloat16"; });
  const auto r = run_doctor(dir.str(), quick());
  INFO(r.to_table());
  CHECK_FALSE(r.ok());
  const auto& c = get(r, "config.state_dtype");
  CHECK(c.verdict == Verdict::fail);
  CHECK(mentions(c, "mamba_ssm_dtype"));
  CHECK(mentions(c, "degeneration"));
  // The measured drift backs it up: above the bound while the state is bf16.
  CHECK(verdict(r, "identity.bf16_state_drift") == Verdict::fail);
  CHECK(get(r, "identity.bf16_state_drift").measured > doctor_limits::bf16_state_drift);
  // Forcing it from the options is the same finding.
  DoctorOptions o = quick();
  o.state_dtype = DType::bf16;
  CHECK(verdict(run_doctor(test::fixture_model("qwen35_tied"), o), "config.state_dtype") == Verdict::fail);
}

TEST_CASE("doctor: a conv state dropped between steps fails the prefill identities", "[doctor][broken]") {
  for (const std::string name : {"qwen35_tied", "qwen3next_dense"}) {
    DoctorOptions o = quick();
    o.faults.drop_conv_state = true;
    const auto r = run_doctor(test::fixture_model(name), o);
    INFO(r.to_table());
    CHECK_FALSE(r.ok());
    CHECK(verdict(r, "identity.split_prefill") == Verdict::fail);
    CHECK(verdict(r, "identity.prefill_vs_decode") == Verdict::fail);
    CHECK(get(r, "identity.prefill_vs_decode").measured > 100 * doctor_limits::identity_logits);
    CHECK(verdict(r, "identity.chunked_vs_recurrent") == Verdict::pass);  // one step each: not this bug
  }
}

TEST_CASE("doctor: a model that repeats one token fails the degeneration probe", "[doctor][broken]") {
  // Final norm weight -1: (1 + w) = 0, every logit 0, greedy picks token 0 forever.
  test::TempDir dir("repeat");
  broken_copy(test::fixture_model("qwen35_tied"), dir, [](test::TensorMap& t) {
    t.at("model.norm.weight").map_floats([](float) { return -1.0f; });
  }, no_config_edit);
  const auto r = run_doctor(dir.str(), quick());
  INFO(r.to_table());
  const auto& c = get(r, "generation.degeneration");
  CHECK(c.verdict == Verdict::fail);
  CHECK(mentions(c, "collapsed"));
  CHECK(c.measured < doctor_limits::degenerate_entropy_bits);
  CHECK_FALSE(r.ok());
}

TEST_CASE("doctor: config and tensors that disagree fail config.weights, naming the tensors", "[doctor][broken]") {
  SECTION("config truncates the model: unused layers") {
    test::TempDir dir("truncated");
    broken_copy(test::fixture_model("qwen35_tied"), dir, no_tensor_edit, [](json& c) {
      c["num_hidden_layers"] = 4;
      c["layer_types"] = json::array({"linear_attention", "linear_attention", "linear_attention", "full_attention"});
    });
    const auto r = run_doctor(dir.str(), quick());
    INFO(r.to_table());
    const auto& c = get(r, "config.weights");
    CHECK(c.verdict == Verdict::fail);
    CHECK(mentions(c, "model.layers.4."));
    CHECK(c.measured > 0);
    CHECK_FALSE(r.ok());
  }
  SECTION("a size the tensors contradict: the model does not load, the probes skip") {
    test::TempDir dir("wrong_ffn");
    broken_copy(test::fixture_model("qwen35_tied"), dir, no_tensor_edit, [](json& c) { c["intermediate_size"] = 96; });
    const auto r = run_doctor(dir.str(), quick());
    INFO(r.to_table());
    const auto& c = get(r, "config.weights");
    CHECK(c.verdict == Verdict::fail);
    CHECK(mentions(c, "mlp.gate_proj.weight"));
    CHECK(verdict(r, "identity.chunked_vs_recurrent") == Verdict::skip);
    CHECK(verdict(r, "weights.norm_convention") == Verdict::pass);  // the raw look still works
    CHECK_FALSE(r.ok());
  }
  SECTION("an architecture libgdn does not run") {
    test::TempDir dir("llama");
    broken_copy(test::fixture_model("qwen35_tied"), dir, no_tensor_edit, [](json& c) {
      c["architectures"] = json::array({"LlamaForCausalLM"});
      c["model_type"] = "llama";
    });
    const auto r = run_doctor(dir.str(), quick());
    INFO(r.to_table());
    CHECK(verdict(r, "config.architecture") == Verdict::fail);
    CHECK(mentions(get(r, "config.architecture"), "LlamaForCausalLM"));
    CHECK_FALSE(r.ok());
  }
  SECTION("tied embeddings with a different lm_head in the file") {
    test::TempDir dir("tied_head");
    broken_copy(test::fixture_model("qwen35_tied"), dir, [](test::TensorMap& t) {
      auto head = t.at("model.embed_tokens.weight");
      head.map_floats([](float x) { return -x; });
      t.emplace("lm_head.weight", std::move(head));
    }, no_config_edit);
    const auto r = run_doctor(dir.str(), quick());
    const auto& c = get(r, "config.weights");
    CHECK(c.verdict == Verdict::fail);
    CHECK(mentions(c, "lm_head.weight"));
  }
}

TEST_CASE("doctor: unknown and ignored config fields are listed", "[doctor]") {
  test::TempDir dir("fields");
  broken_copy(test::fixture_model("qwen35_cond_mtp"), dir, no_tensor_edit, [](json& c) {
    c["text_config"]["frobnication_factor"] = 3;
    c["text_config"]["rope_parameters"]["beta_fast"] = 32;
    c["text_config"]["rope_parameters"].erase("partial_rotary_factor");
  });
  const auto r = run_doctor(dir.str(), quick());
  const auto& c = get(r, "config.fields");
  INFO(r.to_table());
  CHECK(mentions(c, "unknown (not read by libgdn): text_config.frobnication_factor"));
  CHECK(mentions(c, "text_config.rope_parameters.beta_fast"));
  CHECK(mentions(c, "ignored (no effect on text inference): vision_config"));
  CHECK(c.measured == 2.0);
  // A field whose default is wrong for this family and that no shape can confirm is a WARN.
  CHECK(c.verdict == Verdict::warn);
  CHECK(mentions(c, "partial_rotary_factor absent"));
}

TEST_CASE("doctor: A_log holding A itself and NaN weights fail, naming the tensors", "[doctor][broken]") {
  test::TempDir dir("alog_nan");
  broken_copy(test::fixture_model("qwen35_f32params"), dir, [](test::TensorMap& t) {
    t.at("model.layers.1.linear_attn.A_log").map_floats([](float x) { return std::exp(x) * 1e4f; });
    auto& m = t.at("model.layers.2.mlp.up_proj.weight");
    auto v = m.floats();
    v[17] = std::numeric_limits<float>::quiet_NaN();
    m.set_floats(v);
  }, no_config_edit);
  const auto r = run_doctor(dir.str(), quick());
  INFO(r.to_table());
  CHECK(verdict(r, "weights.A_log") == Verdict::fail);
  CHECK(mentions(get(r, "weights.A_log"), "model.layers.1.linear_attn.A_log"));
  CHECK(verdict(r, "weights.finite") == Verdict::fail);
  CHECK(mentions(get(r, "weights.finite"), "model.layers.2.mlp.up_proj.weight"));
}

TEST_CASE("gdn doctor CLI: exit status 0 on a good checkpoint, 1 on a broken one, JSON on stdout", "[doctor][cli]") {
  const std::string gdn = std::string(GDN_BINARY_DIR) + "/bin/gdn";
  if (!std::filesystem::exists(gdn)) {
    WARN("SKIPPED: the gdn tool is not built");
    return;
  }
  test::TempDir out("cli");
  const std::string json_path = out.str() + "/report.json";
  const auto run = [&](const std::string& dir, const std::string& extra) {
    const int rc = std::system(fmt::format("'{}' doctor '{}' --quick --threads 2 {} > '{}' 2> /dev/null", gdn, dir, extra, json_path).c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  CHECK(run(test::fixture_model("qwen35_tied"), "--json") == 0);
  {
    std::ifstream in(json_path);
    const json j = json::parse(in);
    CHECK(j["ok"] == true);
  }
  CHECK(run(test::fixture_model("qwen35_tied"), "--json --fault drop-conv-state") == 1);
  {
    std::ifstream in(json_path);
    const json j = json::parse(in);
    CHECK(j["ok"] == false);
    CHECK(j["counts"]["FAIL"].get<int>() >= 2);
  }
  CHECK(run(test::fixture_model("qwen35_tied"), "--state-dtype bf16") == 1);
  CHECK(run(test::fixture_model("qwen35_tied"), "--no-such-flag") == 2);
}

TEST_CASE("gdn_doctor_run: the C ABI's report and verdict", "[doctor][capi]") {
  gdn_doctor_params p = gdn_doctor_default_params();
  p.quick = true;
  p.threads = 2;
  const std::string good = test::fixture_model("qwen35_tied");
  int32_t n_fail = -1;
  const char* report = nullptr;
  REQUIRE(gdn_doctor_run(good.c_str(), &p, &report, &n_fail) == GDN_STATUS_OK);
  CHECK(n_fail == 0);
  REQUIRE(report != nullptr);
  const json j = json::parse(report);
  CHECK(j["ok"] == true);
  CHECK(j["model_dir"] == good);
  // A fault: FAILs counted, the status is still OK (the doctor ran).
  p.faults = GDN_DOCTOR_FAULT_DROP_CONV_STATE;
  REQUIRE(gdn_doctor_run(good.c_str(), &p, &report, &n_fail) == GDN_STATUS_OK);
  CHECK(n_fail >= 2);
  CHECK(json::parse(report)["ok"] == false);
  // Refused arguments.
  p.faults = 1u << 7;
  CHECK(gdn_doctor_run(good.c_str(), &p, nullptr, &n_fail) == GDN_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(gdn_last_error()).find("fault") != std::string::npos);
  CHECK(gdn_doctor_run(nullptr, nullptr, nullptr, nullptr) == GDN_STATUS_INVALID_ARGUMENT);
  gdn_doctor_params wrong = gdn_doctor_default_params();
  wrong.size = 3;
  CHECK(gdn_doctor_run(good.c_str(), &wrong, nullptr, nullptr) == GDN_STATUS_INVALID_ARGUMENT);
  // A checkpoint that is not there is a report with FAILs, not an error.
  REQUIRE(gdn_doctor_run("/nonexistent/model", nullptr, &report, &n_fail) == GDN_STATUS_OK);
  CHECK(n_fail >= 1);
}

// Not run by default: `test_doctor "[.demo]"` with GDN_DOCTOR_DEMO_DIR set writes the broken copies
// there, to run `gdn doctor` on them by hand.
TEST_CASE("write the broken copies for inspection", "[.demo]") {
  const char* out = std::getenv("GDN_DOCTOR_DEMO_DIR");
  if (out == nullptr) {
    WARN("set GDN_DOCTOR_DEMO_DIR");
    return;
  }
  namespace fs = std::filesystem;
  const std::string src = test::fixture_model("qwen35_tied");
  const auto write = [&](const std::string& name, auto edit, auto edit_config) {
    const fs::path dst = fs::path(out) / name;
    fs::create_directories(dst);
    auto tensors = test::read_tensors(src);
    auto config = test::read_config(src);
    edit(tensors);
    edit_config(config);
    test::write_checkpoint(src, dst.string(), tensors, config);
  };
  write("norm_plus_one", [](test::TensorMap& t) {
    for (auto& [name, d] : t)
      if (is_zero_centred_norm(name)) d.map_floats([](float x) { return x + 1.0f; });
  }, no_config_edit);
  write("bf16_state", no_tensor_edit, [](json& c) { c["mamba_ssm_dtype"] = "bfloat16"; });
  write("repeat", [](test::TensorMap& t) { t.at("model.norm.weight").map_floats([](float) { return -1.0f; }); }, no_config_edit);
  if (have_tiny()) {
    const fs::path dst = fs::path(out) / "tiny_vheads_tiled";
    fs::create_directories(dst);
    test::TempDir tmp("demo");
    reorder_model_dir(tiny_model(), tmp);
    for (const auto& e : fs::directory_iterator(tmp.str()))
      if (e.is_regular_file()) fs::copy_file(e.path(), dst / e.path().filename(), fs::copy_options::overwrite_existing);
  }
}
