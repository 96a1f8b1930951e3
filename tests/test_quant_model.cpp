// Quantised models end to end (docs/quantization.md), on the committed fixtures:
//   - against an independent reference: the test quantises every projection itself (its own
//     rounding code, its own float → half), writes the dequantised values as an f32 checkpoint and
//     runs that through the float path; the quantised model may differ only by its activations'
//     int8 rounding (two parts for q8_0, 8 bits for the 4-bit formats);
//   - the format's own error: the quantised model's logits vs the float model's, max and RMS, with
//     stated bounds (random-weight fixtures amplify weight noise; gdn-tiny's task accuracy,
//     test_tiny_model, is the measure of what quantisation costs a trained model).

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/linear.hpp"
#include "backend/cpu/quant.hpp"
#include "gdn/io/tokenizer.hpp"
#include "safetensors_writer.hpp"
#include "test_util.hpp"

using namespace gdn;
using gdn::test::rms_diff;

namespace {

// The IEEE half nearest to x (ties to even; saturating), found by bisection over the bit patterns
// of the positive halves, which increase with their value: independent of the library's converter.
float nearest_half(float x) {
  const float a = std::fabs(x);
  auto value = [](std::uint16_t bits) { return to_float(f16{bits}); };
  std::uint16_t lo = 0, hi = 0x7bff;
  if (a >= value(hi)) return std::copysign(value(hi), x);
  while (hi - lo > 1) {
    const auto mid = static_cast<std::uint16_t>((lo + hi) / 2);
    (value(mid) <= a ? lo : hi) = mid;
  }
  const float below = a - value(lo), above = value(hi) - a;
  const std::uint16_t pick = below < above ? lo : above < below ? hi : (lo & 1u) ? hi : lo;
  return std::copysign(value(pick), x);
}

// One row of a weight, block-quantised and dequantised as the format states: blocks of 32 input
// columns, q8_0 d = max|w| / 127, q = round(w / d) in [-127, 127]; q4_0 d = m / -8 (m the block's
// value of largest magnitude), q = clamp(round(w / d), -8, 7); q5_0 d = m / -16, q in [-16, 15];
// d rounded to half first. q4_k's fitted scales are the library's own (the row packed alone, then
// read back value by value): test_quant checks the fit, this test that the model reads what was
// packed.
void quantize_row(cpu::QuantFormat q, float* w, std::int64_t in) {
  if (q == cpu::QuantFormat::q4_k) {
    TensorView row;
    row.dtype = DType::f32;
    row.rank = 2;
    row.shape[0] = 1;
    row.shape[1] = in;
    row.data = reinterpret_cast<const std::byte*>(w);
    std::vector<std::uint16_t> image(cpu::weight_image_elements(cpu::WeightImage::q4_k, 1, in));
    cpu::pack_weight_image(cpu::WeightImage::q4_k, row, 0, 1, image.data());
    const auto* bytes = reinterpret_cast<const std::byte*>(image.data());
    std::vector<float> v(static_cast<std::size_t>(in));
    for (std::int64_t k = 0; k < in; ++k) v[static_cast<std::size_t>(k)] = cpu::quant_image_value(cpu::QuantFormat::q4_k, bytes, 1, in, 0, k);
    std::copy(v.begin(), v.end(), w);
    return;
  }
  for (std::int64_t b = 0; b < in; b += 32) {
    const std::int64_t n = std::min<std::int64_t>(32, in - b);
    float m = 0.0f;
    for (std::int64_t j = 0; j < n; ++j)
      if (std::fabs(w[b + j]) > std::fabs(m)) m = w[b + j];
    const float zero = q == cpu::QuantFormat::q5_0 ? 16.0f : 8.0f;
    const float d = nearest_half(q == cpu::QuantFormat::q8_0 ? std::fabs(m) / 127.0f : m / -zero);
    const float lo = q == cpu::QuantFormat::q8_0 ? -127.0f : -zero, hi = q == cpu::QuantFormat::q8_0 ? 127.0f : zero - 1.0f;
    for (std::int64_t j = 0; j < n; ++j)
      w[b + j] = d == 0.0f ? 0.0f : d * std::clamp(std::nearbyint(w[b + j] / d), lo, hi);
  }
}

// The projections the policy quantises: every 2-D weight of the language model and its MTP head
// but the embeddings (a vision tower's weights are not the language model's).
bool is_projection(const std::string& name, const test::TensorData& t) {
  return t.shape.size() == 2 && name.find("embed_tokens") == std::string::npos && name.find("visual.") == std::string::npos;
}

// q4_k_m's projections at q8_0, restated: in decoder layer i of n with i < n/8, i ≥ 7n/8 or
// (i − n/8) mod 3 = 2 (llama.cpp's Q4_K_M rule), the attention v_proj, GDN in_proj_qkv and MLP
// down_proj (not the MTP head's).
bool more_bits(const std::string& name, int layers) {
  std::size_t at = std::string::npos;
  for (const std::string prefix : {"model.layers.", "model.language_model.layers."})
    if (name.starts_with(prefix)) at = prefix.size();
  if (at == std::string::npos) return false;
  const int i = std::stoi(name.substr(at));
  const bool layer = i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2;
  return layer && (name.ends_with("self_attn.v_proj.weight") || name.ends_with("linear_attn.in_proj_qkv.weight") ||
                   name.ends_with("linear_attn.in_proj_qkvz.weight") || name.ends_with("mlp.down_proj.weight"));
}

cpu::QuantFormat format_of(WeightQuant q) {
  return q == WeightQuant::q8_0 ? cpu::QuantFormat::q8_0 : q == WeightQuant::q4_0 ? cpu::QuantFormat::q4_0 : cpu::QuantFormat::q4_k;
}

// `src` with every projection replaced by its dequantised values, as float32, in `dst`: the
// lm_head (an untied checkpoint's lm_head.weight) at `lm_head`, the rest at `q` (q4_k_m: q4_k, q8_0
// where it gives more bits, and q5_0 for the rest where rows are not whole super-blocks of 256).
int write_dequantized(const std::string& src, const std::string& dst, WeightQuant q, WeightQuant lm_head) {
  test::TensorMap tensors = test::read_tensors(src);
  const nlohmann::json config = test::read_config(src);
  const int layers = config.value("text_config", config)["num_hidden_layers"].get<int>();
  int n = 0;
  for (auto& [name, t] : tensors) {
    if (!is_projection(name, t)) continue;
    std::vector<float> v = t.floats();
    const WeightQuant base = q == WeightQuant::q4_k_m ? (more_bits(name, layers) ? WeightQuant::q8_0 : WeightQuant::q4_k) : q;
    cpu::QuantFormat f = format_of(name == "lm_head.weight" ? lm_head : base);
    if (q == WeightQuant::q4_k_m && f == cpu::QuantFormat::q4_k && t.shape[1] % 256 != 0) f = cpu::QuantFormat::q5_0;
    for (std::int64_t r = 0; r < t.shape[0]; ++r) quantize_row(f, v.data() + r * t.shape[1], t.shape[1]);
    t.dtype = DType::f32;
    t.bytes.resize(v.size() * sizeof(float));
    t.set_floats(v);
    ++n;
  }
  test::write_checkpoint(src, dst, tensors, test::read_config(src));
  return n;
}

ContextParams params() {
  ContextParams p;
  p.max_sequences = 1;
  p.max_context = 512;
  p.threads = 2;
  p.max_logits_rows = 256;
  p.max_batch_tokens = 512;
  return p;
}

double rms(const std::vector<float>& a) {
  double s = 0.0;
  for (const float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(a.size()));
}

// Fixtures with their own lm_head (a tied one shares the embedding, which is not quantised).
const char* const untied[] = {"qwen35_cond_mtp", "qwen3next_dense"};

}  // namespace

TEST_CASE("independent half rounding agrees with IEEE on exact and tie cases", "[quant][reference]") {
  CHECK(nearest_half(1.0f) == 1.0f);
  CHECK(nearest_half(-2.5f) == -2.5f);
  CHECK(nearest_half(1.0f + 1.0f / 2048) == 1.0f);                  // tie between 1 and 1 + 2⁻¹⁰: even
  CHECK(nearest_half(1.0f + 3.0f / 2048) == 1.0f + 2.0f / 1024);    // tie: to the even neighbour
  CHECK(nearest_half(1e6f) == 65504.0f);                            // saturates
  CHECK(nearest_half(std::ldexp(1.0f, -24)) == std::ldexp(1.0f, -24));  // the smallest subnormal
}

// Bounds: the reference runs the dequantised weights on float activations. q8_0 rounds its
// activations to two int8 parts (2⁻¹⁵ of each block's largest value): through the fixtures' random
// layers max 1.2e-2, RMS 4.7e-4 (logit RMS ≈ 0.9), where one weight rounded the other way at a tie
// already moved logits by 0.17. The 4-bit formats round them to 8 bits (quant.hpp), which these
// random layers amplify to max 1.6, RMS 0.10; a wrong scale, nibble order, block boundary or
// tensor puts the whole 4-bit weight error in instead, RMS ≈ 0.9 (the format-cost test below).
// The rounding of each weight is test_quant's to check, value by value.
struct ReferenceBound {
  double max, rms;
};
ReferenceBound reference_bound(WeightQuant q) { return q == WeightQuant::q8_0 ? ReferenceBound{3e-2, 2e-3} : ReferenceBound{2.5, 0.2}; }

// The policies tested: each format with the automatic lm_head (q8_0 under q4_0 and q4_k), and
// every projection at 4 bits.
struct Policy {
  WeightQuant quant;
  LmHeadQuant lm_head;
  WeightQuant lm_head_format;  // what the policy gives the lm_head, restated
};
constexpr Policy policies[] = {{WeightQuant::q8_0, LmHeadQuant::automatic, WeightQuant::q8_0},
                               {WeightQuant::q4_0, LmHeadQuant::automatic, WeightQuant::q8_0},
                               {WeightQuant::q4_0, LmHeadQuant::q4_0, WeightQuant::q4_0},
                               {WeightQuant::q4_k, LmHeadQuant::automatic, WeightQuant::q8_0},
                               {WeightQuant::q4_k, LmHeadQuant::q4_k, WeightQuant::q4_k},
                               {WeightQuant::q4_k_m, LmHeadQuant::automatic, WeightQuant::q8_0}};
std::string policy_name(const Policy& p) {
  return fmt::format("{} (lm_head {})", weight_quant_name(p.quant), weight_quant_name(p.lm_head_format));
}

TEST_CASE("quantised logits match an independently dequantised checkpoint run in float", "[quant][fixtures]") {
  for (const std::string name : untied) {
    for (const Policy& policy : policies) {
      const WeightQuant q = policy.quant;
      REQUIRE(lm_head_weight_quant(policy.quant, policy.lm_head) == policy.lm_head_format);
      test::TempDir dir("quant_reference");
      const int quantised = write_dequantized(test::fixture_model(name), dir.str(), q, policy.lm_head_format);
      ModelParams mp;
      mp.quant = q;
      mp.lm_head_quant = policy.lm_head;
      auto model = Model::load(test::fixture_model(name), mp);
      auto reference = Model::load(dir.str());
      // The policy's tensors are the ones the engine quantises.
      REQUIRE(quantised == static_cast<int>(model->weights().projections(/*include_mtp=*/true).size()));
      Context ctx(model, params()), rctx(reference, params());
      test::Reference ref(name);
      double worst = 0.0, worst_rms = 0.0;
      for (int i = 0; i < 6; ++i) {
        const auto tokens = ref.tokens(fmt::format("prompt{}.tokens", i));
        const auto got = test::prefill_logits(ctx, tokens), want = test::prefill_logits(rctx, tokens);
        REQUIRE(got.size() == want.size());
        const double d = test::max_abs_diff(got.data(), want.data(), got.size()), r = rms_diff(got, want);
        INFO(fmt::format("{} {} prompt {} (T={}): max {:.3g}, RMS {:.3g}, logit RMS {:.3g}", name, policy_name(policy), i,
                         tokens.size(), d, r, rms(want)));
        CHECK(d <= reference_bound(q).max);
        CHECK(r <= reference_bound(q).rms);
        worst = std::max(worst, d);
        worst_rms = std::max(worst_rms, r);
      }
      WARN(fmt::format("{} {} vs its dequantised float reference: max {:.3g}, RMS {:.3g} (6 prompts)", name,
                       policy_name(policy), worst, worst_rms));
    }
  }
}

// What the formats cost, on every committed fixture: the quantised model's logits against the same
// checkpoint's float logits. These fixtures' random weights (inputs of 48–128 columns, no trained
// structure) amplify weight noise far beyond a trained model's, so the bounds are the measured
// figures with headroom, there to catch a regression of the format, not to judge its quality.
struct FormatBound {
  WeightQuant quant;
  LmHeadQuant lm_head;
  double max, rms;  // relative to the float logits' RMS
};
constexpr FormatBound format_bounds[] = {{WeightQuant::q8_0, LmHeadQuant::automatic, 4.0, 0.3},
                                         {WeightQuant::q4_0, LmHeadQuant::automatic, 10.0, 1.5},
                                         {WeightQuant::q4_0, LmHeadQuant::q4_0, 10.0, 1.5},
                                         {WeightQuant::q4_k, LmHeadQuant::automatic, 10.0, 1.5},
                                         {WeightQuant::q4_k, LmHeadQuant::q4_k, 10.0, 1.5},
                                         {WeightQuant::q4_k_m, LmHeadQuant::automatic, 10.0, 1.5}};

TEST_CASE("quantisation error against the float logits of every fixture, bounded", "[quant][fixtures]") {
  for (const std::string name : {"qwen35_tied", "qwen35_cond_mtp", "qwen35_f32params", "qwen3next_dense"}) {
    test::Reference ref(name);
    auto plain = Model::load(test::fixture_model(name));
    Context pctx(plain, params());
    std::vector<std::vector<float>> want;
    for (int i = 0; i < 6; ++i) want.push_back(test::prefill_logits(pctx, ref.tokens(fmt::format("prompt{}.tokens", i))));
    for (const FormatBound& bound : format_bounds) {
      ModelParams mp;
      mp.quant = bound.quant;
      mp.lm_head_quant = bound.lm_head;
      auto model = Model::load(test::fixture_model(name), mp);
      Context ctx(model, params());
      double worst = 0.0, worst_rms = 0.0;
      for (int i = 0; i < 6; ++i) {
        const auto got = test::prefill_logits(ctx, ref.tokens(fmt::format("prompt{}.tokens", i)));
        const double scale = rms(want[i]);
        worst = std::max(worst, test::max_abs_diff(got.data(), want[i].data(), got.size()) / scale);
        worst_rms = std::max(worst_rms, rms_diff(got, want[i]) / scale);
      }
      WARN(fmt::format("{} {} (lm_head {}) vs float: max {:.3g}, RMS {:.3g} (relative to the logits' RMS; bounds {}, {})", name,
                       weight_quant_name(bound.quant), lm_head_quant_name(bound.lm_head), worst, worst_rms, bound.max, bound.rms));
      CHECK(worst <= bound.max);
      CHECK(worst_rms <= bound.rms);
    }
  }
}

// The trained checkpoint is the meaningful measure: its logits at q8_0 and q4_0 against float on
// task prompts, relative to the logits' RMS, and how often the greedy token changes.
TEST_CASE("quantisation error on the trained model's logits, bounded", "[quant][tiny]") {
  const std::string dir = test::source_dir() + "/models/gdn-tiny";
  const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  const char* const prompts[] = {"add 31+13=", "add 718+52=", "reverse 90417=", "copy 4821=", "reverse 5316=71",
                                 "add 2+9876="};
  auto plain = Model::load(dir);
  Context pctx(plain, params());
  std::vector<std::vector<float>> want;
  std::vector<std::vector<Token>> ids;
  for (const char* p : prompts) {
    ids.push_back(tok.encode(p));
    want.push_back(test::prefill_logits(pctx, ids.back()));
  }
  const std::int64_t V = plain->config().vocab_size;
  // Bounds: the measured figures with headroom (docs/quantization.md). Under q4_0 the lm_head's
  // format is most of the error: the automatic policy (lm_head q8_0) must stay clearly below every
  // projection at q4_0.
  struct Case {
    WeightQuant q;
    LmHeadQuant lm_head;
    double max_bound, rms_bound;
  };
  const Case cases[] = {{WeightQuant::q8_0, LmHeadQuant::automatic, 0.05, 0.01},
                        {WeightQuant::q4_0, LmHeadQuant::automatic, 0.3, 0.05},
                        {WeightQuant::q4_0, LmHeadQuant::q4_0, 0.4, 0.08},
                        {WeightQuant::q4_k, LmHeadQuant::automatic, 0.3, 0.05},
                        {WeightQuant::q4_k, LmHeadQuant::q4_k, 0.4, 0.08},
                        {WeightQuant::q4_k_m, LmHeadQuant::automatic, 0.3, 0.05}};
  double q4_rms[2] = {}, q4k_rms[2] = {}, q4km_rms = 0.0;
  for (const Case& c : cases) {
    ModelParams mp;
    mp.quant = c.q;
    mp.lm_head_quant = c.lm_head;
    auto model = Model::load(dir, mp);
    Context ctx(model, params());
    double worst = 0.0, worst_rms = 0.0, sum_sq = 0.0;
    std::int64_t positions = 0, flips = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto got = test::prefill_logits(ctx, ids[i]);
      const double scale = rms(want[i]);
      worst = std::max(worst, test::max_abs_diff(got.data(), want[i].data(), got.size()) / scale);
      worst_rms = std::max(worst_rms, rms_diff(got, want[i]) / scale);
      sum_sq += std::pow(rms_diff(got, want[i]) / scale, 2);
      for (std::size_t t = 0; t < ids[i].size(); ++t, ++positions) {
        const float* a = want[i].data() + t * V;
        const float* b = got.data() + t * V;
        flips += std::max_element(a, a + V) - a != std::max_element(b, b + V) - b;
      }
    }
    const double mean_rms = std::sqrt(sum_sq / static_cast<double>(ids.size()));
    if (c.q == WeightQuant::q4_0) q4_rms[c.lm_head == LmHeadQuant::q4_0] = mean_rms;
    if (c.q == WeightQuant::q4_k) q4k_rms[c.lm_head == LmHeadQuant::q4_k] = mean_rms;
    if (c.q == WeightQuant::q4_k_m) q4km_rms = mean_rms;
    WARN(fmt::format("gdn-tiny {} (lm_head {}) vs float: max {:.3g}, RMS {:.3g} (relative to the logits' RMS; bounds {}, {}); "
                     "greedy token changed at {} of {} positions",
                     weight_quant_name(c.q), weight_quant_name(lm_head_weight_quant(c.q, c.lm_head)), worst, worst_rms,
                     c.max_bound, c.rms_bound, flips, positions));
    CHECK(worst <= c.max_bound);
    CHECK(worst_rms <= c.rms_bound);
  }
  // The default q4_0 policy is measurably more accurate than every projection at 4 bits.
  INFO(fmt::format("q4_0 mean RMS: lm_head q8_0 {:.4g}, lm_head q4_0 {:.4g}", q4_rms[0], q4_rms[1]));
  CHECK(q4_rms[0] < 0.8 * q4_rms[1]);
  INFO(fmt::format("q4_k mean RMS: lm_head q8_0 {:.4g}, lm_head q4_k {:.4g}", q4k_rms[0], q4k_rms[1]));
  CHECK(q4k_rms[0] < 0.8 * q4k_rms[1]);
  // The fitted format is the more accurate 4-bit one, policy for policy.
  CHECK(q4k_rms[0] < q4_rms[0]);
  CHECK(q4k_rms[1] < q4_rms[1]);
  // q4_k_m's 8-bit projections buy accuracy over q4_k.
  CHECK(q4km_rms < 0.95 * q4k_rms[0]);
}
