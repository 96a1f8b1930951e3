// gdn bench --backend cuda: the whole model through Context on a GPU, against the HBM roofline.
//
//   gdn bench --backend cuda [--shape 0.8b|27b|tiny | --model DIR] [--cache DIR] [--device N]
//             [--batches 1,8,32] [--context 4096] [--prefill 512,8192] [--decode-tokens N] [--runs N]
//             [--json FILE] [--random-weights] [--bandwidth-mib N]
//
// Without --model it writes (once, under --cache) a checkpoint of the shape: random bf16 weights
// for 0.8b and tiny; for 27b a sparse one (54 GB of tensors that occupy no disk and read as zeros),
// whose weights are then overwritten with random values on the device (--random-weights, implied
// for 27b). In one process:
//   - the device's copy bandwidth (read + write of a device-to-device copy), and the decode roofline
//     = bytes a step must read (every projection and the lm_head once, one embedding row, the GDN and
//     conv state read and written, the KV cache of the context) ÷ that bandwidth;
//   - batch-1 decode at --context positions, time per token (median of --runs runs) and its
//     fraction of the roofline, with captured CUDA graphs and without;
//   - batch 8 and 32 (--batches) aggregate tokens/s and their ratio to batch 1;
//   - prefill tokens/s for each --prefill length;
//   - an MTP verification step (k = 3: 4 tokens, rollback recorded) against a plain decode step.
// It writes one JSON (--json) and prints a short text report.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "checkpoints.hpp"
#include "commands.hpp"
#include "gdn/gdn.hpp"

namespace gdn::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int> ints(std::string_view s) {
  std::vector<int> out;
  while (!s.empty()) {
    const auto c = s.find(',');
    out.push_back(std::stoi(std::string(s.substr(0, c))));
    if (c == std::string_view::npos) break;
    s.remove_prefix(c + 1);
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct CudaOptions {
  std::string model, shape = "0.8b", cache = "build/bench-models", json_out;
  int device = 0, context = 4096, decode_tokens = 32, runs = 5, bandwidth_mib = 2048;
  std::vector<int> batches = {1, 8, 32}, prefill = {512, 8192};
  bool random_weights = false;
};

Token token_at(int s, int i, int vocab) { return static_cast<Token>((s * 7919 + i * 104729) % std::min(vocab, 150000)); }

ContextParams params(const CudaOptions& o, int sequences, int context, int batch_tokens, bool graphs, int rollback = 0) {
  ContextParams p;
  p.backend = Backend::cuda;
  p.device = o.device;
  p.max_sequences = sequences;
  p.max_context = context;
  p.max_batch_tokens = batch_tokens;
  p.max_logits_rows = std::max(sequences, 8);
  p.cuda_graphs = graphs;
  p.max_rollback_tokens = rollback;
  // Twice the pages the sequences need: the timed runs restore snapshots, whose shared last page
  // is copied on the first write.
  p.kv_pages = 2 * static_cast<std::int64_t>(sequences) * ((context + p.kv_page_size - 1) / p.kv_page_size);
  return p;
}

// Prefills `n` tokens on each sequence (in passes of the context's max_batch_tokens).
void fill(Context& ctx, std::span<const SeqId> seqs, int n) {
  const int V = ctx.model().config().vocab_size;
  Batch b;
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    std::vector<Token> toks(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) toks[static_cast<std::size_t>(i)] = token_at(static_cast<int>(s), i, V);
    b.clear();
    b.add(seqs[s], toks, LogitsFor::last);
    ctx.step(b);
  }
}

// Seconds per decode step for the sequences together, median over runs (each run decodes
// `steps` tokens after a warm-up step, then rolls the sequences back by resetting to a snapshot).
double decode_seconds(Context& ctx, std::span<const SeqId> seqs, int steps, int runs) {
  const int V = ctx.model().config().vocab_size;
  std::vector<SnapshotId> snaps;
  for (const SeqId s : seqs) snaps.push_back(ctx.snapshot(s));
  std::vector<double> per_step;
  Batch b;
  for (int r = 0; r < runs + 1; ++r) {
    for (std::size_t i = 0; i < seqs.size(); ++i) ctx.restore(seqs[i], snaps[i]);
    const auto t0 = Clock::now();
    for (int t = 0; t < steps; ++t) {
      b.clear();
      for (std::size_t i = 0; i < seqs.size(); ++i) b.add(seqs[i], token_at(static_cast<int>(i), t, V));
      ctx.step(b);
    }
    if (r > 0) per_step.push_back(seconds_since(t0) / steps);
  }
  for (const SnapshotId s : snaps) ctx.free_snapshot(s);
  return median(per_step);
}

}  // namespace

int bench_cuda(int argc, char** argv) {
  CudaOptions o;
  bool write_only = false, sparse = false;
  std::string write_dir;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--backend" && v) ++i;
    else if (a == "--model" && v) o.model = argv[++i];
    else if (a == "--shape" && v) o.shape = argv[++i];
    else if (a == "--cache" && v) o.cache = argv[++i];
    else if (a == "--device" && v) o.device = std::stoi(argv[++i]);
    else if (a == "--batches" && v) o.batches = ints(argv[++i]);
    else if (a == "--context" && v) o.context = std::stoi(argv[++i]);
    else if (a == "--prefill" && v) o.prefill = ints(argv[++i]);
    else if (a == "--decode-tokens" && v) o.decode_tokens = std::max(1, std::stoi(argv[++i]));
    else if (a == "--runs" && v) o.runs = std::max(1, std::stoi(argv[++i]));
    else if (a == "--json" && v) o.json_out = argv[++i];
    else if (a == "--bandwidth-mib" && v) o.bandwidth_mib = std::max(1, std::stoi(argv[++i]));
    else if (a == "--random-weights") o.random_weights = true;
    else if (a == "--write-checkpoint" && v) { write_only = true; write_dir = argv[++i]; }
    else if (a == "--sparse") sparse = true;
    else {
      fmt::print(stderr, "gdn bench --backend cuda: unknown argument '{}' (see tools/gdn/bench_cuda.cpp)\n", a);
      return 2;
    }
  }
  if (write_only) {
    make_checkpoint(shape_for(o.shape), write_dir, {.sparse = sparse});
    fmt::print("wrote a {}{} checkpoint to {}\n", sparse ? "sparse " : "", o.shape, write_dir);
    return 0;
  }
  json out;
  std::string dir = o.model;
  if (dir.empty()) {
    const Shape s = shape_for(o.shape);
    const bool big = o.shape == "27b";
    o.random_weights = o.random_weights || big;
    dir = (std::filesystem::path(o.cache) / (s.name + (big ? "-sparse" : ""))).string();
    if (!std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors")) {
      fmt::print(stderr, "writing a {} {} checkpoint to {} ...\n", big ? "sparse" : "random-weight", s.name, dir);
      make_checkpoint(s, dir, {.sparse = big});
    }
  }
  out["model_dir"] = dir;
  ModelParams mp;
  mp.backend = Backend::cuda;
  mp.device = o.device;
  auto t0 = Clock::now();
  auto model = Model::load(dir, mp);  // uploads the weights
  out["load_seconds"] = seconds_since(t0);
  if (o.random_weights) randomize_cuda_weights(*model, o.device, 7);
  const ModelConfig& c = model->config();

  // Bandwidth and the bytes of a decode step.
  const double bw = measure_cuda_copy_bandwidth(o.device, static_cast<std::size_t>(o.bandwidth_mib) << 20);
  std::int64_t weight_bytes = c.hidden_size * 2;  // one embedding row
  for (const LinearWeight* w : model->weights().projections(false)) weight_bytes += w->out() * w->in() * 2;
  Context probe(model, params(o, 1, 16, 16, true));
  const std::int64_t state_bytes = 2 * probe.gdn_state_bytes_per_sequence();  // read and written
  const std::int64_t kv_token = probe.kv_bytes_per_token();
  const auto step_bytes = [&](int batch) {
    return static_cast<double>(weight_bytes) + batch * (static_cast<double>(state_bytes) + static_cast<double>(kv_token) * o.context);
  };
  out["copy_bandwidth_gb_s"] = bw / 1e9;
  out["weight_bytes_per_step"] = weight_bytes;
  out["state_bytes_per_sequence_step"] = state_bytes;
  out["kv_bytes_per_token"] = kv_token;
  fmt::print("gdn bench --backend cuda: {} ({} layers, hidden {}), device {}\n", dir, c.num_layers, c.hidden_size, o.device);
  fmt::print("  load + upload          {:.1f} s\n", out["load_seconds"].get<double>());
  fmt::print("  copy bandwidth         {:.0f} GB/s (read + write)\n", bw / 1e9);
  fmt::print("  bytes per decode step  {:.2f} GB weights + {:.1f} MB state + {:.1f} MB KV per sequence at {} positions\n",
             weight_bytes / 1e9, state_bytes / 1e6, kv_token * o.context / 1e6, o.context);

  // Decode at --context positions: batch 1 (graphs on and off), then the other batch sizes.
  json decode = json::array();
  double batch1 = 0.0;
  for (const int B : o.batches) {
    for (const bool graphs : {true, false}) {
      if (!graphs && B != 1) continue;
      Context ctx(model, params(o, B, o.context + o.decode_tokens + 8, 512, graphs));
      std::vector<SeqId> seqs;
      for (int i = 0; i < B; ++i) seqs.push_back(ctx.create_sequence());
      fill(ctx, seqs, o.context - 1);
      const double s = decode_seconds(ctx, seqs, o.decode_tokens, o.runs);
      const double roof = step_bytes(B) / bw;
      json row = {{"batch", B}, {"graphs", graphs}, {"seconds_per_step", s}, {"tok_s", B / s},
                  {"roofline_seconds", roof}, {"roofline_fraction", roof / s}};
      if (B == 1 && graphs) batch1 = B / s;
      if (B != 1 && batch1 > 0) row["vs_batch1"] = (B / s) / batch1;
      fmt::print("  decode batch {:>2}{}  {:.3f} ms/step, {:.1f} tok/s, {:.0f}% of the roofline ({:.3f} ms){}\n", B,
                 graphs ? " graphs" : "       ", s * 1e3, B / s, 100 * roof / s, roof * 1e3,
                 row.contains("vs_batch1") ? fmt::format(", {:.2f}x batch 1", row["vs_batch1"].get<double>()) : "");
      decode.push_back(row);
    }
  }
  out["decode"] = decode;

  // Prefill.
  json prefill = json::array();
  for (const int P : o.prefill) {
    Context ctx(model, params(o, 1, P + 8, P, false));
    const SeqId s = ctx.create_sequence();
    std::vector<double> times;
    for (int r = 0; r < std::max(2, o.runs / 2) + 1; ++r) {
      ctx.reset_sequence(s);
      t0 = Clock::now();
      fill(ctx, std::span(&s, 1), P);
      if (r > 0) times.push_back(seconds_since(t0));
    }
    const double t = median(times);
    prefill.push_back({{"tokens", P}, {"seconds", t}, {"tok_s", P / t}});
    fmt::print("  prefill {:>5} tokens   {:.1f} ms, {:.0f} tok/s\n", P, t * 1e3, P / t);
  }
  out["prefill"] = prefill;

  // MTP verification (k = 3): a 4-token step with rollback recorded, then rolled back to 1 token,
  // against a plain decode step.
  {
    Context ctx(model, params(o, 1, o.context + 64, 512, true, 4));
    const SeqId s = ctx.create_sequence();
    fill(ctx, std::span(&s, 1), o.context - 1);
    const int V = c.vocab_size;
    std::vector<double> verify, plain;
    Batch b;
    for (int r = 0; r < o.runs * 4 + 1; ++r) {
      std::vector<Token> four = {token_at(0, r, V), token_at(1, r, V), token_at(2, r, V), token_at(3, r, V)};
      b.clear();
      b.add(s, four, LogitsFor::all);
      t0 = Clock::now();
      ctx.step(b);
      const double tv = seconds_since(t0);
      ctx.rollback(s, 1);
      b.clear();
      b.add(s, token_at(4, r, V));
      t0 = Clock::now();
      ctx.step(b);
      const double tp = seconds_since(t0);
      if (r > 0) {
        verify.push_back(tv);
        plain.push_back(tp);
      }
    }
    const double v = median(verify), p = median(plain);
    out["mtp_verify"] = {{"k", 3}, {"verify_seconds", v}, {"plain_seconds", p}, {"ratio", v / p}};
    fmt::print("  MTP verify k=3         {:.3f} ms vs a plain step {:.3f} ms ({:.2f}x)\n", v * 1e3, p * 1e3, v / p);
  }
  if (!o.json_out.empty()) {
    std::ofstream(o.json_out) << out.dump(2) << "\n";
    fmt::print("  wrote {}\n", o.json_out);
  }
  return 0;
}

}  // namespace gdn::cli
