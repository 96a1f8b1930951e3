// gdn_cuda_bench: the decode step and GDN prefill of Qwen3.5/3.6-shaped models with random bf16
// weights, timed on the device against the HBM roofline (bytes moved ÷ measured copy bandwidth).
//
//   gdn_cuda_bench [--shapes 0.8b,27b] [--batches 1,8,32] [--context 4096] [--prefill 4096]
//                  [--iters 20] [--out DIR]
//   gdn_cuda_bench --tiny      one small shape, two steps, no timing: checks the wiring
//
// The decode step is the whole model for B sequences of one token each at position context−1:
// embedding → per layer (input norm → fused input projection → conv update + fused recurrent GDN
// + gated norm | q/k norm + rope + KV append + split-K paged attention) → output projection with
// the residual add in the GEMM epilogue → post norm → gate/up GEMM → SwiGLU → down GEMM + residual
// → final norm → lm_head (float32 logits) → argmax, which feeds the next step's embedding. It is
// captured once in a CUDA graph and replayed. Bytes counted per step: every weight once (the
// embedding's B rows), the GDN and conv states read and written, the KV cache read, the logits
// written and read. Component timings (projections alone, GDN alone, attention alone) are taken
// by running each part's kernels for all layers outside the graph.
//
// Built twice: against the GPU, and (GDN_CUDA_EMULATE) against the CPU emulator with a naive GEMM,
// where only --tiny is meant to be run (ctest: gdn_cuda_bench_emulated).

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "kernels.hpp"
#if !defined(GDN_CUDA_EMULATE)
#include "gemm.hpp"
#endif

namespace {

namespace gc = gdn::cuda;
using bf16 = __nv_bfloat16;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gdn_cuda_bench: %s\n", what.c_str());
  std::exit(1);
}
void check(cudaError_t e, const char* what) {
#if defined(GDN_CUDA_EMULATE)
  if (e != cudaSuccess) die(std::string(what) + ": error " + std::to_string(static_cast<int>(e)));
#else
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
#endif
}

// ---- platform: the GPU, or the emulator ---------------------------------------------------------
#if defined(GDN_CUDA_EMULATE)
void* dev_alloc(std::size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) die("out of memory");
  std::memset(p, 0, bytes);
  return p;
}
void dev_free(void* p) { std::free(p); }
void dev_upload(void* d, const void* h, std::size_t bytes) { std::memcpy(d, h, bytes); }
void dev_download(void* h, const void* d, std::size_t bytes) { std::memcpy(h, d, bytes); }
void dev_sync() {}
void dev_zero(void* p, std::size_t bytes, cudaStream_t) { std::memset(p, 0, bytes); }
struct Gemm {
  int init() { return 0; }
  // y[r][o] = Σ_i x[r][i]·w[o][i] (+ y when beta = 1); bf16 or float32 out.
  int run(const bf16* x, std::int64_t ldx, const bf16* w, std::int64_t ldw, void* y, std::int64_t ldy, bool f32, int rows,
          int in, int out, float beta, cudaStream_t) {
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) {
        float acc = 0.0f;
        for (int i = 0; i < in; ++i) acc += __bfloat162float(x[r * ldx + i]) * __bfloat162float(w[o * ldw + i]);
        if (f32) {
          float* yy = static_cast<float*>(y) + r * ldy + o;
          *yy = acc + beta * *yy;
        } else {
          bf16* yy = static_cast<bf16*>(y) + r * ldy + o;
          *yy = __float2bfloat16(acc + beta * __bfloat162float(*yy));
        }
      }
    return 0;
  }
};
#else
void* dev_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 16 : bytes), "cudaMalloc");
  return p;
}
void dev_free(void* p) { cudaFree(p); }
void dev_upload(void* d, const void* h, std::size_t bytes) { check(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "upload"); }
void dev_download(void* h, const void* d, std::size_t bytes) {
  check(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "download");
}
void dev_sync() { check(cudaDeviceSynchronize(), "synchronize"); }
void dev_zero(void* p, std::size_t bytes, cudaStream_t s) { check(cudaMemsetAsync(p, 0, bytes, s), "memset"); }
struct Gemm {
  gc::Gemm g;
  int init() { return g.init(); }
  int run(const bf16* x, std::int64_t ldx, const bf16* w, std::int64_t ldw, void* y, std::int64_t ldy, bool f32, int rows,
          int in, int out, float beta, cudaStream_t s) {
    gc::GemmArgs a;
    a.x = x;
    a.ldx = ldx;
    a.w = w;
    a.ldw = ldw;
    a.y = y;
    a.ldy = ldy;
    a.out_type = f32 ? gc::GemmOut::float32 : gc::GemmOut::bfloat16;
    a.rows = rows;
    a.in = in;
    a.out = out;
    a.beta = beta;
    return g.run(a, s);
  }
};
#endif

// A bump allocator over one device allocation: every tensor of a model in one place.
class Arena {
 public:
  explicit Arena(std::size_t bytes) : base_(static_cast<char*>(dev_alloc(bytes))), size_(bytes) {}
  ~Arena() { dev_free(base_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  template <typename T>
  T* take(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + 255) / 256 * 256;
    if (used_ + bytes > size_) die("arena too small");
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += bytes;
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  char* base_;
  std::size_t size_, used_ = 0;
};

struct Shape {
  const char* name;
  int layers, hidden, Hq, Hkv, hd, ffn, Hk, Hv, dk, dv, vocab;
  bool tied;
  int full_every = 4;  // every 4th layer is full attention (3 GDN : 1 attention)
  bool is_gdn(int l) const { return (l + 1) % full_every != 0; }
  int gdn_layers() const { return layers - layers / full_every; }
  int attn_layers() const { return layers / full_every; }
  std::int64_t C() const { return 2LL * Hk * dk + static_cast<std::int64_t>(Hv) * dv; }
  std::int64_t Vd() const { return static_cast<std::int64_t>(Hv) * dv; }
  std::int64_t gdn_proj() const { return C() + Vd() + 2LL * Hv; }
  std::int64_t attn_proj() const { return 2LL * Hq * hd + 2LL * Hkv * hd; }
  std::int64_t weight_elems() const {
    std::int64_t n = static_cast<std::int64_t>(vocab) * hidden * (tied ? 1 : 2);
    for (int l = 0; l < layers; ++l) {
      n += 3LL * ffn * hidden;
      n += is_gdn(l) ? gdn_proj() * hidden + Vd() * hidden + C() * 4 : attn_proj() * hidden + 1LL * Hq * hd * hidden;
    }
    return n;
  }
};

// Published configs (shared/spec/qwen3_5-text-model.md); rotary dim = head_dim/4.
const Shape kShape08b{"0.8B", 24, 1024, 8, 2, 256, 3584, 16, 16, 128, 128, 248320, true};
const Shape kShape27b{"27B", 64, 5120, 24, 4, 256, 17408, 16, 48, 128, 128, 248320, false};
const Shape kShapeTiny{"tiny", 4, 64, 4, 2, 32, 128, 2, 4, 16, 32, 256, false};

struct Timer {
#if defined(GDN_CUDA_EMULATE)
  std::chrono::steady_clock::time_point t0;
  void start(cudaStream_t) { t0 = std::chrono::steady_clock::now(); }
  double stop_ms(cudaStream_t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
#else
  cudaEvent_t a = nullptr, b = nullptr;
  Timer() {
    check(cudaEventCreate(&a), "event");
    check(cudaEventCreate(&b), "event");
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  void start(cudaStream_t s) { check(cudaEventRecord(a, s), "event record"); }
  double stop_ms(cudaStream_t s) {
    check(cudaEventRecord(b, s), "event record");
    check(cudaEventSynchronize(b), "event sync");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    return ms;
  }
#endif
};

// Mean time of `iters` runs of f after `warm` untimed ones.
double time_ms(cudaStream_t s, int warm, int iters, const std::function<void()>& f) {
  for (int i = 0; i < warm; ++i) f();
  Timer t;
  t.start(s);
  for (int i = 0; i < iters; ++i) f();
  return t.stop_ms(s) / iters;
}

// The same for the kernels f enqueues, captured once in a CUDA graph and replayed, so that launch
// overhead does not count (as in a captured decode step). f must have run once before (cuBLASLt
// plans its algorithms on first use).
double graph_time_ms(cudaStream_t s, int iters, const std::function<void()>& f) {
#if defined(GDN_CUDA_EMULATE)
  (void)iters;
  return time_ms(s, 0, 1, f);
#else
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  f();
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const double ms = time_ms(s, 3, iters, [&] { check(cudaGraphLaunch(exec, s), "graph launch"); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms;
#endif
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  while (b <= s.size()) {
    const std::size_t e = s.find(',', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

struct Report {
  std::vector<std::string> json, md;
  void row(const std::string& j, const std::string& m) {
    json.push_back(j);
    md.push_back(m);
    std::printf("%s\n", m.c_str());
    std::fflush(stdout);
  }
};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---- the model ---------------------------------------------------------------------------------
struct Layer {
  float *in_norm = nullptr, *post_norm = nullptr;
  bf16 *w_in = nullptr, *w_out = nullptr, *w_gu = nullptr, *w_down = nullptr, *conv_w = nullptr;
  float *neg_exp_A = nullptr, *dt_bias = nullptr, *gnorm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  int index = 0;  // among the GDN layers, or among the attention layers
};

struct Model {
  Shape sh;
  Arena weights;
  std::vector<Layer> layers;
  bf16 *embed = nullptr, *lm_head = nullptr;
  float* final_norm = nullptr;
  float* inv_freq = nullptr;
  Model(const Shape& s, cudaStream_t stream)
      : sh(s), weights(static_cast<std::size_t>(s.weight_elems()) * 2 + (64u << 20) + static_cast<std::size_t>(s.layers) * (1u << 20)) {
    std::uint64_t seed = 1;
    const auto mat = [&](std::int64_t n) {
      bf16* p = weights.take<bf16>(static_cast<std::size_t>(n));
      check(gc::fill_random_bf16(p, n, seed++, 0.02f, stream), "fill_random_bf16");
      return p;
    };
    const auto vec = [&](std::size_t n, float base, float jitter) {
      std::vector<float> h(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = base + jitter * std::sin(static_cast<float>(i + seed));
      ++seed;
      float* p = weights.take<float>(n);
      dev_upload(p, h.data(), n * sizeof(float));
      return p;
    };
    const std::size_t H = static_cast<std::size_t>(s.hidden);
    embed = mat(static_cast<std::int64_t>(s.vocab) * s.hidden);
    lm_head = s.tied ? embed : mat(static_cast<std::int64_t>(s.vocab) * s.hidden);
    final_norm = vec(H, 0.0f, 0.05f);
    std::vector<float> f(static_cast<std::size_t>(s.hd / 8));
    for (std::size_t i = 0; i < f.size(); ++i)
      f[i] = static_cast<float>(1.0 / std::pow(1e7, static_cast<double>(2 * i) / (s.hd / 4)));
    inv_freq = weights.take<float>(f.size());
    dev_upload(inv_freq, f.data(), f.size() * sizeof(float));
    int gi = 0, ai = 0;
    for (int l = 0; l < s.layers; ++l) {
      Layer L;
      L.in_norm = vec(H, 0.0f, 0.05f);
      L.post_norm = vec(H, 0.0f, 0.05f);
      if (s.is_gdn(l)) {
        L.index = gi++;
        L.w_in = mat(s.gdn_proj() * s.hidden);
        L.w_out = mat(s.Vd() * s.hidden);
        L.conv_w = mat(s.C() * 4);
        L.neg_exp_A = vec(static_cast<std::size_t>(s.Hv), -1.0f, 0.5f);
        L.dt_bias = vec(static_cast<std::size_t>(s.Hv), 0.0f, 1.0f);
        L.gnorm = vec(static_cast<std::size_t>(s.dv), 1.0f, 0.05f);
      } else {
        L.index = ai++;
        L.w_in = mat(s.attn_proj() * s.hidden);
        L.w_out = mat(static_cast<std::int64_t>(s.Hq) * s.hd * s.hidden);
        L.q_norm = vec(static_cast<std::size_t>(s.hd), 1.0f, 0.05f);
        L.k_norm = vec(static_cast<std::size_t>(s.hd), 1.0f, 0.05f);
      }
      L.w_gu = mat(2LL * s.ffn * s.hidden);
      L.w_down = mat(static_cast<std::int64_t>(s.ffn) * s.hidden);
      layers.push_back(L);
    }
  }
};

// Per-batch state and activations of the decode step.
struct Decode {
  const Model& m;
  int B, ctx, page_size = 64, splits = 1, split_len = 256;
  Arena mem;
  bf16 *h, *xn, *proj, *conv_out, *core, *q, *gu, *act, *conv_state, *kv;
  float *gdn_state, *logits, *attn_ws;
  std::int32_t *tokens, *slots, *cu, *kv_lens, *page_indptr, *page_indices;
  std::int64_t conv_slot, gdn_slot, page_elems;

  static std::size_t bytes_needed(const Shape& s, int B, int ctx) {
    const std::size_t b = static_cast<std::size_t>(B);
    const std::size_t pages = b * static_cast<std::size_t>((ctx + 63) / 64);
    std::size_t n = 0;
    n += b * static_cast<std::size_t>(s.gdn_layers()) * 3 * static_cast<std::size_t>(s.C()) * 2;
    n += b * static_cast<std::size_t>(s.gdn_layers()) * static_cast<std::size_t>(s.Hv) * s.dk * s.dv * 4;
    n += pages * static_cast<std::size_t>(s.attn_layers()) * 2 * s.Hkv * 64 * s.hd * 2;
    n += b * static_cast<std::size_t>(s.vocab) * 4;
    n += b * 2 * (static_cast<std::size_t>(s.hidden) * 2 + static_cast<std::size_t>(std::max(s.gdn_proj(), s.attn_proj())) +
                  static_cast<std::size_t>(s.C()) + static_cast<std::size_t>(std::max<std::int64_t>(s.Vd(), 1LL * s.Hq * s.hd)) * 2 +
                  3 * static_cast<std::size_t>(s.ffn));
    n += b * static_cast<std::size_t>(s.Hq) * 64 * (s.hd + 1) * 4;  // attention partials
    return n + (64u << 20);
  }

  Decode(const Model& model, int batch, int context, int sms, cudaStream_t stream)
      : m(model), B(batch), ctx(context), mem(bytes_needed(model.sh, batch, context)) {
    const Shape& s = m.sh;
    const std::size_t b = static_cast<std::size_t>(B);
    h = mem.take<bf16>(b * s.hidden);
    xn = mem.take<bf16>(b * s.hidden);
    proj = mem.take<bf16>(b * static_cast<std::size_t>(std::max(s.gdn_proj(), s.attn_proj())));
    conv_out = mem.take<bf16>(b * static_cast<std::size_t>(s.C()));
    core = mem.take<bf16>(b * static_cast<std::size_t>(std::max<std::int64_t>(s.Vd(), 1LL * s.Hq * s.hd)));
    q = mem.take<bf16>(b * static_cast<std::size_t>(s.Hq) * s.hd);
    gu = mem.take<bf16>(b * 2 * static_cast<std::size_t>(s.ffn));
    act = mem.take<bf16>(b * static_cast<std::size_t>(s.ffn));
    conv_slot = static_cast<std::int64_t>(s.gdn_layers()) * 3 * s.C();
    gdn_slot = static_cast<std::int64_t>(s.gdn_layers()) * s.Hv * s.dk * s.dv;
    conv_state = mem.take<bf16>(b * static_cast<std::size_t>(conv_slot));
    gdn_state = mem.take<float>(b * static_cast<std::size_t>(gdn_slot));
    const int pages_per_seq = (ctx + page_size - 1) / page_size;
    page_elems = static_cast<std::int64_t>(s.attn_layers()) * 2 * s.Hkv * page_size * s.hd;
    kv = mem.take<bf16>(b * static_cast<std::size_t>(pages_per_seq) * static_cast<std::size_t>(page_elems));
    logits = mem.take<float>(b * static_cast<std::size_t>(s.vocab));
    (void)sms;
    split_len = gc::attention_decode_split_len(ctx);
    splits = gc::attention_decode_splits(ctx, split_len);
    attn_ws = mem.take<float>(gc::attention_decode_workspace_bytes(B, s.Hq, s.hd, splits) / sizeof(float) + 1);
    tokens = mem.take<std::int32_t>(b);
    slots = mem.take<std::int32_t>(b);
    cu = mem.take<std::int32_t>(b + 1);
    kv_lens = mem.take<std::int32_t>(b);
    page_indptr = mem.take<std::int32_t>(b + 1);
    page_indices = mem.take<std::int32_t>(b * static_cast<std::size_t>(pages_per_seq));
    std::vector<std::int32_t> hs(b), hc(b + 1), hk(b, ctx), hp(b + 1), hi(b * static_cast<std::size_t>(pages_per_seq)), ht(b);
    for (int i = 0; i < B; ++i) {
      hs[static_cast<std::size_t>(i)] = i;
      ht[static_cast<std::size_t>(i)] = (i * 7919) % s.vocab;
    }
    for (int i = 0; i <= B; ++i) {
      hc[static_cast<std::size_t>(i)] = i;
      hp[static_cast<std::size_t>(i)] = i * pages_per_seq;
    }
    for (std::size_t i = 0; i < hi.size(); ++i) hi[i] = static_cast<std::int32_t>(i);
    dev_upload(slots, hs.data(), b * 4);
    dev_upload(cu, hc.data(), (b + 1) * 4);
    dev_upload(kv_lens, hk.data(), b * 4);
    dev_upload(page_indptr, hp.data(), (b + 1) * 4);
    dev_upload(page_indices, hi.data(), hi.size() * 4);
    dev_upload(tokens, ht.data(), b * 4);
    // Random history: a cache full of plausible keys and values, small random states.
    check(gc::fill_random_bf16(kv, static_cast<std::int64_t>(b) * pages_per_seq * page_elems, 7, 1.0f, stream), "fill kv");
    check(gc::fill_random_bf16(conv_state, static_cast<std::int64_t>(b) * conv_slot, 8, 1.0f, stream), "fill conv");
    dev_zero(gdn_state, b * static_cast<std::size_t>(gdn_slot) * 4, stream);  // a fresh state: the timing does not depend on it
  }

  gc::PagedKv paged(int attn_index) const {
    const Shape& s = m.sh;
    gc::PagedKv p;
    p.data = kv + static_cast<std::int64_t>(attn_index) * 2 * s.Hkv * page_size * s.hd;
    p.page_stride = page_elems;
    p.kv_stride = static_cast<std::int64_t>(s.Hkv) * page_size * s.hd;
    p.head_stride = static_cast<std::int64_t>(page_size) * s.hd;
    p.row_stride = s.hd;
    p.page_size = page_size;
    p.page_indptr = page_indptr;
    p.page_indices = page_indices;
    p.kv_lens = kv_lens;
    return p;
  }

  void gemm(Gemm& g, const bf16* x, std::int64_t ldx, const bf16* w, void* y, std::int64_t ldy, bool f32, int in, int out,
            float beta, cudaStream_t s) const {
    const int e = g.run(x, ldx, w, in, y, ldy, f32, B, in, out, beta, s);
    if (e != 0) die(fmt("GEMM %d×%d×%d failed: cuBLAS status %d", B, in, out, e));
  }

  void conv_and_gdn(const Layer& L, cudaStream_t s) const {
    const Shape& sh = m.sh;
    const std::int64_t P = sh.gdn_proj(), C = sh.C();
    gc::Conv1dParams c;
    c.x = proj;
    c.ld_x = P;
    c.weight = L.conv_w;
    c.out = conv_out;
    c.ld_out = C;
    c.state = conv_state + static_cast<std::int64_t>(L.index) * 3 * C;
    c.state_slot_stride = conv_slot;
    c.slots = slots;
    c.cu_seqlens = cu;
    c.num_seqs = B;
    c.channels = static_cast<int>(C);
    check(gc::causal_conv1d_update(c, 1, s), "causal_conv1d_update");
    check(gc::gdn_recurrent(gdn_params(L), 1, s), "gdn_recurrent");
  }

  gc::GdnParams gdn_params(const Layer& L) const {
    const Shape& sh = m.sh;
    const std::int64_t P = sh.gdn_proj(), C = sh.C(), Kd = static_cast<std::int64_t>(sh.Hk) * sh.dk;
    gc::GdnParams g;
    g.q = conv_out;
    g.k = conv_out + Kd;
    g.v = conv_out + 2 * Kd;
    g.ld_q = g.ld_k = g.ld_v = C;
    g.b = proj + C + sh.Vd();
    g.a = proj + C + sh.Vd() + sh.Hv;
    g.ld_a = g.ld_b = P;
    g.neg_exp_A = L.neg_exp_A;
    g.dt_bias = L.dt_bias;
    g.state = gdn_state + static_cast<std::int64_t>(L.index) * sh.Hv * sh.dk * sh.dv;
    g.state_slot_stride = gdn_slot;
    g.slots = slots;
    g.cu_seqlens = cu;
    g.num_seqs = B;
    g.out = core;
    g.ld_out = sh.Vd();
    g.num_k_heads = sh.Hk;
    g.num_v_heads = sh.Hv;
    g.dk = sh.dk;
    g.dv = sh.dv;
    return g;
  }

  void attention(const Layer& L, cudaStream_t s) const {
    const Shape& sh = m.sh;
    const std::int64_t P = sh.attn_proj(), hd = sh.hd;
    gc::AttnPrepareParams pp;
    pp.q_gate = proj;
    pp.ld_q = P;
    pp.k = proj + 2LL * sh.Hq * hd;
    pp.v = pp.k + sh.Hkv * hd;
    pp.ld_k = pp.ld_v = P;
    pp.q_norm_scale = L.q_norm;
    pp.k_norm_scale = L.k_norm;
    pp.inv_freq = m.inv_freq;
    pp.rotary_dim = sh.hd / 4;
    pp.q_out = q;
    pp.ld_q_out = sh.Hq * hd;
    pp.kv = paged(L.index);
    pp.cu_seqlens = cu;
    pp.num_seqs = B;
    pp.rows = B;
    pp.num_q_heads = sh.Hq;
    pp.num_kv_heads = sh.Hkv;
    pp.head_dim = sh.hd;
    check(gc::attention_prepare(pp, s), "attention_prepare");
    check(gc::attention_decode(attn_params(L), splits, split_len, attn_ws, s), "attention_decode");
  }

  gc::AttnParams attn_params(const Layer& L) const {
    const Shape& sh = m.sh;
    gc::AttnParams a;
    a.q = q;
    a.ld_q = static_cast<std::int64_t>(sh.Hq) * sh.hd;
    a.gate = proj + sh.hd;
    a.ld_gate = sh.attn_proj();
    a.gate_head_stride = 2LL * sh.hd;
    a.out = core;
    a.ld_out = static_cast<std::int64_t>(sh.Hq) * sh.hd;
    a.kv = paged(L.index);
    a.cu_seqlens = cu;
    a.num_seqs = B;
    a.rows = B;
    a.num_q_heads = sh.Hq;
    a.num_kv_heads = sh.Hkv;
    a.head_dim = sh.hd;
    a.scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    return a;
  }

  void step(Gemm& g, cudaStream_t s) const {
    const Shape& sh = m.sh;
    const int H = sh.hidden;
    const float eps = 1e-6f;
    check(gc::embedding_gather(m.embed, H, tokens, h, H, B, H, s), "embedding_gather");
    for (const Layer& L : m.layers) {
      check(gc::rmsnorm(h, H, nullptr, 0, L.in_norm, 1.0f, xn, H, B, H, eps, s), "rmsnorm");
      if (L.gnorm != nullptr) {
        const std::int64_t P = sh.gdn_proj();
        gemm(g, xn, H, L.w_in, proj, P, false, H, static_cast<int>(P), 0.0f, s);
        conv_and_gdn(L, s);
        check(gc::rmsnorm_gated(core, sh.Vd(), proj + sh.C(), P, L.gnorm, core, sh.Vd(), B, sh.Hv, sh.dv, eps, s),
              "rmsnorm_gated");
        gemm(g, core, sh.Vd(), L.w_out, h, H, false, static_cast<int>(sh.Vd()), H, 1.0f, s);
      } else {
        const std::int64_t P = sh.attn_proj();
        gemm(g, xn, H, L.w_in, proj, P, false, H, static_cast<int>(P), 0.0f, s);
        attention(L, s);
        gemm(g, core, 1LL * sh.Hq * sh.hd, L.w_out, h, H, false, sh.Hq * sh.hd, H, 1.0f, s);
      }
      check(gc::rmsnorm(h, H, nullptr, 0, L.post_norm, 1.0f, xn, H, B, H, eps, s), "rmsnorm");
      gemm(g, xn, H, L.w_gu, gu, 2LL * sh.ffn, false, H, 2 * sh.ffn, 0.0f, s);
      check(gc::swiglu(gu, 2LL * sh.ffn, sh.ffn, act, sh.ffn, B, sh.ffn, s), "swiglu");
      gemm(g, act, sh.ffn, L.w_down, h, H, false, sh.ffn, H, 1.0f, s);
    }
    check(gc::rmsnorm(h, H, nullptr, 0, m.final_norm, 1.0f, xn, H, B, H, eps, s), "rmsnorm");
    gemm(g, xn, H, m.lm_head, logits, sh.vocab, true, H, sh.vocab, 0.0f, s);
    check(gc::argmax(logits, sh.vocab, B, sh.vocab, tokens, s), "argmax");
  }

  // Bytes one step must move at least, besides the weights.
  double state_bytes() const { return 2.0 * B * (static_cast<double>(gdn_slot) * 4 + static_cast<double>(conv_slot) * 2); }
  double kv_bytes() const {
    const Shape& s = m.sh;
    return static_cast<double>(B) * s.attn_layers() * ctx * s.Hkv * s.hd * 2.0 * 2.0;
  }
  double logit_bytes() const { return 2.0 * B * m.sh.vocab * 4.0; }
};

double measured_copy_bandwidth(cudaStream_t s, int iters) {
#if defined(GDN_CUDA_EMULATE)
  (void)s;
  (void)iters;
  return 1e9;
#else
  const std::size_t bytes = std::size_t{2} << 30;
  void* a = dev_alloc(bytes);
  void* b = dev_alloc(bytes);
  check(cudaMemsetAsync(a, 1, bytes, s), "memset");
  const double ms = time_ms(s, 2, iters, [&] { check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy"); });
  dev_free(a);
  dev_free(b);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);  // read + write
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes = "0.8b,27b", batches = "1,8,32", out_dir;
  int context = 4096, prefill = 4096, iters = 20;
  bool tiny = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--shapes") shapes = next();
    else if (a == "--batches") batches = next();
    else if (a == "--context") context = std::atoi(next().c_str());
    else if (a == "--prefill") prefill = std::atoi(next().c_str());
    else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--out") out_dir = next();
    else if (a == "--tiny") tiny = true;
    else die("unknown argument " + a + " (see the comment at the top of cuda/bench.cpp)");
  }
  cudaStream_t stream = nullptr;
  int sms = 132;
#if !defined(GDN_CUDA_EMULATE)
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, %.1f GiB\n", prop.name, sms, static_cast<double>(prop.totalGlobalMem) / (1u << 30));
#endif
  Report rep;
  Gemm gemm;
  if (gemm.init() != 0) die("cuBLASLt init failed");

  if (tiny) {
    // Wiring check: two decode steps and a chunked prefill at a tiny shape; outputs must be finite.
    Model m(kShapeTiny, stream);
    Decode d(m, 3, 70, sms, stream);
    d.step(gemm, stream);
    d.step(gemm, stream);
    dev_sync();
    std::vector<float> logits(static_cast<std::size_t>(3) * m.sh.vocab);
    dev_download(logits.data(), d.logits, logits.size() * 4);
    for (const float x : logits)
      if (!std::isfinite(x)) die("tiny decode step produced a non-finite logit");
    std::printf("tiny decode: 2 steps of 3 sequences, logits finite\n");
    return 0;
  }

  const double bw = measured_copy_bandwidth(stream, 10);
  rep.row(fmt("{\"kind\":\"copy_bandwidth\",\"bytes_per_s\":%.6g}", bw),
          fmt("| copy bandwidth (cudaMemcpy D2D, 2 GiB, read + write) | | | | %.0f GB/s |", bw / 1e9));

  for (const std::string& name : split(shapes)) {
    const Shape& sh = name == "27b" ? kShape27b : name == "0.8b" ? kShape08b : name == "tiny" ? kShapeTiny : (die("unknown shape " + name), kShapeTiny);
    std::printf("== shape %s: %.2f G weights\n", sh.name, static_cast<double>(sh.weight_elems()) / 1e9);
    Model m(sh, stream);
    dev_sync();
    for (const std::string& bs : split(batches)) {
      const int B = std::atoi(bs.c_str());
      if (B < 1) continue;
      Decode d(m, B, context, sms, stream);
      d.step(gemm, stream);  // plans cuBLASLt's algorithms before capture
      dev_sync();
      const double step_ms = graph_time_ms(stream, iters, [&] { d.step(gemm, stream); });
      // Weights once; the embedding table is read for B rows only (when tied, it is read whole as lm_head).
      const double wb = static_cast<double>(sh.weight_elems()) * 2.0 -
                        (sh.tied ? 0.0 : static_cast<double>(sh.vocab) * sh.hidden * 2.0) + static_cast<double>(B) * sh.hidden * 2.0;
      const double bytes = wb + d.state_bytes() + d.kv_bytes() + d.logit_bytes();
      const double roof_ms = bytes / bw * 1e3;
      rep.row(fmt("{\"kind\":\"decode_step\",\"shape\":\"%s\",\"batch\":%d,\"context\":%d,\"ms\":%.4f,\"bytes\":%.6g,"
                  "\"roofline_ms\":%.4f,\"fraction\":%.4f,\"splits\":%d}",
                  sh.name, B, context, step_ms, bytes, roof_ms, roof_ms / step_ms, d.splits),
              fmt("| %s decode step, batch %d, context %d (CUDA graph) | %.3f ms | roofline %.3f ms | %.1f%% | %.0f tok/s |",
                  sh.name, B, context, step_ms, roof_ms, 100.0 * roof_ms / step_ms, B / step_ms * 1e3));
      // Components, all layers each, outside the graph.
      const double gemm_ms = graph_time_ms(stream, std::max(1, iters / 2), [&] {
        for (const Layer& L : m.layers) {
          const bool gdn = L.gnorm != nullptr;
          const std::int64_t P = gdn ? sh.gdn_proj() : sh.attn_proj();
          const int inner = gdn ? static_cast<int>(sh.Vd()) : sh.Hq * sh.hd;
          d.gemm(gemm, d.xn, sh.hidden, L.w_in, d.proj, P, false, sh.hidden, static_cast<int>(P), 0.0f, stream);
          d.gemm(gemm, d.core, inner, L.w_out, d.h, sh.hidden, false, inner, sh.hidden, 1.0f, stream);
          d.gemm(gemm, d.xn, sh.hidden, L.w_gu, d.gu, 2LL * sh.ffn, false, sh.hidden, 2 * sh.ffn, 0.0f, stream);
          d.gemm(gemm, d.act, sh.ffn, L.w_down, d.h, sh.hidden, false, sh.ffn, sh.hidden, 1.0f, stream);
        }
        d.gemm(gemm, d.xn, sh.hidden, m.lm_head, d.logits, sh.vocab, true, sh.hidden, sh.vocab, 0.0f, stream);
      });
      const double gemm_bytes = static_cast<double>(sh.weight_elems() - 1LL * sh.vocab * sh.hidden * (sh.tied ? 0 : 1)) * 2.0 -
                                static_cast<double>(sh.gdn_layers()) * sh.C() * 4 * 2.0;
      rep.row(fmt("{\"kind\":\"decode_gemms\",\"shape\":\"%s\",\"batch\":%d,\"ms\":%.4f,\"bytes\":%.6g,\"roofline_ms\":%.4f}",
                  sh.name, B, gemm_ms, gemm_bytes, gemm_bytes / bw * 1e3),
              fmt("| %s projections + lm_head, batch %d | %.3f ms | roofline %.3f ms | %.1f%% | |", sh.name, B, gemm_ms,
                  gemm_bytes / bw * 1e3, 100.0 * gemm_bytes / bw * 1e3 / gemm_ms));
      const double gdn_ms = graph_time_ms(stream, iters, [&] {
        for (const Layer& L : m.layers)
          if (L.gnorm != nullptr) check(gc::gdn_recurrent(d.gdn_params(L), 1, stream), "gdn_recurrent");
      });
      const double gdn_bytes = 2.0 * B * static_cast<double>(d.gdn_slot) * 4;
      rep.row(fmt("{\"kind\":\"decode_gdn\",\"shape\":\"%s\",\"batch\":%d,\"ms\":%.4f,\"bytes\":%.6g,\"roofline_ms\":%.4f}",
                  sh.name, B, gdn_ms, gdn_bytes, gdn_bytes / bw * 1e3),
              fmt("| %s fused recurrent GDN (%d layers), batch %d | %.3f ms | roofline %.3f ms | %.1f%% | |", sh.name,
                  sh.gdn_layers(), B, gdn_ms, gdn_bytes / bw * 1e3, 100.0 * gdn_bytes / bw * 1e3 / gdn_ms));
      const double attn_ms = graph_time_ms(stream, iters, [&] {
        for (const Layer& L : m.layers)
          if (L.gnorm == nullptr) check(gc::attention_decode(d.attn_params(L), d.splits, d.split_len, d.attn_ws, stream), "attention_decode");
      });
      rep.row(fmt("{\"kind\":\"decode_attention\",\"shape\":\"%s\",\"batch\":%d,\"context\":%d,\"ms\":%.4f,\"bytes\":%.6g,"
                  "\"roofline_ms\":%.4f,\"splits\":%d}",
                  sh.name, B, context, attn_ms, d.kv_bytes(), d.kv_bytes() / bw * 1e3, d.splits),
              fmt("| %s paged attention decode (%d layers, %d splits), batch %d, context %d | %.3f ms | roofline %.3f ms | %.1f%% | |",
                  sh.name, sh.attn_layers(), d.splits, B, context, attn_ms, d.kv_bytes() / bw * 1e3,
                  100.0 * d.kv_bytes() / bw * 1e3 / attn_ms));
    }

    // GDN prefill: one layer's core (gates, norms, chunked delta rule) over `prefill` tokens, as
    // one sequence and as four; the recurrent kernel on the same input for comparison.
    for (const int nseq : {1, 4}) {
      const int per = prefill / nseq, T = per * nseq;
      if (per < 1) continue;
      const std::int64_t C = sh.C();
      Arena mem(static_cast<std::size_t>(T) * (C + sh.gdn_proj() + sh.Vd()) * 2 +
                static_cast<std::size_t>(nseq) * sh.Hv * sh.dk * sh.dv * 4 + gc::gdn_chunked_workspace_bytes(T, sh.Hv) +
                (16u << 20));
      bf16* x = mem.take<bf16>(static_cast<std::size_t>(T) * C);
      bf16* ab = mem.take<bf16>(static_cast<std::size_t>(T) * 2 * sh.Hv);
      bf16* o = mem.take<bf16>(static_cast<std::size_t>(T) * sh.Vd());
      float* st = mem.take<float>(static_cast<std::size_t>(nseq) * sh.Hv * sh.dk * sh.dv);
      float* ws = mem.take<float>(gc::gdn_chunked_workspace_bytes(T, sh.Hv) / 4);
      std::int32_t* dcu = mem.take<std::int32_t>(static_cast<std::size_t>(nseq) + 1);
      std::int32_t* dsl = mem.take<std::int32_t>(static_cast<std::size_t>(nseq));
      std::vector<std::int32_t> hc(static_cast<std::size_t>(nseq) + 1), hs(static_cast<std::size_t>(nseq));
      for (int i = 0; i <= nseq; ++i) hc[static_cast<std::size_t>(i)] = i * per;
      for (int i = 0; i < nseq; ++i) hs[static_cast<std::size_t>(i)] = i;
      dev_upload(dcu, hc.data(), hc.size() * 4);
      dev_upload(dsl, hs.data(), hs.size() * 4);
      check(gc::fill_random_bf16(x, static_cast<std::int64_t>(T) * C, 11, 1.0f, stream), "fill");
      check(gc::fill_random_bf16(ab, static_cast<std::int64_t>(T) * 2 * sh.Hv, 12, 1.0f, stream), "fill");
      const Layer& L = m.layers[0];
      gc::GdnParams g;
      const std::int64_t Kd = static_cast<std::int64_t>(sh.Hk) * sh.dk;
      g.q = x;
      g.k = x + Kd;
      g.v = x + 2 * Kd;
      g.ld_q = g.ld_k = g.ld_v = C;
      g.a = ab;
      g.b = ab + sh.Hv;
      g.ld_a = g.ld_b = 2LL * sh.Hv;
      g.neg_exp_A = L.neg_exp_A;
      g.dt_bias = L.dt_bias;
      g.state = st;
      g.state_slot_stride = static_cast<std::int64_t>(sh.Hv) * sh.dk * sh.dv;
      g.slots = dsl;
      g.cu_seqlens = dcu;
      g.num_seqs = nseq;
      g.out = o;
      g.ld_out = sh.Vd();
      g.num_k_heads = sh.Hk;
      g.num_v_heads = sh.Hv;
      g.dk = sh.dk;
      g.dv = sh.dv;
      const double chunk_ms = time_ms(stream, 1, std::max(1, iters / 4), [&] { check(gc::gdn_chunked(g, per, ws, stream), "gdn_chunked"); });
      const double rec_ms = time_ms(stream, 0, 1, [&] { check(gc::gdn_recurrent(g, per, stream), "gdn_recurrent"); });
      // Useful FLOPs of the chunked form per token and value head (multiply-adds × 2):
      // K·Kᵀ, Q·Kᵀ (64·dk each), T⁻¹ (≈64²/3), K·S, Q·S (dk·dv each), T⁻¹·R, QK·Vn (≈32·dv each), Kᵀ·Vn (dk·dv).
      const double flops = 2.0 * T * sh.Hv * (2.0 * 64 * sh.dk + 64.0 * 64 / 3 + 3.0 * sh.dk * sh.dv + 64.0 * sh.dv);
      rep.row(fmt("{\"kind\":\"gdn_prefill\",\"shape\":\"%s\",\"tokens\":%d,\"sequences\":%d,\"chunked_ms\":%.4f,"
                  "\"recurrent_ms\":%.4f,\"tokens_per_s\":%.6g,\"tflops\":%.4f}",
                  sh.name, T, nseq, chunk_ms, rec_ms, T / chunk_ms * 1e3, flops / (chunk_ms * 1e-3) / 1e12),
              fmt("| %s GDN prefill, one layer, %d tokens in %d sequence(s) | chunked %.3f ms (%.0f ktok/s, %.1f TFLOP/s) | "
                  "recurrent %.3f ms | | |",
                  sh.name, T, nseq, chunk_ms, T / chunk_ms, flops / (chunk_ms * 1e-3) / 1e12, rec_ms));
    }
  }

  if (!out_dir.empty()) {
    const std::string jp = out_dir + "/bench.json", mp = out_dir + "/bench.md";
    if (FILE* f = std::fopen(jp.c_str(), "w")) {
      std::fprintf(f, "[\n");
      for (std::size_t i = 0; i < rep.json.size(); ++i) std::fprintf(f, "  %s%s\n", rep.json[i].c_str(), i + 1 < rep.json.size() ? "," : "");
      std::fprintf(f, "]\n");
      std::fclose(f);
    }
    if (FILE* f = std::fopen(mp.c_str(), "w")) {
      std::fprintf(f, "| measurement | time | roofline | of roofline | throughput |\n|---|---|---|---|---|\n");
      for (const auto& m : rep.md) std::fprintf(f, "%s\n", m.c_str());
      std::fclose(f);
    }
  }
  return 0;
}
