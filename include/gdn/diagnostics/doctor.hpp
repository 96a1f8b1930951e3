#pragma once
// gdn doctor: a run-time self-check for silently wrong numerics, on any checkpoint.
//
// The failure this exists for was silent: a server produced fluent garbage from a GDN model and
// nothing said so until a human read the output. There is no reference implementation on a user's
// machine, but a GDN model has internal identities that must hold whatever its weights, and a
// checkpoint carries fingerprints of its conventions. run_doctor() checks both, on the real
// weights, through the public API (Model, Context, Batch, Sampler) plus a raw look at config.json
// and the safetensors:
//
//   config.*        the architecture is supported; config and tensors agree (every tensor the config
//                   implies has the implied shape, no tensor of the language model goes unused);
//                   fields we rely on that were defaulted, and fields we do not read, are listed;
//                   the recurrent-state dtype the config asks for
//   weights.*       every weight finite (and not all zero); norm convention fingerprints ((1+w)
//                   norms stored near 0, the GDN gated norm near 1); A_log / dt_bias ranges
//   gdn.*           value-head grouping, measured: the model's own likelihood of probe text with
//                   grouped (h / (Hv/Hk)) and tiled (h % Hk, GGUF order) pairing
//   identity.*      chunked GDN == per-token recurrence; whole prompt == prompt split over steps ==
//                   prefill + token-by-token decode; a batch == its members alone; bf16-state drift
//   backend.*       CPU and CUDA agree (SKIP when there is no device or no CUDA Context)
//   generation.*    degeneration probe: greedy continuations of neutral prompts, repeated-4-gram
//                   rate, token entropy and distinct-token ratio ("prime prime prime" is a FAIL)
//
// Every check reports a verdict (PASS / WARN / FAIL / SKIP), the measured figure, the threshold it
// was held to and a message naming the tensors or fields concerned. A report with any FAIL is not
// ok(); `gdn doctor` then exits non-zero, so hosts can run it at deploy time.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gdn/core/dtype.hpp"
#include "gdn/runtime/batch.hpp"
#include "gdn/runtime/context.hpp"

namespace gdn {

enum class Verdict : std::uint8_t { pass, warn, fail, skip };
std::string_view verdict_name(Verdict v) noexcept;  // "PASS", "WARN", "FAIL", "SKIP"

struct DoctorCheck {
  std::string name;          // e.g. "identity.chunked_vs_recurrent"
  Verdict verdict = Verdict::skip;
  std::string metric;        // what `measured` is, e.g. "max |Δlogit|"; empty when there is no figure
  double measured = 0.0;     // meaningful when !metric.empty()
  std::string threshold;     // the bound it was held to, as text (e.g. "≤ 1.0e-03"); empty when none
  std::string message;       // one line: the finding, naming tensors / fields
  std::vector<std::string> details;  // e.g. every tensor or field concerned
  double seconds = 0.0;
};

// Deliberate engine faults, for self-checks and the tests that prove a check catches the bug it is
// for: deliberately breaking the engine the doctor tests. Never set them for real use.
struct FaultInjection {
  bool drop_conv_state = false;    // zero every GDN conv state at the start of each step (a known server bug)
  bool tiled_value_heads = false;  // pair value head h with key head h % Hk (GGUF order) instead of h / (Hv/Hk)
};

struct DoctorOptions {
  bool quick = false;      // shorter probes (tests, deploy hooks): seconds even on a large model
  int threads = 0;         // 0: one per hardware thread
  Backend backend = Backend::cpu;  // where the doctor's contexts run
  ModelParams load;                // how the model is loaded (its weights and packed_image; backend above)
  FaultInjection faults;   // injected into every Context the doctor creates
  std::optional<DType> state_dtype;  // as ContextParams::state_dtype (default: the config's)
};

struct DoctorReport {
  std::string model_dir;
  std::vector<DoctorCheck> checks;
  double seconds = 0.0;

  int count(Verdict v) const noexcept;
  bool ok() const noexcept { return count(Verdict::fail) == 0; }
  const DoctorCheck* find(std::string_view name) const noexcept;
  // {"model_dir", "ok", "seconds", "counts": {"PASS": n, ...}, "checks": [{"name", "verdict",
  //  "metric", "measured", "threshold", "message", "details", "seconds"}, ...]}
  std::string to_json(int indent = 2) const;
  // One line per check (verdict, figure, threshold, message), then a summary line.
  std::string to_table() const;
};

// Runs every check on the checkpoint in `dir`. A checkpoint that cannot be loaded is a report with
// a FAIL naming why (and the checks that need the model SKIPped), not an exception; only I/O
// failures of the doctor itself (e.g. out of memory) throw gdn::Error, and so does asking for the
// CUDA backend where it cannot run (Error(backend_unavailable) with the reason).
DoctorReport run_doctor(const std::string& dir, const DoctorOptions& options = {});

// Thresholds, with why. Logit deviations are absolute, scaled by max(1, std of the logits) so that
// a model with large logits is held to the same relative precision as the small fixtures.
namespace doctor_limits {
// Two float32 evaluation orders of the same function (chunked WY form vs per-token recurrence;
// one step vs several; prefill vs decode): ≤ 6e-4 measured through 8 random fixture layers, whose
// gated norms amplify rounding; every convention bug moves logits by > 0.5 (tests/fixtures/README.md),
// a bf16 state by > 0.05. Between the two bounds is a WARN: more rounding than expected (badly
// conditioned weights: a fixture with its norms doubled reaches 5e-3), not a known bug's signature.
inline constexpr double identity_logits = 1e-3;
inline constexpr double identity_logits_fail = 1e-2;
// The same identities on a quantised model (ModelParams::quant), as RMS over all logits: each
// projection's activations are rounded to int8 steps (two parts at q8_0, a step of 2⁻¹⁵ of their
// block's largest value; one at 4 bits, 2⁻⁷), so two evaluation orders whose activations differ by
// float32 rounding land on different steps here and there, and at a rare position the model
// amplifies that into a large single difference: on gdn-tiny, 12 random 200-token prompts, chunked
// vs recurrent, the max |dlogit| reached 0.03 (q8_0) and 0.26–1.2 of the logit scale (4 bits) while
// the RMS stayed at most 5e-4 (q8_0) and 0.014 (4 bits); on the random-weight fixtures, 8 prompts
// each, at most 6e-4 and 0.05 (qwen35_tied, whose random layers amplify most). A bug moves every
// position after it: a dropped conv state gives 0.46–0.85 at every format.
inline constexpr double identity_rms_quant = 5e-3;
inline constexpr double identity_rms_quant_fail = 2e-2;
inline constexpr double identity_rms_quant4 = 8e-2;
inline constexpr double identity_rms_quant4_fail = 0.2;
// The same identities on the CUDA backend (bf16 activations), as RMS over all logits: measured
// 0.01–0.05 on the fixtures and gdn-tiny; a dropped conv state gives > 0.3 (tests/test_cuda_context.cpp).
inline constexpr double identity_rms_bf16 = 0.06;
inline constexpr double identity_rms_bf16_fail = 0.15;
// A batch vs its members alone: the CPU kernels are batch-invariant, so the figure must be 0 (any
// difference is a WARN, above identity_logits_fail a FAIL: sequences leak into each other).
inline constexpr double batch_logits = 0.0;
// bf16 recurrent state vs float32 over the decode probe: fine as a measurement while the state is
// float32; with a bf16 state in use it FAILs above this (fixtures: ≈ 0.9 after 70 tokens).
inline constexpr double bf16_state_drift = 0.25;
// CPU (float32) vs CUDA (bf16 activations, residual and KV, as a bf16 server computes) logits, as
// an RMS: transformers' own bf16 run of the fixtures is 0.03–0.11 from float32, the CUDA backend
// ≤ 1.5× that (tests/test_cuda_context.cpp; 0.03–0.14 CPU vs CUDA on the fixtures); a dropped conv
// state or another convention bug moves them by more than 0.5.
inline constexpr double backend_logits = 0.25;
// Norm fingerprints: mean(w) of a (1+w) norm is ≈ 0 (random fixtures: N(0, 0.1); trained Qwen3.5
// norms are weight-decayed towards 0). A mean within 0.5 of 1 means the +1 was baked in.
inline constexpr double zero_centred_norm_max_mean = 0.5;
// The GDN gated norm multiplies by w itself: ≈ 1. Below 0.5 it looks zero-centred (or zeroed).
inline constexpr double gated_norm_min_mean = 0.5;
// exp(A_log) is the per-head decay rate (HF init: uniform in (0, 16)); far above means A itself (or
// garbage) was stored: the state would be wiped every token.
inline constexpr double max_exp_A_log = 1e3;
inline constexpr double max_abs_dt_bias = 30.0;  // softplus(30) ≈ 30: already a decay of e^-30·A per token
// Value-head grouping: the probe decides when the better pairing predicts the probe well (mean
// NLL < 0.6 · ln V) and the other is worse by more than this many nats per token.
inline constexpr double vhead_margin_nats = 0.1;
inline constexpr double vhead_informative_fraction_of_chance = 0.6;
// Degeneration: a greedy continuation that has collapsed onto one or two tokens ("prime prime
// prime", "!!!!") has a unigram entropy below this many bits (random fixtures: > 4.6);
// it is a FAIL when most probe prompts collapse. Looping over a longer phrase (repeated 4-grams
// above the rate, or few distinct tokens), common for small models decoding greedily, is a WARN.
inline constexpr double degenerate_entropy_bits = 1.5;
inline constexpr double degenerate_distinct_ratio = 0.1;
inline constexpr double looping_repeated_4gram_rate = 0.75;
}  // namespace doctor_limits

// The degeneration probe's metrics for one generated sequence (exposed for tests).
struct GenerationStats {
  std::int64_t tokens = 0;
  double repeated_ngram_rate = 0.0;  // fraction of n-grams that already occurred earlier in the sequence
  double entropy_bits = 0.0;         // of the unigram distribution of the tokens
  double distinct_ratio = 0.0;       // distinct tokens / tokens
};
GenerationStats generation_stats(std::span<const Token> tokens, int n = 4);
// FAIL for a collapsed sequence, WARN for a looping one, PASS otherwise (see doctor_limits).
Verdict classify_generation(const GenerationStats& s) noexcept;

}  // namespace gdn
