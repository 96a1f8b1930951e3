#pragma once
// gdn serve's engine: one thread that owns the Context and runs continuous batching on libgdn's public
// step API. Every loop is one Context::step holding the decode tokens of every running sequence (a
// plain token, or the pending token and its MTP drafts to verify) and prefill chunks of new requests
// under a token budget, so a long prompt never stalls running decodes. Around it:
//   * the prefix cache (serve_cache.hpp): a request starts from the snapshot of its longest cached
//     prefix; snapshots are taken where chunks end (the end of the prompt, every cache_interval tokens,
//     the start of every chat turn, the end of a generation);
//   * MTP speculative decoding, adaptive: requests are admitted in cohorts that draft or decode plainly,
//     and a cohort drafts only when the engine's measured time per generated token with drafting is
//     clearly below plain decoding's (a plain request does no MTP-layer work at all); a drafting request
//     chooses its own k from its measured acceptance (down to 0, and off when its drafts fail);
//   * per-request sampling, stop tokens and stop strings, max_tokens, cancellation (a disconnected
//     client's socket is polled every loop, so its slot is freed before the next step).
//
// Exactness. The context runs every GDN segment through the per-token recurrence
// (gdn_chunk_min_tokens = 2^30), which makes a sequence's numbers independent of how its tokens were
// split into steps, and the CPU backend is batch invariant. So a request's tokens are bit-identical to
// an offline Generator run with the same ContextParams (whatever else was in the batch, cache hit or
// not), and MTP changes nothing: drafts are verified by drawing each token with the request's own
// sampler exactly as plain decoding would (greedy: argmax; seeded: the same draw from the same RNG
// stream) and accepting a draft only when it equals that token.
//
// Thread safety: submit(), cancel via Request::cancelled, metrics() and shutdown() may be called from
// any thread; everything else runs on the engine thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/context.hpp"
#include "gdn/runtime/sampling.hpp"

namespace gdn::serve {

using Clock = std::chrono::steady_clock;

struct EngineConfig {
  int max_sequences = 8;
  int max_context = 4096;
  int max_queue = 64;                       // waiting requests; beyond: submit() says queue_full (HTTP 503)
  std::int64_t cache_bytes = std::int64_t{1} << 30;
  int cache_interval = 512;                 // tokens between prefill snapshots (0: only the special points)
  int mtp = 0;                              // max drafts per round; 0: no speculative decoding
  // false: every request drafts k = mtp every round (what the tests use to exercise verification on every
  // step, and a benchmark to see MTP's unadapted cost); true: requests draft only in cohorts whose measured
  // time per token beats plain decoding's, with k chosen per request from its acceptance.
  bool mtp_adaptive = true;
  int step_tokens = 256;                    // token budget of one step (decode rows + prefill chunks)
  int threads = 0;
  Backend backend = Backend::cpu;
  int device = 0;
  std::optional<DType> state_dtype;         // ContextParams::state_dtype (default: the checkpoint's)
  std::optional<DType> kv_dtype;            // ContextParams::kv_dtype (default: the backend's)
};

enum class Finish { none, stop, length, cancelled, error };

// One generation. The HTTP side fills the first part, submits it, and reads the output part under `m`.
struct Request {
  // Input.
  std::vector<Token> prompt;
  SamplingParams sampling;
  int max_tokens = 16;
  std::vector<Token> stop_tokens;
  std::vector<std::string> stop_strings;
  std::vector<std::int64_t> boundaries;  // prompt positions worth a snapshot (where chat turns start)
  bool use_cache = true;
  int fd = -1;                 // the client's socket, polled for a hang-up (-1: none)

  // Output (under m).
  std::mutex m;
  std::condition_variable cv;
  std::string text;            // final text not yet taken by the HTTP side
  std::vector<Token> tokens;   // every generated token (a stop token included)
  std::int64_t completion_tokens = 0, cached_tokens = 0;
  Finish finish = Finish::none;
  std::string error;
  bool done = false;
  std::int64_t drafted = 0, accepted = 0;
  std::atomic<bool> cancelled{false};

  Clock::time_point arrival = Clock::now();
};

struct Histogram {
  std::vector<double> bounds;
  std::vector<std::int64_t> counts;  // per bucket (last: +Inf)
  double sum = 0;
  std::int64_t n = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void add(double v);
};

struct EngineMetrics {
  std::int64_t requests = 0, finished = 0, cancelled = 0, failed = 0, rejected = 0;
  std::int64_t prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0;
  std::int64_t drafted = 0, accepted = 0, steps = 0, step_rows = 0;
  std::int64_t queue_depth = 0, running = 0, max_sequences = 0;
  std::int64_t cache_bytes = 0, cache_budget = 0, cache_nodes = 0, cache_hits = 0, cache_misses = 0, cache_evicted = 0;
  Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  bool healthy = true;
};

class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, const Tokenizer& tokenizer, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  enum class Submit { ok, queue_full, shutting_down, unhealthy };
  Submit submit(const std::shared_ptr<Request>& r);

  // Stops taking requests, lets running and queued ones finish for up to `grace`, cancels the rest,
  // and joins the engine thread.
  void shutdown(std::chrono::milliseconds grace);

  EngineMetrics metrics() const;
  const ContextParams& context_params() const noexcept { return cp_; }
  std::int64_t snapshot_bytes() const noexcept { return snapshot_bytes_; }
  std::int64_t kv_bytes_per_token() const noexcept { return kv_bytes_per_token_; }
  std::int64_t rollback_bytes() const noexcept { return rollback_bytes_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  ContextParams cp_;
  std::int64_t snapshot_bytes_ = 0, kv_bytes_per_token_ = 0, rollback_bytes_ = 0;
};

// The ContextParams gdn serve runs with (what an offline reference must use to match it bit for bit).
ContextParams serve_context_params(const std::shared_ptr<const Model>& model, const EngineConfig& config);

}  // namespace gdn::serve
