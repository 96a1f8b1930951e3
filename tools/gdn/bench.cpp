// gdn bench: CPU speed against the memory-bandwidth limit, and against llama.cpp, in one run.
//
//   gdn bench [--model DIR | --shape 0.8b|2b] [--cache DIR] [--threads N] [--runs N]
//             [--decode-tokens N] [--prompt-tokens N] [--batches 1,2,4,...] [--contexts 512,4096,...] [--kv-dtypes f32,bf16]
//             [--quick] [--json FILE] [--peer-python PY] [--peer-script FILE]
//
// Without --model it generates (once, cached under --cache, default build/bench-models/) a
// random-weight bf16 checkpoint with the exact tensor shapes of Qwen3.5-0.8B (or 2B), written in
// the Hugging Face layout (config.json + model.safetensors). Then, in one process:
//   - the machine's memory read bandwidth (STREAM-style sum over a buffer far larger than the
//     caches, all threads, in a child process so it stays out of the peak RSS), and the decode
//     roofline = weight bytes read per token / bandwidth;
//   - batch-1 decode tokens/s (median of --runs runs after a warm-up) and its fraction of that
//     roofline and of the step's (the weights, the recurrent state read and written, and the KV
//     cache of the context read: every byte a decode step must move, as the CUDA bench counts);
//   - prefill tokens/s for a --prompt-tokens prompt;
//   - aggregate decode tokens/s at each batch size, decode cost at each context length;
//   - peak RSS, GDN state bytes per sequence, KV bytes per token, heap allocations per decode step
//     (every operator new, counted by alloc_count.cpp: this file and that one make the gdn-bench
//     program, which `gdn bench` runs in its own place, so the `gdn` tool keeps its allocator).
// With --peer-python, it also runs bench/peer.py (llama.cpp through llama-cpp-python, on the
// same weights converted to a bf16 GGUF) with the same threads and token counts, and prints the
// ratios ours / llama.cpp; then --rounds head-to-head rounds of batch-1 prefill and decode, ours and
// the peer back to back, each round bracketed by bandwidth measurements (section 6 below).

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "alloc_count.hpp"
#include "checkpoints.hpp"
#include "commands.hpp"
#include "context_flags.hpp"
#include "backend/cpu/linear.hpp"
#include "backend/cpu/prepared_weights.hpp"
#include "backend/cpu/quant.hpp"
#include "gdn/core/anonymous_memory.hpp"
#include "gdn/gdn.hpp"
#include "gdn/model/packed_image.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace gdn::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int> parse_ints(std::string_view s) {
  std::vector<int> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    out.push_back(std::atoi(std::string(s.substr(0, comma)).c_str()));
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

long peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss * 1024L;
}

// ------------------------------------------------------------------------------------------------
// Memory read bandwidth: each thread sums its own contiguous part of a buffer much larger than the
// last-level cache (STREAM's "sum" kernel, read-only, like a decode step's weight stream).

#if defined(__x86_64__)
__attribute__((target("avx512f"))) double sum_avx512(const float* p, std::int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#endif

double sum_plain(const float* p, std::int64_t n) {
  float a[8] = {};
  for (std::int64_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  return std::accumulate(a, a + 8, 0.0);
}

struct Bandwidth {
  double median_gbs = 0, best_gbs = 0;
  std::int64_t bytes = 0;
};

// The buffer is in 2 MiB pages, as the packed weights are: with 4 KiB pages this VM's sweep reads
// ~10-20% slower (TLB misses under nested paging), which would understate the machine's bandwidth.
// It grows as needed and is kept for the next call.
Bandwidth measure_bandwidth(ThreadPool& pool, AnonymousMemory& mem, std::int64_t bytes, int runs) {
  const std::int64_t n = bytes / 4 / 1024 * 1024;
  if (mem.size() < static_cast<std::size_t>(n) * 4) mem = AnonymousMemory(static_cast<std::size_t>(n) * 4);
  float* buf = reinterpret_cast<float*>(mem.data());
  const int T = pool.size();
  const std::int64_t per = n / T / 64 * 64;
  // First touch by the thread that reads each part.
  pool.parallel_for(T, 1, [&](std::int64_t t0, std::int64_t t1, int) {
    for (std::int64_t t = t0; t < t1; ++t)
      for (std::int64_t i = t * per; i < (t + 1) * per; ++i) buf[i] = 1.0f;
  });
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f");
#endif
  std::vector<double> sums(static_cast<std::size_t>(T));
  std::vector<double> gbs;
  for (int r = 0; r < runs + 1; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(T, 1, [&](std::int64_t a, std::int64_t b, int) {
      for (std::int64_t t = a; t < b; ++t) {
#if defined(__x86_64__)
        sums[static_cast<std::size_t>(t)] = avx512 ? sum_avx512(buf + t * per, per) : sum_plain(buf + t * per, per);
#else
        sums[static_cast<std::size_t>(t)] = sum_plain(buf + t * per, per);
#endif
      }
    });
    const double dt = seconds_since(t0);
    if (r > 0) gbs.push_back(static_cast<double>(per * T * 4) / dt / 1e9);  // run 0 is a warm-up
  }
  volatile double sink = std::accumulate(sums.begin(), sums.end(), 0.0);
  (void)sink;
  return {median(gbs), *std::max_element(gbs.begin(), gbs.end()), per * T * 4};
}

// The same in a helper process forked at the start, while this process is small and has one
// thread: the buffer never counts in this process's peak RSS, and no fork happens later, when a
// fork would mark gigabytes of this process's pages copy-on-write and make its next steps fault.
// The helper keeps its buffer and threads between measurements.
class BandwidthMeter {
 public:
  BandwidthMeter(int threads, std::int64_t max_bytes) {
    int req[2], rep[2];
    if (pipe(req) != 0 || pipe(rep) != 0) throw Error(Status::internal, "bench: pipe() failed");
    pid_ = fork();
    if (pid_ < 0) throw Error(Status::internal, "bench: fork() failed");
    if (pid_ == 0) {
      close(req[1]);
      close(rep[0]);
      ThreadPool pool(threads);
      AnonymousMemory buffer;
      Request q;
      while (read(req[0], &q, sizeof q) == static_cast<ssize_t>(sizeof q)) {
        const Bandwidth b = measure_bandwidth(pool, buffer, std::min(q.bytes, max_bytes), q.runs);
        if (write(rep[1], &b, sizeof b) != static_cast<ssize_t>(sizeof b)) break;
      }
      _exit(0);
    }
    close(req[0]);
    close(rep[1]);
    to_ = req[1];
    from_ = rep[0];
  }
  ~BandwidthMeter() {
    close(to_);
    close(from_);
    waitpid(pid_, nullptr, 0);
  }
  BandwidthMeter(const BandwidthMeter&) = delete;
  BandwidthMeter& operator=(const BandwidthMeter&) = delete;

  Bandwidth measure(std::int64_t bytes, int runs) {
    const Request q{bytes, runs};
    Bandwidth b;
    if (write(to_, &q, sizeof q) != static_cast<ssize_t>(sizeof q) || read(from_, &b, sizeof b) != static_cast<ssize_t>(sizeof b))
      throw Error(Status::internal, "bench: the bandwidth measurement failed");
    return b;
  }

 private:
  struct Request {
    std::int64_t bytes;
    int runs;
  };
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

// Bytes of weights one decode step streams: every projection of every layer, plus lm_head and one
// embedding row. A quantised model's projections count their quantised image (scales included).
std::int64_t weight_bytes_per_token(const Model& m) {
  std::int64_t b = 0;
  if (m.params().quant != WeightQuant::none) {
    // Each projection in its format (the lm_head's may differ, --lm-head-quant; so may q4_k_m's).
    const cpu::ImageLayouts layouts = cpu::load_layouts(m.params());
    for (const TensorSpec& s : model_tensor_specs(m.config(), m.weights().prefix, /*mtp=*/false))
      if (s.projection) b += static_cast<std::int64_t>(2 * cpu::weight_image_elements(cpu::layout_of(s, layouts), s.shape[0], s.shape[1]));
  } else {
    for (const LinearWeight* lw : m.weights().projections(/*include_mtp=*/false)) b += static_cast<std::int64_t>(lw->w.nbytes());
  }
  const TensorView& e = m.weights().embed_tokens;
  return b + static_cast<std::int64_t>(e.nbytes() / static_cast<std::size_t>(e.dim(0)));
}

// ------------------------------------------------------------------------------------------------

struct Options {
  std::string model;
  std::string shape = "0.8b";
  int layers = 0;  // --layers N: the shape's first N layers (every 4th still full attention)
  std::string cache = "build/bench-models";
  int threads = 0;
  int runs = 5;
  int decode_tokens = 32;
  int prompt_tokens = 512;
  std::vector<int> batches = {1, 2, 4, 8, 16, 32};
  std::vector<int> contexts = {512, 4096, 16384};
  std::vector<DType> kv_dtypes = {DType::f32};  // --kv-dtypes f32,bf16: the context section per KV dtype
  std::int64_t stream_bytes = std::int64_t{2} << 30;
  std::string json_out;
  std::string peer_python;
  std::string peer_script = "bench/peer.py";
  std::string peer_args;
  int rounds = 3;
  int context_rounds = 0;  // --context-rounds: decode at --contexts against the peer, per KV dtype, in rounds
  int kv_page_size = ContextParams{}.kv_page_size;  // --kv-page-size: positions per KV page in the context sections
  WeightPlacement weights = WeightPlacement::automatic;  // --weights / --in-place
  WeightQuant quant = WeightQuant::none;   // --quant: block-quantised projections (docs/quantization.md)
  LmHeadQuant lm_head_quant = LmHeadQuant::automatic;  // --lm-head-quant: the lm_head's format under --quant
  std::string image_path;                  // --image-path: where the packed image is (written when missing)
  std::vector<std::string> load_modes = {"in-place", "pack", "image"};  // the load-time section
  bool sparse = false;                     // --sparse: an all-zero generated checkpoint (holes on disk)
  int shards = 1;
  bool quick = false;
  bool bf16_inputs = true;  // also measure MatmulInput::bf16 (batch 1, batch scaling, the rounds)
};

// The --shape, cut to its first --layers layers when given (a long-context attention benchmark
// needs the attention geometry, not all the layers: prefilling 64K tokens through 24 layers takes
// a quarter of an hour here).
Shape bench_shape(const Options& o) {
  Shape s = shape_for(o.shape);
  if (o.layers > 0 && o.layers < s.layers) {
    s.layers = o.layers;
    s.name += fmt::format("-{}layers", o.layers);
  }
  return s;
}

std::vector<DType> parse_kv_dtypes(const std::string& list) {
  std::vector<DType> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    out.push_back(cli::parse_element_dtype("--kv-dtypes", list.substr(at, end - at)));
    at = end + 1;
  }
  return out;
}

std::vector<Token> random_tokens(std::size_t n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, std::min(vocab, 150000) - 1);
  std::vector<Token> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Decodes `steps` tokens for each of `seqs` (already prefilled) and returns the seconds taken.
// Counts the heap allocations made during the steps into *allocs.
double decode_steps(Context& ctx, std::span<const SeqId> seqs, int steps, Batch& batch, long* allocs) {
  const int V = ctx.model().config().vocab_size;
  alloc_count::begin();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    batch.clear();
    for (std::size_t i = 0; i < seqs.size(); ++i) batch.add(seqs[i], static_cast<Token>((s * 7919 + i * 104729) % std::min(V, 150000)));
    ctx.step(batch);
  }
  const double dt = seconds_since(t0);
  const long n = alloc_count::end();
  if (allocs) *allocs += n;
  return dt;
}

// Decode steps of two sequences taken in turn, a step of each, timed apart: seconds of the first's
// steps and of the second's. Measuring the extra time of a long context over a short one this way,
// not as two runs one after the other, lets both meet the same memory bandwidth: on a shared VM it
// swings by 2x within seconds, which moved the difference of two back-to-back runs by more than the
// KV read it measures.
std::pair<double, double> alternating_decode_steps(Context& ctx, SeqId a, SeqId b, int steps, Batch& batch, long* allocs) {
  const int V = ctx.model().config().vocab_size;
  double ta = 0.0, tb = 0.0;
  alloc_count::begin();
  for (int s = 0; s < steps; ++s) {
    const auto tok = static_cast<Token>((s * 7919) % std::min(V, 150000));
    for (const SeqId q : {a, b}) {
      batch.clear();
      batch.add(q, tok);
      const auto t0 = Clock::now();
      ctx.step(batch);
      (q == a ? ta : tb) += seconds_since(t0);
    }
  }
  const long n = alloc_count::end();
  if (allocs) *allocs += n;
  return {ta, tb};
}

void prefill(Context& ctx, SeqId s, std::span<const Token> tokens, Batch& batch) {
  batch.clear();
  batch.add(s, tokens, LogitsFor::last);
  ctx.step(batch);
}

// A context for batch-1 runs: one sequence, room for the prompt and every run's decode steps.
ContextParams batch1_params(int prompt_tokens, int decode_tokens, int runs, int threads,
                            MatmulInput input = MatmulInput::float32) {
  ContextParams p;
  p.matmul_input = input;
  p.max_sequences = 1;
  p.max_context = prompt_tokens + decode_tokens * (runs + 1) + 8;
  p.max_batch_tokens = std::max(prompt_tokens, 1);
  p.threads = threads;
  return p;
}

struct Batch1Speeds {
  std::vector<double> prefill_tok_s, decode_tok_s;  // one per timed run
  // Each decode run's tokens/s over its own roofline: the bandwidth probed just before and just
  // after that run (this VM's bandwidth can jump by 1.5x from one second to the next), with the
  // weights' bytes alone (decode_fraction) and with every byte of the step (decode_fraction_step).
  std::vector<double> decode_fraction, decode_fraction_step;
};

// A short bandwidth measurement (GB/s) taken around each decode run, and the bytes a batch-1
// decode step moves at the least: every weight once; the sequence's recurrent state (GDN and conv)
// read and written, as it changes every token and the weight stream evicts it between tokens (20 MB
// each way for the 0.8B shape: a tenth of its 4-bit weights); the KV cache of its context read.
struct RooflineProbe {
  std::function<double()> gb_s;
  std::int64_t weight_bytes = 0;
  std::int64_t state_bytes = 0;       // read and written: 2 × the state per sequence
  std::int64_t kv_bytes_per_token = 0;
  double step_bytes(double context) const {
    return static_cast<double>(weight_bytes + state_bytes) + static_cast<double>(kv_bytes_per_token) * context;
  }
};

// Batch-1 prefill of `prompt` and `decode_tokens` single steps on sequence `s`, `runs` timed runs
// after a warm-up run (which also pages the weights in). Decode allocations go to *allocs.
Batch1Speeds run_batch1(Context& ctx, SeqId s, std::span<const Token> prompt, int decode_tokens, int runs, Batch& batch,
                        long& allocs, long& alloc_steps, const RooflineProbe* probe = nullptr) {
  Batch1Speeds out;
  const SeqId seqs[1] = {s};
  for (int r = 0; r < runs + 1; ++r) {
    ctx.reset_sequence(s);
    const auto t0 = Clock::now();
    prefill(ctx, s, prompt, batch);
    const double tp = seconds_since(t0);
    const double bw0 = probe != nullptr && r > 0 ? probe->gb_s() : 0.0;
    const double td = decode_steps(ctx, seqs, decode_tokens, batch, r > 0 ? &allocs : nullptr);
    const double bw1 = probe != nullptr && r > 0 ? probe->gb_s() : 0.0;
    if (r > 0) {
      out.prefill_tok_s.push_back(static_cast<double>(prompt.size()) / tp);
      out.decode_tok_s.push_back(decode_tokens / td);
      if (probe != nullptr) {
        const double bytes_per_s = 0.5 * (bw0 + bw1) * 1e9, tok_s = decode_tokens / td;
        // The steps read the KV of prompt + 1 ... prompt + decode_tokens positions.
        const double context = static_cast<double>(prompt.size()) + 0.5 * (decode_tokens + 1);
        out.decode_fraction.push_back(tok_s / (bytes_per_s / static_cast<double>(probe->weight_bytes)));
        out.decode_fraction_step.push_back(tok_s / (bytes_per_s / probe->step_bytes(context)));
      }
      alloc_steps += decode_tokens;
    }
  }
  return out;
}

// Decode cost at each context length (ascending). One sequence is extended by a prefill to each
// length in turn (its tokens/s is that extension's); a second stays at the shortest length. Each of
// `runs` runs is a pair, N single steps of the short sequence then N of the long one, between two
// bandwidth probes: the pair's difference is the cost of the longer context, taken seconds apart,
// where this VM's bandwidth drifts over minutes. Rows: context, ms_per_token and extra_ms (medians),
// runs (tok/s), bandwidth_gb_s, prefill_tok_s, kv_bytes_per_token, and extra_vs_kv_stream: the
// extra time against the extra KV bytes read at the bandwidth (1.0: the cache streams at bandwidth).
json context_decode_rows(const std::shared_ptr<const Model>& model, DType kv_dtype, int kv_page_size, std::vector<int> contexts,
                         int N, int runs, int threads, const RooflineProbe& probe, long& allocs, long& alloc_steps) {
  std::sort(contexts.begin(), contexts.end());
  const int V = model->config().vocab_size;
  ContextParams p;
  p.max_sequences = 2;
  p.max_context = contexts.back() + static_cast<std::int64_t>(N) * (runs * static_cast<std::int64_t>(contexts.size()) + 1) + 8;
  p.max_batch_tokens = 512;
  p.threads = threads;
  p.kv_dtype = kv_dtype;
  p.kv_page_size = kv_page_size;
  Context ctx(model, p);
  const SeqId base = ctx.create_sequence(), s = ctx.create_sequence();
  const SeqId base_seq[1] = {base};
  Batch batch;
  batch.reserve(4, static_cast<std::size_t>(contexts.back()));
  prefill(ctx, base, random_tokens(static_cast<std::size_t>(contexts.front()), V, 1), batch);
  decode_steps(ctx, base_seq, N, batch, nullptr);  // a warm-up run: first touches of buffers and pages
  json rows = json::array();
  std::int64_t len = 0;
  for (const int L : contexts) {
    double tp = 0.0;
    std::int64_t added = 0;
    if (L > len) {
      added = L - len;
      const auto toks = random_tokens(static_cast<std::size_t>(added), V, static_cast<std::uint32_t>(L));
      const auto t0 = Clock::now();
      prefill(ctx, s, toks, batch);
      tp = seconds_since(t0);
      len = L;
    }
    std::vector<double> dec, extra, gbs;
    for (int r = 0; r < runs; ++r) {
      const double b0 = probe.gb_s();
      const auto [t_base, t_long] = alternating_decode_steps(ctx, base, s, N, batch, &allocs);
      gbs.push_back(0.5 * (b0 + probe.gb_s()));
      dec.push_back(N / t_long);
      extra.push_back(1e3 * (t_long - t_base) / N);
      alloc_steps += 2 * N;
      len += N;
    }
    const double d = median(dec), bw = median(gbs), x = median(extra);
    json row = {{"context", L}, {"kv_dtype", std::string(dtype_name(kv_dtype))}, {"tok_s", d}, {"ms_per_token", 1e3 / d},
                {"runs", dec}, {"bandwidth_gb_s", bw}, {"prefill_tok_s", added > 0 ? added / tp : 0.0},
                {"kv_bytes_per_token", ctx.kv_bytes_per_token()}};
    if (L > contexts.front()) {
      const double kv_ms = 1e3 * static_cast<double>(L - contexts.front()) * static_cast<double>(ctx.kv_bytes_per_token()) / (bw * 1e9);
      row["extra_ms"] = x;
      row["extra_ms_runs"] = extra;
      row["kv_stream_ms"] = kv_ms;
      row["extra_vs_kv_stream"] = x / kv_ms;
    }
    rows.push_back(row);
  }
  return rows;
}

// The peer's rows (one sequence, measured apart): the extra time per token at each context over the
// shortest, against reading the extra KV bytes at the bandwidth probed around its run.
void add_kv_stream_ratios(json& rows) {
  if (rows.empty()) return;
  const json& base = rows[0];
  for (auto& r : rows) {
    const double extra_bytes = static_cast<double>(r["context"].get<int>() - base["context"].get<int>()) *
                               r["kv_bytes_per_token"].get<double>();
    if (extra_bytes <= 0) continue;
    const double kv_ms = 1e3 * extra_bytes / (r["bandwidth_gb_s"].get<double>() * 1e9);
    r["extra_ms"] = r["ms_per_token"].get<double>() - base["ms_per_token"].get<double>();
    r["kv_stream_ms"] = kv_ms;
    r["extra_vs_kv_stream"] = r["extra_ms"].get<double>() / kv_ms;
  }
}

// Runs the peer once (a shell command printing one JSON object as its last line) and returns
// that object, or {"error": its output}.
json run_peer(const std::string& cmd) {
  fmt::print(stderr, "running the peer: {}\n", cmd);
  std::fflush(stdout);
  std::string text;
  if (std::FILE* f = popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    const int rc = pclose(f);
    if (rc != 0) fmt::print(stderr, "the peer exited with status {}\n", rc);
  }
  const auto brace = text.rfind("\n{");
  try {
    json peer = json::parse(brace == std::string::npos ? text : text.substr(brace + 1));
    if ((peer.contains("decode") && peer.contains("prefill")) || peer.contains("context_decode")) return peer;
  } catch (const std::exception& e) {
    fmt::print(stderr, "could not read the peer's JSON ({})\n", e.what());
  }
  fmt::print(stderr, "the peer's output was:\n{}\n", text);
  return {{"error", text}};
}

// Read from /proc/self/status (kB): RssAnon, RssFile.
long status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string k;
  long v = 0;
  while (f >> k) {
    if (k == key) {
      f >> v;
      return v * 1024L;
    }
    std::getline(f, k);
  }
  return -1;
}

WeightPlacement placement_named(std::string_view v) {
  if (v == "in-place") return WeightPlacement::in_place;
  if (v == "pack") return WeightPlacement::packed;
  if (v == "image") return WeightPlacement::image;
  if (v == "auto") return WeightPlacement::automatic;
  throw Error(Status::invalid_argument, fmt::format("--weights / --load-modes: '{}' is not in-place, pack, image or auto", v));
}

// Makes sure a valid packed image of `dir` is at `path` (writing it when missing or refused);
// returns the seconds `gdn pack` took (0 when the image was there).
double ensure_image(const std::string& dir, const std::string& path, WeightQuant quant, LmHeadQuant lm_head) {
  try {
    ModelParams mp;
    mp.weights = WeightPlacement::image;
    mp.packed_image = path;
    mp.quant = quant;
    mp.lm_head_quant = lm_head;
    Model::load(dir, mp);
    return 0.0;
  } catch (const Error& e) {
    fmt::print(stderr, "writing the packed image {} ({})...\n", path, e.what());
  }
  PackImageOptions po;
  po.out = path;
  po.quant = quant;
  po.lm_head_quant = lm_head;
  const PackImageResult r = write_packed_image(dir, po);
  fmt::print(stderr, "  {} MB in {:.1f} s ({} MB of non-zero blocks)\n", r.file_bytes / 1000000, r.seconds, r.written_bytes / 1000000);
  return r.seconds;
}

// Load time and first-token latency of one way of reading the weights: Model::load, a context, the
// first one-token step (which faults in whatever the load did not read) and a second one.
json measure_load(const std::string& dir, WeightPlacement w, const std::string& image, WeightQuant quant, LmHeadQuant lm_head,
                  int threads) {
  ModelParams mp;
  mp.weights = w;
  mp.packed_image = image;
  mp.quant = quant;
  mp.lm_head_quant = lm_head;
  const auto t0 = Clock::now();
  auto model = Model::load(dir, mp);
  const double load_s = seconds_since(t0);
  const long anon = status_bytes("RssAnon:");
  ContextParams p;
  p.max_sequences = 1;
  p.max_context = 8;
  p.max_batch_tokens = 8;
  p.threads = threads;
  const auto t1 = Clock::now();
  Context ctx(model, p);
  const double context_s = seconds_since(t1);
  const SeqId s = ctx.create_sequence();
  Batch b;
  double token_s[2] = {0, 0};
  for (double& t : token_s) {
    b.clear();
    b.add(s, Token{1}, LogitsFor::last);
    const auto t2 = Clock::now();
    ctx.step(b);
    t = seconds_since(t2);
  }
  const long file = status_bytes("RssFile:");
  return {{"weights", weight_placement_name(model->weight_placement())}, {"load_s", load_s}, {"context_s", context_s},
          {"first_token_s", token_s[0]}, {"second_token_s", token_s[1]}, {"rss_anon_after_load_bytes", anon},
          {"rss_file_after_two_tokens_bytes", file}};
}

int usage() {
  std::fputs(
      "usage: gdn bench [--model DIR | --shape 0.8b|2b|27b [--layers N]] [--cache DIR] [--threads N] [--runs N]\n"
      "                 [--decode-tokens N] [--prompt-tokens N] [--batches 1,2,4,...] [--contexts 512,4096,...] [--kv-dtypes f32,bf16]\n"
      "                 [--stream-mib N] [--quick] [--json FILE] [--peer-python PY] [--peer-script FILE]\n"
      "                 [--peer-args 'ARGS'] [--rounds N] [--weights auto|pack|image|in-place] [--in-place]\n"
      "                 [--image-path FILE] [--load-modes in-place,pack,image] [--sparse] [--shards N] [--quant q8_0|q4_0|q4_k|q4_k_m]\n"
      "                 [--lm-head-quant auto|q8_0|q4_0|q4_k]\n"
      "                 [--float32-only] [--context-rounds N]\n"
      "  --quick        a few seconds: 1 run, 4 decode tokens, 64-token prompt, batches 1,4, context 512, no load section\n"
      "  --peer-python  also run llama.cpp (llama-cpp-python) on the same weights and print ours/llama.cpp\n"
      "  --weights      where the measured model reads its projections (default auto; see WeightPlacement)\n"
      "  --in-place     the same as --weights in-place: the mapped checkpoint, no packing\n"
      "  --image-path   the packed image for --weights image and the load section (default: in the\n"
      "                 checkpoint's directory, or the cache for a generated one; written when missing)\n"
      "  --load-modes   load time and first-token latency of each ('' for none)\n"
      "  --sparse       with --shape: generate an all-zero checkpoint, holes on disk (sizes, not numerics)\n"
      "  --rounds N     with a peer: N head-to-head rounds of batch-1 prefill + decode, ours and the peer\n"
      "                 alternating, each bracketed by a bandwidth measurement (default 3)\n"
      "  --float32-only measure only the default float32 matmul inputs (not also bf16 inputs)\n"
      "  --layers N     with --shape: only its first N layers (every 4th full attention), for long-context runs\n"
      "  --kv-page-size N  positions per KV page in the context sections (default as ContextParams: 64)\n"
      "  --context-rounds N  with a peer: N rounds of decode at each --contexts length, ours per --kv-dtypes and\n"
      "                 llama.cpp's (f16 cache) in turn, each bracketed by a bandwidth measurement\n"
      "  --write-checkpoint DIR [--sparse]  write the --shape's checkpoint (sparse: no data, reads as zeros) and stop\n"
      "  --backend cuda the GPU benchmark instead (tools/gdn/bench_cuda.cpp)\n",
      stderr);
  return 2;
}

}  // namespace

int bench(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come, also through a pipe
  for (int i = 0; i + 1 < argc; ++i)
    if (std::string_view(argv[i]) == "--backend") {
      if (parse_backend(argv[i + 1]) == Backend::cuda) return bench_cuda(argc, argv);
      break;
    }
  Options o;
  bool batches_set = false, contexts_set = false;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--model" && v) o.model = argv[++i];
    else if (a == "--shape" && v) o.shape = argv[++i];
    else if (a == "--layers" && v) o.layers = std::max(1, std::atoi(argv[++i]));
    else if (a == "--cache" && v) o.cache = argv[++i];
    else if (a == "--threads" && v) o.threads = std::atoi(argv[++i]);
    else if (a == "--runs" && v) o.runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--decode-tokens" && v) o.decode_tokens = std::max(1, std::atoi(argv[++i]));
    else if (a == "--prompt-tokens" && v) o.prompt_tokens = std::max(1, std::atoi(argv[++i]));
    else if (a == "--batches" && v) { o.batches = parse_ints(argv[++i]); batches_set = true; }
    else if (a == "--contexts" && v) { o.contexts = parse_ints(argv[++i]); contexts_set = true; }
    else if (a == "--kv-dtypes" && v) o.kv_dtypes = parse_kv_dtypes(argv[++i]);
    else if (a == "--stream-mib" && v) o.stream_bytes = std::int64_t{std::atoi(argv[++i])} << 20;
    else if (a == "--json" && v) o.json_out = argv[++i];
    else if (a == "--peer-python" && v) o.peer_python = argv[++i];
    else if (a == "--peer-script" && v) o.peer_script = argv[++i];
    else if (a == "--peer-args" && v) o.peer_args = argv[++i];
    else if (a == "--rounds" && v) o.rounds = std::max(0, std::atoi(argv[++i]));
    else if (a == "--context-rounds" && v) o.context_rounds = std::max(0, std::atoi(argv[++i]));
    else if (a == "--kv-page-size" && v) o.kv_page_size = std::max(1, std::atoi(argv[++i]));
    else if (a == "--in-place") o.weights = WeightPlacement::in_place;
    else if (a == "--weights" && v) o.weights = placement_named(argv[++i]);
    else if (a == "--image-path" && v) o.image_path = argv[++i];
    else if (a == "--quant" && v) o.quant = parse_weight_quant(argv[++i]);
    else if (a == "--lm-head-quant" && v) o.lm_head_quant = parse_lm_head_quant(argv[++i]);
    else if (a == "--load-modes" && v) {
      o.load_modes.clear();
      for (std::string_view m = argv[++i]; !m.empty();) {
        const auto comma = m.find(',');
        o.load_modes.emplace_back(m.substr(0, comma));
        placement_named(o.load_modes.back());
        m = comma == std::string_view::npos ? std::string_view() : m.substr(comma + 1);
      }
    } else if (a == "--sparse") o.sparse = true;
    else if (a == "--shards" && v) o.shards = std::max(1, std::atoi(argv[++i]));
    else if (a == "--float32-only") o.bf16_inputs = false;
    else if (a == "--quick") o.quick = true;
    else if (a == "--backend" && v) ++i;  // cpu
    else if (a == "--write-checkpoint" && v) {
      // Writes the --shape's checkpoint (random, or --sparse after it) and stops.
      const std::string out_dir = argv[++i];
      const bool sparse = o.sparse || (i + 1 < argc && std::string_view(argv[i + 1]) == "--sparse");
      make_checkpoint(bench_shape(o), out_dir, {.sparse = sparse, .shards = o.shards});
      fmt::print("wrote a {}{} checkpoint to {}\n", sparse ? "sparse " : "", o.shape, out_dir);
      return 0;
    } else return usage();
  }
  bool load_modes_set = false;
  for (int i = 0; i < argc; ++i) load_modes_set |= std::string_view(argv[i]) == "--load-modes";
  if (o.quick) {
    if (!load_modes_set) o.load_modes.clear();
    o.runs = 1;
    o.decode_tokens = 4;
    o.prompt_tokens = std::min(o.prompt_tokens, 64);
    if (!batches_set) o.batches = {1, 4};
    if (!contexts_set) o.contexts = {};
    o.stream_bytes = std::min<std::int64_t>(o.stream_bytes, std::int64_t{256} << 20);
  }

  json out;
  // The machine's load while we ran (other processes share the memory bus and the cores).
  const auto loadavg = [] {
    std::ifstream f("/proc/loadavg");
    double a = 0.0;
    f >> a;
    return a;
  };
  out["loadavg_start"] = loadavg();
  // Forked now, while this process is small and single-threaded (see BandwidthMeter).
  BandwidthMeter meter(o.threads, o.stream_bytes);
  std::string dir = o.model;
  std::string default_image;
  if (dir.empty()) {
    const Shape s = bench_shape(o);
    dir = (std::filesystem::path(o.cache) / (s.name + (o.sparse ? "-sparse" : ""))).string();
    const std::filesystem::path d(dir);
    if (!std::filesystem::exists(d / "model.safetensors") && !std::filesystem::exists(d / "model.safetensors.index.json")) {
      fmt::print(stderr, "writing a {} {} checkpoint to {} ...\n", o.sparse ? "sparse all-zero" : "random-weight", s.name, dir);
      const auto t0 = Clock::now();
      CheckpointOptions co;
      co.sparse = o.sparse;
      co.shards = o.shards;
      make_checkpoint(s, dir, co);
      fmt::print(stderr, "  done in {:.1f} s\n", seconds_since(t0));
    }
  } else if (!default_packed_image_path(dir).empty() && ::access(dir.c_str(), W_OK) != 0) {
    // A read-only checkpoint directory: the image goes to the cache.
    default_image = (std::filesystem::path(o.cache) / std::filesystem::path(default_packed_image_path(dir, o.quant, o.lm_head_quant)).filename()).string();
  }
  // The image of the measured format: the bf16 layout's, or the --quant's.
  const std::string image =
      !o.image_path.empty()   ? o.image_path
      : default_image.empty() ? default_packed_image_path(dir, o.quant, o.lm_head_quant)
                              : default_image;
  out["model_dir"] = dir;
  const bool wants_image = o.weights == WeightPlacement::image ||
                           std::find(o.load_modes.begin(), o.load_modes.end(), "image") != o.load_modes.end();
  if (wants_image && !image.empty()) {
    std::filesystem::create_directories(std::filesystem::path(image).parent_path());
    out["pack_seconds"] = ensure_image(dir, image, o.quant, o.lm_head_quant);
  }

  // 0. Load time and first-token latency per way of reading the weights (the page cache is warm
  // for all but the first: this VM's disk is not what is measured).
  if (!o.load_modes.empty()) {
    json rows = json::array();
    for (const auto& m : o.load_modes) {
      const WeightPlacement w = placement_named(m);
      if (w == WeightPlacement::image && image.empty()) continue;
      if (w == WeightPlacement::in_place && o.quant != WeightQuant::none) continue;  // quantised weights are never read in place
      json r = measure_load(dir, w, image, o.quant, o.lm_head_quant, o.threads);
      r["mode"] = m;
      fmt::print("load {:<9} {:7.3f} s load + {:6.3f} s context, first token {:7.3f} s, second {:7.3f} s; RSS after load: "
                 "{:.0f} MiB anonymous\n",
                 m, r["load_s"].get<double>(), r["context_s"].get<double>(), r["first_token_s"].get<double>(),
                 r["second_token_s"].get<double>(), r["rss_anon_after_load_bytes"].get<double>() / 1048576.0);
      rows.push_back(r);
    }
    out["load"] = rows;
  }

  ModelParams mparams;
  mparams.weights = o.weights;
  mparams.packed_image = image;
  mparams.quant = o.quant;
  mparams.lm_head_quant = o.lm_head_quant;
  auto model = Model::load(dir, mparams);
  out["weights"] = weight_placement_name(model->weight_placement());
  const auto& cfg = model->config();
  out["weights_packed_bytes"] = model->packed_bytes();

  ThreadPool bw_pool(o.threads);
  const int threads = bw_pool.size();
  out["threads"] = threads;
  // The projection kernel that runs: the bf16 one, or the block-quantised one under --quant.
  const std::string kernel = o.quant == WeightQuant::none
                                 ? std::string(cpu::linear_kernel_name())
                                 : fmt::format("{} (lm_head {}) {}", weight_quant_name(o.quant),
                                               weight_quant_name(lm_head_weight_quant(o.quant, o.lm_head_quant)),
                                               cpu::quant_kernel_name(cpu::quant_kernel()));
  out["kernel"] = kernel;
  fmt::print("gdn bench: {} ({} layers, hidden {}, vocab {}), {} threads, kernel {}, weights {}\n", dir, cfg.num_layers,
             cfg.hidden_size, cfg.vocab_size, threads, kernel,
             model->weight_placement() == WeightPlacement::packed
                 ? fmt::format("packed in the kernel's order at load ({:.0f} MB)", model->packed_bytes() / 1e6)
             : model->weight_placement() == WeightPlacement::image
                 ? fmt::format("mapped from the packed image {} ({:.0f} MB)", model->packed_image_path(), model->packed_bytes() / 1e6)
                 : std::string("read in place"));

  // 1. Bandwidth and roofline.
  const Bandwidth bw = meter.measure(o.stream_bytes, std::max(o.runs, 3));
  const std::int64_t wbytes = weight_bytes_per_token(*model);
  const double roofline = bw.median_gbs * 1e9 / static_cast<double>(wbytes);
  out["bandwidth"] = {{"median_gb_s", bw.median_gbs}, {"best_gb_s", bw.best_gbs}, {"buffer_bytes", bw.bytes}};
  out["weight_bytes_per_token"] = wbytes;
  out["roofline_tok_s"] = roofline;
  fmt::print("read bandwidth       {:.2f} GB/s median ({:.2f} best) over {} MiB\n", bw.median_gbs, bw.best_gbs, bw.bytes >> 20);
  fmt::print("weights per token    {:.1f} MB  ->  decode roofline {:.2f} tok/s\n", static_cast<double>(wbytes) / 1e6, roofline);

  const int P = o.prompt_tokens, N = o.decode_tokens;
  const auto prompt = random_tokens(static_cast<std::size_t>(P), cfg.vocab_size, 1);
  long allocs = 0;
  long alloc_steps = 0;

  // 2. Batch-1 prefill and decode, with float32 matmul inputs (the default) and, unless
  // --float32-only, with bf16 inputs (ContextParams::matmul_input).
  std::vector<MatmulInput> inputs = {MatmulInput::float32};
  if (o.bf16_inputs) inputs.push_back(MatmulInput::bf16);
  const auto input_label = [](MatmulInput mi) { return mi == MatmulInput::bf16 ? " (bf16 inputs)" : ""; };
  // Where a mode's figures go in the JSON: float32 at the top level, bf16 under "bf16_inputs".
  const auto section = [&](MatmulInput mi) -> json& { return mi == MatmulInput::bf16 ? out["bf16_inputs"] : out; };
  // The bandwidth probed around each batch-1 decode run: 512 MiB, in a child process, ~0.1 s.
  RooflineProbe probe{[&] { return meter.measure(std::min<std::int64_t>(o.stream_bytes, 512 << 20), 2).median_gbs; }, wbytes};
  const double step_context = P + 0.5 * (N + 1);  // the mean context a batch-1 run's steps read (run_batch1)
  for (const MatmulInput mi : inputs) {
    Context ctx(model, batch1_params(P, N, o.runs, o.threads, mi));
    probe.state_bytes = 2 * ctx.gdn_state_bytes_per_sequence();  // the same for every input mode
    probe.kv_bytes_per_token = ctx.kv_bytes_per_token();
    const SeqId s = ctx.create_sequence();
    Batch batch;
    batch.reserve(4, static_cast<std::size_t>(P));
    const Batch1Speeds b1 = run_batch1(ctx, s, prompt, N, o.runs, batch, allocs, alloc_steps, &probe);
    const std::vector<double>& pre = b1.prefill_tok_s;
    const std::vector<double>& dec = b1.decode_tok_s;
    const double d = median(dec), pf = median(pre), frac = median(b1.decode_fraction);
    const double frac_step = median(b1.decode_fraction_step);
    json& dst = section(mi);
    dst["decode"] = {{"tok_s", d}, {"runs", dec}, {"tokens", N}, {"context", P}, {"fraction_of_roofline", frac},
                     {"fraction_of_roofline_runs", b1.decode_fraction}, {"fraction_of_step_roofline", frac_step},
                     {"fraction_of_step_roofline_runs", b1.decode_fraction_step},
                     {"step_bytes", probe.step_bytes(step_context)}};
    dst["prefill"] = {{"tok_s", pf}, {"runs", pre}, {"tokens", P}};
    if (mi == MatmulInput::float32) {
      out["peak_rss_bytes_batch1"] = peak_rss_bytes();
      out["gdn_state_bytes_per_sequence"] = ctx.gdn_state_bytes_per_sequence();
      out["kv_bytes_per_token"] = ctx.kv_bytes_per_token();
    }
    fmt::print("prefill {:5d} tokens  {:.1f} tok/s (median of {}){}\n", P, pf, pre.size(), input_label(mi));
    fmt::print("decode batch 1       {:.2f} tok/s (median of {} x {} tokens) = {:.1f}% of the roofline probed around each "
               "run{}\n", d, dec.size(), N, 100.0 * frac, input_label(mi));
    fmt::print("                     {:.1f}% of the step's: {:.1f} MB weights + {:.1f} MB state read and written + "
               "{:.1f} MB KV at {} positions\n", 100.0 * frac_step, static_cast<double>(wbytes) / 1e6,
               static_cast<double>(probe.state_bytes) / 1e6, probe.kv_bytes_per_token * step_context / 1e6, P);
    if (mi == MatmulInput::float32)
      fmt::print("state per sequence   {:.2f} MB GDN state + {} bytes KV per token\n",
                 static_cast<double>(ctx.gdn_state_bytes_per_sequence()) / 1e6, ctx.kv_bytes_per_token());
  }

  // 3. Aggregate decode throughput by batch size (short prompts; context ~64), for each input mode.
  for (const MatmulInput mi : inputs) {
    if (o.batches.empty()) break;
    const int maxb = *std::max_element(o.batches.begin(), o.batches.end());
    const int short_prompt = std::min(P, 64);
    ContextParams p;
    p.max_sequences = maxb;
    p.max_context = short_prompt + 2 * N * (o.runs + 1) + 8;  // sequence 0 also runs the paired batch-1 steps
    p.max_batch_tokens = std::max(short_prompt * 4, maxb);
    p.threads = o.threads;
    p.matmul_input = mi;
    Context ctx(model, p);
    std::vector<SeqId> seqs;
    Batch batch;
    batch.reserve(static_cast<std::size_t>(maxb), static_cast<std::size_t>(short_prompt * maxb));
    for (int i = 0; i < maxb; ++i) seqs.push_back(ctx.create_sequence());
    json rows = json::array();
    // Batch-1 speed follows the memory bandwidth, which drifts, while large batches are bound by
    // compute; so each run of B sequences is paired with a batch-1 run just before it (sequence 0
    // alone), and the scaling is the median of the per-pair ratios.
    for (const int B : o.batches) {
      std::vector<double> agg, scale;
      // Each sequence gets the same short prompt once, then the runs decode on from there.
      for (int i = 0; i < B; ++i) ctx.reset_sequence(seqs[static_cast<std::size_t>(i)]);
      batch.clear();
      for (int i = 0; i < B; ++i)
        batch.add(seqs[static_cast<std::size_t>(i)], std::span(prompt).first(static_cast<std::size_t>(short_prompt)));
      ctx.step(batch);
      for (int r = 0; r < o.runs + 1; ++r) {
        const double t1 = B > 1 ? decode_steps(ctx, std::span(seqs).first(1), N, batch, r > 0 ? &allocs : nullptr) : 0.0;
        const double td = decode_steps(ctx, std::span(seqs).first(static_cast<std::size_t>(B)), N, batch,
                                       r > 0 ? &allocs : nullptr);
        if (r > 0) {
          agg.push_back(static_cast<double>(B) * N / td);
          scale.push_back(B > 1 ? static_cast<double>(B) * t1 / td : 1.0);
          alloc_steps += B > 1 ? 2 * N : N;
        }
      }
      const double a = median(agg), x = median(scale);
      rows.push_back({{"batch", B}, {"tok_s", a}, {"runs", agg}, {"vs_batch1", x}, {"vs_batch1_runs", scale}});
      fmt::print("decode batch {:2d}      {:.2f} tok/s aggregate  ({:.2f}x batch 1, paired runs){}\n", B, a, x, input_label(mi));
    }
    section(mi)["batch_decode"] = rows;
  }

  // 4. Decode cost against context length, per KV dtype. The attention read grows with the
  // context: "extra" is the time per token beyond the shortest context's, against the added KV
  // bytes read per token over the bandwidth probed around the run (1.0: the KV streams at
  // bandwidth). With --context-rounds and a peer, the rounds below measure this instead.
  if (!o.contexts.empty() && (o.context_rounds == 0 || o.peer_python.empty())) {
    json rows = json::array();
    for (const DType kvd : o.kv_dtypes) {
      json r = context_decode_rows(model, kvd, o.kv_page_size, o.contexts, N, o.runs, o.threads, probe, allocs, alloc_steps);
      for (const auto& row : r) {
        std::string extra;
        if (row.contains("extra_vs_kv_stream"))
          extra = fmt::format("; +{:.1f} ms over {} = {:.2f}x its KV read at bandwidth", row["extra_ms"].get<double>(),
                              r[0]["context"].get<int>(), row["extra_vs_kv_stream"].get<double>());
        fmt::print("decode at context {:5d}  KV {:4}  {:.2f} tok/s ({:.1f} ms/token){}; prefill to it {:.1f} tok/s\n",
                   row["context"].get<int>(), dtype_name(kvd), row["tok_s"].get<double>(), row["ms_per_token"].get<double>(), extra,
                   row["prefill_tok_s"].get<double>());
        rows.push_back(row);
      }
    }
    out["context_decode"] = rows;
  }

  out["peak_rss_bytes"] = peak_rss_bytes();
  out["loadavg_end"] = loadavg();
  out["heap_allocations"] = {{"total", allocs}, {"decode_steps", alloc_steps},
                             {"per_step", alloc_steps ? static_cast<double>(allocs) / static_cast<double>(alloc_steps) : 0.0}};
  fmt::print("peak RSS             {:.0f} MiB ({:.0f} MiB after batch-1 runs)\n", out["peak_rss_bytes"].get<double>() / 1048576.0,
             out["peak_rss_bytes_batch1"].get<double>() / 1048576.0);
  fmt::print("heap allocations     {} in {} decode steps ({:.3f} per step)\n", allocs, alloc_steps,
             out["heap_allocations"]["per_step"].get<double>());
  fmt::print("load average         {:.2f} at start, {:.2f} at end (2 cores: other work shares them)\n",
             out["loadavg_start"].get<double>(), out["loadavg_end"].get<double>());

  // 5. The peer: llama.cpp on the same weights, every measurement above.
  const auto peer_cmd = [&](int runs, const std::string& batches) {
    return fmt::format("'{}' '{}' --model '{}' --threads {} --runs {} --decode-tokens {} --prompt-tokens {} --batches '{}' {}",
                       o.peer_python, o.peer_script, dir, threads, runs, N, P, batches, o.peer_args);
  };
  if (!o.peer_python.empty()) {
    const json peer = run_peer(peer_cmd(o.runs, fmt::format("{}", fmt::join(o.batches, ","))));
    out["llama_cpp"] = peer;
    if (!peer.contains("error")) {
      const double ld = peer["decode"]["tok_s"].get<double>(), lp = peer["prefill"]["tok_s"].get<double>();
      const double d = out["decode"]["tok_s"].get<double>(), pf = out["prefill"]["tok_s"].get<double>();
      out["ratio"] = {{"decode", d / ld}, {"prefill", pf / lp}};
      fmt::print("llama.cpp {}: decode {:.2f} tok/s, prefill {:.1f} tok/s ({}% of roofline at decode)\n",
                 peer.value("version", std::string("?")), ld, lp, static_cast<int>(std::lround(100.0 * ld / roofline)));
      fmt::print("ours / llama.cpp     decode {:.2f}x   prefill {:.2f}x  (one pass each, measured apart)\n", d / ld, pf / lp);
      if (peer.contains("batch_decode") && out.contains("batch_decode")) {
        json br = json::array();
        for (const auto& row : out["batch_decode"])
          for (const auto& prow : peer["batch_decode"])
            if (prow["batch"] == row["batch"]) {
              const double r = row["tok_s"].get<double>() / prow["tok_s"].get<double>();
              br.push_back({{"batch", row["batch"]}, {"ratio", r}});
              fmt::print("ours / llama.cpp     batch {:2d} decode {:.2f}x\n", row["batch"].get<int>(), r);
            }
        out["ratio"]["batch_decode"] = br;
      }
    }
  }

  // 6. Head to head. This machine's read bandwidth drifts by up to 2x within minutes (a shared
  // host), so figures measured minutes apart do not compare. Each round measures the bandwidth,
  // then ours (float32 inputs), ours (bf16 inputs) and the peer back to back (the order reversed
  // every other round), measuring the bandwidth again after each; an engine's roofline is the mean
  // of the two bandwidth figures around its run. The medians of the per-round ratios are the
  // comparison this tool stands by.
  if (!o.peer_python.empty() && o.rounds > 0) {
    Context ctx(model, batch1_params(P, N, o.runs, o.threads));
    std::optional<Context> ctx_bf16;
    if (o.bf16_inputs) ctx_bf16.emplace(model, batch1_params(P, N, o.runs, o.threads, MatmulInput::bf16));
    const SeqId s = ctx.create_sequence();
    const SeqId s_bf16 = ctx_bf16 ? ctx_bf16->create_sequence() : SeqId{0};
    Batch batch;
    batch.reserve(4, static_cast<std::size_t>(P));
    json rounds = json::array();
    std::vector<double> r_dec, r_pre, f_ours, f_probed, f_step, f_peer, rb_dec, rb_pre, fb_ours, fb_probed;
    for (int round = 0; round < o.rounds; ++round) {
      double od = 0, op = 0, of = 0, ofs = 0, bd = 0, bp = 0, bf = 0, ld = 0, lp = 0;
      const auto ours = [&] {
        const Batch1Speeds b1 = run_batch1(ctx, s, prompt, N, o.runs, batch, allocs, alloc_steps, &probe);
        od = median(b1.decode_tok_s);
        op = median(b1.prefill_tok_s);
        of = median(b1.decode_fraction);
        ofs = median(b1.decode_fraction_step);
      };
      const auto ours_bf16 = [&] {
        const Batch1Speeds b1 = run_batch1(*ctx_bf16, s_bf16, prompt, N, o.runs, batch, allocs, alloc_steps, &probe);
        bd = median(b1.decode_tok_s);
        bp = median(b1.prefill_tok_s);
        bf = median(b1.decode_fraction);
      };
      bool peer_ok = true;
      const auto theirs = [&] {
        const json pj = run_peer(peer_cmd(o.runs, "1"));
        if (pj.contains("error")) { peer_ok = false; return; }
        ld = pj["decode"]["tok_s"].get<double>();
        lp = pj["prefill"]["tok_s"].get<double>();
      };
      // The engines in turn (reversed every other round), each between two bandwidth measurements:
      // an engine's roofline is the mean of the two around it.
      std::vector<std::pair<int, std::function<void()>>> order = {{0, ours}, {2, theirs}};
      if (ctx_bf16) order.insert(order.begin() + 1, {1, ours_bf16});
      if (round % 2 == 1) std::reverse(order.begin(), order.end());
      double bw_of[3] = {0, 0, 0};
      double before = meter.measure(o.stream_bytes, 3).median_gbs;
      std::vector<double> bws = {before};
      for (auto& [who, run] : order) {
        run();
        if (!peer_ok) break;
        const double after = meter.measure(o.stream_bytes, 3).median_gbs;
        bw_of[who] = 0.5 * (before + after);
        bws.push_back(after);
        before = after;
      }
      if (!peer_ok) break;
      const auto roof_of = [&](int who) { return bw_of[who] * 1e9 / static_cast<double>(wbytes); };
      const double roof = roof_of(0), roof_peer = roof_of(2);
      json rj = {{"order", round % 2 == 0 ? "ours first" : "peer first"}, {"bandwidth_gb_s", bws},
                 {"ours", {{"decode_tok_s", od}, {"prefill_tok_s", op}, {"roofline_tok_s", roof}, {"fraction_probed", of},
                           {"fraction_probed_step", ofs}}},
                 {"llama_cpp", {{"decode_tok_s", ld}, {"prefill_tok_s", lp}, {"roofline_tok_s", roof_peer}}}};
      r_dec.push_back(od / ld);
      r_pre.push_back(op / lp);
      f_ours.push_back(od / roof);
      f_probed.push_back(of);
      f_step.push_back(ofs);
      f_peer.push_back(ld / roof_peer);
      std::string bf16_text;
      if (ctx_bf16) {
        const double roof_b = roof_of(1);
        rj["ours_bf16_inputs"] = {{"decode_tok_s", bd}, {"prefill_tok_s", bp}, {"roofline_tok_s", roof_b}, {"fraction_probed", bf}};
        rb_dec.push_back(bd / ld);
        rb_pre.push_back(bp / lp);
        fb_ours.push_back(bd / roof_b);
        fb_probed.push_back(bf);
        bf16_text = fmt::format("; bf16 inputs: decode {:.2f} ({:.0f}%) = {:.2f}x, prefill {:.1f} = {:.2f}x", bd, 100 * bd / roof_b,
                                bd / ld, bp, bp / lp);
      }
      rounds.push_back(rj);
      fmt::print("round {}  bandwidth {:.1f} GB/s  decode ours {:.2f} ({:.0f}%) vs {:.2f} ({:.0f}%) tok/s = {:.2f}x  "
                 "prefill {:.1f} vs {:.1f} tok/s = {:.2f}x{}\n",
                 round + 1, fmt::join(bws, "/"), od, 100 * od / roof, ld, 100 * ld / roof_peer, od / ld, op, lp, op / lp, bf16_text);
    }
    if (!r_dec.empty()) {
      json med = {{"decode_ratio", median(r_dec)}, {"prefill_ratio", median(r_pre)},
                  {"ours_fraction_of_roofline", median(f_ours)}, {"ours_fraction_of_roofline_probed", median(f_probed)},
                  {"ours_fraction_of_step_roofline_probed", median(f_step)},
                  {"llama_cpp_fraction_of_roofline", median(f_peer)}};
      if (!rb_dec.empty())
        med["bf16_inputs"] = {{"decode_ratio", median(rb_dec)}, {"prefill_ratio", median(rb_pre)},
                              {"ours_fraction_of_roofline", median(fb_ours)},
                              {"ours_fraction_of_roofline_probed", median(fb_probed)}};
      out["head_to_head"] = {{"rounds", rounds}, {"median", med}};
      fmt::print("head to head, median of {} rounds: decode {:.2f}x llama.cpp, prefill {:.2f}x; batch-1 decode at "
                 "{:.1f}% of the roofline bracketing it ({:.1f}% probed around each run, {:.1f}% of the step's; "
                 "llama.cpp {:.1f}%)\n",
                 r_dec.size(), median(r_dec), median(r_pre), 100 * median(f_ours), 100 * median(f_probed), 100 * median(f_step),
                 100 * median(f_peer));
      if (!rb_dec.empty())
        fmt::print("  with bf16 matmul inputs: decode {:.2f}x llama.cpp ({:.1f}% of the roofline), prefill {:.2f}x\n",
                   median(rb_dec), 100 * median(fb_ours), median(rb_pre));
    }
  }

  // 7. Long context head to head: in each round our decode at every --contexts length for each
  // --kv-dtypes, and llama.cpp's (its default f16 cache), in turn (reversed every other round),
  // each between two bandwidth measurements. Per context: both engines' ms per token, their ratio,
  // and each one's extra time over the shortest context against its extra KV bytes at bandwidth.
  if (!o.peer_python.empty() && o.context_rounds > 0 && o.contexts.size() >= 2) {
    const ModelConfig& c = model->config();
    const double peer_kv_bytes = 2.0 * 2.0 * c.count_layers(LayerKind::full_attention) * c.num_key_value_heads * c.head_dim;
    const std::string ctx_list = fmt::format("{}", fmt::join(o.contexts, ","));
    json rounds = json::array();
    std::map<std::string, std::vector<double>> ratio_of, stream_of;  // "context/kv dtype" → per-round figures
    for (int round = 0; round < o.context_rounds; ++round) {
      std::vector<std::function<void(json&)>> order;
      for (const DType kvd : o.kv_dtypes)
        order.push_back([&, kvd](json& rj) {
          rj[fmt::format("ours_{}", dtype_name(kvd))] =
              context_decode_rows(model, kvd, o.kv_page_size, o.contexts, N, o.runs, o.threads, probe, allocs, alloc_steps);
        });
      order.push_back([&](json& rj) {
        json pj = run_peer(fmt::format("'{}' '{}' --model '{}' --threads {} --runs {} --decode-tokens {} --contexts {} --context-only {}",
                                       o.peer_python, o.peer_script, dir, threads, o.runs, N, ctx_list, o.peer_args));
        if (pj.contains("context_decode")) {
          json r = pj["context_decode"];
          for (auto& row : r) {
            row["ms_per_token"] = 1e3 / row["tok_s"].get<double>();
            row["kv_bytes_per_token"] = peer_kv_bytes;
          }
          rj["llama_cpp_rows"] = r;
        }
      });
      if (round % 2 == 1) std::reverse(order.begin(), order.end());
      json rj = json::object();
      std::vector<double> bws = {meter.measure(o.stream_bytes, 3).median_gbs};
      for (auto& run : order) {
        run(rj);
        bws.push_back(meter.measure(o.stream_bytes, 3).median_gbs);
      }
      rj["bandwidth_gb_s"] = bws;
      if (!rj.contains("llama_cpp_rows")) break;
      // The peer's bandwidth: the probes around its run.
      const std::size_t at = round % 2 == 1 ? 0 : bws.size() - 2;
      for (auto& row : rj["llama_cpp_rows"]) row["bandwidth_gb_s"] = 0.5 * (bws[at] + bws[at + 1]);
      add_kv_stream_ratios(rj["llama_cpp_rows"]);
      for (const DType kvd : o.kv_dtypes) {
        const json& ours = rj[fmt::format("ours_{}", dtype_name(kvd))];
        for (std::size_t i = 0; i < ours.size(); ++i) {
          const json& peer_row = rj["llama_cpp_rows"][i];
          const std::string key = fmt::format("{}/{}", ours[i]["context"].get<int>(), dtype_name(kvd));
          const double ratio = peer_row["ms_per_token"].get<double>() / ours[i]["ms_per_token"].get<double>();
          ratio_of[key].push_back(ratio);
          if (ours[i].contains("extra_vs_kv_stream")) stream_of[key].push_back(ours[i]["extra_vs_kv_stream"].get<double>());
          fmt::print("context round {} context {:6d}: ours ({} KV) {:.1f} ms/token{}, llama.cpp (f16 KV) {:.1f} ms/token{} -> {:.2f}x\n",
                     round + 1, ours[i]["context"].get<int>(), dtype_name(kvd), ours[i]["ms_per_token"].get<double>(),
                     ours[i].contains("extra_vs_kv_stream")
                         ? fmt::format(" (extra {:.2f}x its KV at bandwidth)", ours[i]["extra_vs_kv_stream"].get<double>())
                         : std::string(),
                     peer_row["ms_per_token"].get<double>(),
                     peer_row.contains("extra_vs_kv_stream")
                         ? fmt::format(" (extra {:.2f}x)", peer_row["extra_vs_kv_stream"].get<double>())
                         : std::string(),
                     ratio);
          if (kvd == o.kv_dtypes.front() && peer_row.contains("extra_vs_kv_stream"))
            stream_of[fmt::format("{}/llama.cpp", peer_row["context"].get<int>())].push_back(peer_row["extra_vs_kv_stream"].get<double>());
        }
      }
      rounds.push_back(rj);
    }
    json med = json::object();
    for (const auto& [key, v] : ratio_of) med[key]["speed_vs_llama_cpp"] = median(v);
    for (const auto& [key, v] : stream_of) med[key]["extra_vs_kv_stream"] = median(v);
    out["context_head_to_head"] = {{"rounds", rounds}, {"median", med}};
    fmt::print("long context, medians of {} rounds (speed = llama.cpp ms / ours; extra = time over the shortest context / "
               "its KV bytes at bandwidth):\n",
               rounds.size());
    for (const auto& [key, v] : med.items())
      fmt::print("  {:>16}: {}\n", key, v.dump());
  }

  out["loadavg_after_peer"] = loadavg();
  if (!o.json_out.empty()) {
    std::ofstream(o.json_out) << out.dump(2) << "\n";
    fmt::print(stderr, "wrote {}\n", o.json_out);
  }
  return 0;
}

}  // namespace gdn::cli
