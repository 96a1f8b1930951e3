// CUDA kernels against the CPU reference implementations (include/gdn/layers/, gdn::Sampler).
//
// One source, three builds:
//  - test_cuda_kernels: the real kernels. Without a device every case prints "SKIPPED" and WARNs
//    (CI has nvcc but no GPU); scripts/device-check.sh runs them on one.
//  - test_cuda_emulated (GDN_CUDA_EMULATE): the same kernels compiled as C++ and run by the CPU
//    emulator of cuda/emulate.hpp, so CI checks their logic on every run. cuBLASLt and CUDA-graph
//    cases need the real runtime and are left out there.
//  - the standalone CUDA-only build of cuda/CMakeLists.txt (GDN_CUDA_STANDALONE), for a device
//    machine without libgdn's dependencies: everything but the gdn::Sampler cross-check.
//
// Inputs are random, rounded to bf16 once; the CPU reference gets the rounded values, so the
// differences measured are the kernels' own: float32 summation order, and the final bf16 rounding
// of outputs that are bf16 (relative 2^-9). Each check states its tolerance as |d| ≤ atol + rtol·|ref|.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "kernels.hpp"
#if !defined(GDN_CUDA_EMULATE)
#include "gemm.hpp"
#endif
// The CPU kernels as a plain reference (the engine's CPU backend runs the same arithmetic).
#include "backend/cpu/reference_kernels.hpp"
#if !defined(GDN_CUDA_STANDALONE)
#include "gdn/runtime/sampling.hpp"
#endif

namespace {

namespace gc = gdn::cuda;
namespace ref = gdn::cpu::reference;
using bf16 = __nv_bfloat16;
using gdn::cpu::DeltaRuleInput;
using gdn::cpu::DeltaRuleScratch;

// RoPE as the CPU backend computes it: inverse frequencies once, then angles and rotation.
struct RefRope {
  RefRope(int rotary_dim, double theta) : inv_freq(gdn::cpu::rope_inverse_frequencies(rotary_dim, theta)), half(rotary_dim / 2) {}
  void angles(std::int64_t pos, float* c, float* s) const { ref::rope_angles(inv_freq.data(), half, pos, c, s); }
  void apply(float* head, const float* c, const float* s) const { ref::rope_apply(head, c, s, half); }
  std::vector<float> inv_freq;
  int half;
};

#if defined(GDN_CUDA_EMULATE)
int device_count() { return 1; }  // the emulator is always there
const char* unavailable_reason() { return "emulated"; }
#else
int device_count() { return gc::device_count(); }
const char* unavailable_reason() { return gc::unavailable_reason(); }
#endif

bool have_device() {
  if (device_count() > 0) return true;
  static bool said = false;
  if (!said) {
    std::printf("SKIPPED: CUDA kernel tests need a GPU (%s)\n", unavailable_reason());
    said = true;
  }
  return false;
}

#define GDN_NEED_DEVICE()                                       \
  do {                                                          \
    if (!have_device()) {                                       \
      WARN("SKIPPED: no CUDA device: " << unavailable_reason()); \
      return;                                                   \
    }                                                           \
  } while (0)

// Device memory: cudaMalloc'd, or plain host memory under the emulator.
template <typename T>
class Buf {
 public:
  Buf() = default;
  explicit Buf(std::size_t n) : n_(n) {
    if (n == 0) return;
#if defined(GDN_CUDA_EMULATE)
    p_ = static_cast<T*>(std::malloc(n * sizeof(T)));
#else
    if (cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess) p_ = nullptr;
#endif
    REQUIRE(p_ != nullptr);
  }
  explicit Buf(const std::vector<T>& v) : Buf(v.size()) { upload(v); }
  ~Buf() {
#if defined(GDN_CUDA_EMULATE)
    std::free(p_);
#else
    if (p_ != nullptr) cudaFree(p_);
#endif
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& v) {
    REQUIRE(v.size() == n_);
    if (n_ == 0) return;
#if defined(GDN_CUDA_EMULATE)
    std::memcpy(p_, v.data(), n_ * sizeof(T));
#else
    REQUIRE(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
#endif
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_ == 0) return v;
#if defined(GDN_CUDA_EMULATE)
    std::memcpy(v.data(), p_, n_ * sizeof(T));
#else
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
#endif
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

float bf(bf16 x) { return __bfloat162float(x); }
bf16 tobf(float x) { return __float2bfloat16(x); }
float round_bf(float x) { return bf(tobf(x)); }

struct Rng {
  std::mt19937 gen;
  explicit Rng(unsigned seed) : gen(seed) {}
  float normal(float s = 1.0f) { return s * std::normal_distribution<float>()(gen); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
};

// n bf16-representable normal values: the float copy for the CPU, the bf16 copy for the GPU.
struct BfData {
  std::vector<float> f;
  std::vector<bf16> b;
};
BfData bf_normal(Rng& rng, std::size_t n, float scale) {
  BfData d;
  d.f.resize(n);
  d.b.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    d.b[i] = tobf(rng.normal(scale));
    d.f[i] = bf(d.b[i]);
  }
  return d;
}
std::vector<float> widen(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = bf(v[i]);
  return f;
}

// |got − ref| ≤ atol + rtol·|ref| everywhere; reports the largest absolute difference.
void check_close(const char* what, const std::vector<float>& got, const std::vector<float>& ref, float atol, float rtol) {
  REQUIRE(got.size() == ref.size());
  float worst = 0.0f, max_abs = 0.0f;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float d = std::fabs(got[i] - ref[i]);
    const float excess = d - (atol + rtol * std::fabs(ref[i]));
    if (!(excess <= worst) || std::isnan(d)) {
      worst = std::isnan(d) ? INFINITY : excess;
      at = i;
    }
    if (d > max_abs) {
      max_abs = d;
      if (std::getenv("GDN_TEST_VERBOSE")) std::printf("    max so far at %zu: got %g want %g\n", i, static_cast<double>(got[i]), static_cast<double>(ref[i]));
    }
  }
  std::printf("  %-44s max |d| = %.3g (tolerance %.1g + %.1g·|ref|)\n", what, static_cast<double>(max_abs),
              static_cast<double>(atol), static_cast<double>(rtol));
  INFO(what << ": max |d| = " << max_abs << " (atol " << atol << ", rtol " << rtol << "); worst at " << at << ": got "
            << got[at] << ", want " << ref[at]);
  CHECK(worst <= 0.0f);
}

std::vector<std::int32_t> prefix_sums(const std::vector<int>& lens) {
  std::vector<std::int32_t> cu(lens.size() + 1, 0);
  for (std::size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

cudaStream_t no_stream() { return nullptr; }

// ------------------------------------------------------------------------------------------------
// The GDN problem shared by the conv, recurrent and chunked tests.
struct GdnShape {
  int Hk, Hv, dk, dv;
};

struct GdnCase {
  GdnShape sh;
  std::vector<int> lens;
  std::vector<std::int32_t> cu, slots;
  int rows = 0, pool_slots = 0;
  // bf16 inputs: rows of conv output q | k | v (conv_dim wide), and a, b gate projections.
  BfData qkv, a, b;
  std::vector<float> neg_exp_A, dt_bias;
  std::vector<float> state;  // pool [slot][Hv][dk][dv]
  std::int64_t C() const { return 2LL * sh.Hk * sh.dk + static_cast<std::int64_t>(sh.Hv) * sh.dv; }
  std::int64_t slot_elems() const { return static_cast<std::int64_t>(sh.Hv) * sh.dk * sh.dv; }
};

GdnCase make_gdn_case(GdnShape sh, std::vector<int> lens, unsigned seed) {
  Rng rng(seed);
  GdnCase c;
  c.sh = sh;
  c.lens = lens;
  c.cu = prefix_sums(lens);
  c.rows = c.cu.back();
  const int n = static_cast<int>(lens.size());
  c.pool_slots = n + 2;
  c.slots.resize(static_cast<std::size_t>(n));
  std::vector<std::int32_t> perm(static_cast<std::size_t>(c.pool_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  for (int s = 0; s < n; ++s) c.slots[static_cast<std::size_t>(s)] = perm[static_cast<std::size_t>(s)];
  c.qkv = bf_normal(rng, static_cast<std::size_t>(c.rows * c.C()), 1.0f);
  c.a = bf_normal(rng, static_cast<std::size_t>(c.rows) * sh.Hv, 1.0f);
  c.b = bf_normal(rng, static_cast<std::size_t>(c.rows) * sh.Hv, 1.0f);
  for (int h = 0; h < sh.Hv; ++h) {
    c.neg_exp_A.push_back(-std::exp(rng.uniform(-1.0f, 1.0f)));
    c.dt_bias.push_back(rng.uniform(-1.0f, 1.0f));
  }
  c.state.resize(static_cast<std::size_t>(c.pool_slots * c.slot_elems()));
  for (auto& x : c.state) x = rng.normal(0.05f);
  return c;
}

// The CPU reference: GatedDeltaNetLayer's normalisation and gating, then the delta rule per head.
// Returns out [rows][Hv·dv]; updates c.state's copy `S`; with snaps, the state after each token.
std::vector<float> gdn_reference(const GdnCase& c, std::vector<float>& S, bool chunked,
                                 std::vector<std::vector<float>>* snaps = nullptr) {
  const auto [Hk, Hv, dk, dv] = c.sh;
  const std::int64_t C = c.C(), Kd = static_cast<std::int64_t>(Hk) * dk;
  std::vector<float> qkv = c.qkv.f;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int r = 0; r < c.rows; ++r)
    for (int h = 0; h < Hk; ++h) {
      ref::l2_normalize(qkv.data() + r * C + h * dk, dk, q_scale);
      ref::l2_normalize(qkv.data() + r * C + Kd + h * dk, dk, 1.0f);
    }
  std::vector<float> out(static_cast<std::size_t>(c.rows) * Hv * dv);
  std::vector<float> g(static_cast<std::size_t>(c.rows)), beta(static_cast<std::size_t>(c.rows));
  DeltaRuleScratch scratch;
  scratch.reserve(dk, dv);
  const int r_per = Hv / Hk;
  for (std::size_t s = 0; s < c.lens.size(); ++s) {
    const int row0 = c.cu[s], n = c.lens[s];
    for (int h = 0; h < Hv; ++h) {
      for (int t = 0; t < n; ++t) {
        const std::size_t r = static_cast<std::size_t>(row0 + t);
        g[r] = c.neg_exp_A[static_cast<std::size_t>(h)] *
               ref::softplus(c.a.f[r * Hv + h] + c.dt_bias[static_cast<std::size_t>(h)]);
        beta[r] = ref::sigmoid(c.b.f[r * Hv + h]);
      }
      const int kh = h / r_per;
      DeltaRuleInput in;
      in.q = qkv.data() + row0 * C + kh * dk;
      in.k = qkv.data() + row0 * C + Kd + kh * dk;
      in.v = qkv.data() + row0 * C + 2 * Kd + h * dv;
      in.q_stride = in.k_stride = in.v_stride = C;
      in.g = g.data() + row0;
      in.beta = beta.data() + row0;
      in.dk = dk;
      in.dv = dv;
      float* St = S.data() + c.slots[s] * c.slot_elems() + static_cast<std::int64_t>(h) * dk * dv;
      float* o = out.data() + static_cast<std::int64_t>(row0) * Hv * dv + h * dv;
      if (snaps != nullptr) {
        // Token by token so that every intermediate state can be read.
        for (int t = 0; t < n; ++t) {
          DeltaRuleInput one = in;
          one.q += t * C;
          one.k += t * C;
          one.v += t * C;
          one.g += t;
          one.beta += t;
          ref::delta_rule_recurrent(one, 1, St, o + static_cast<std::int64_t>(t) * Hv * dv, Hv * dv, scratch);
          auto& snap = (*snaps)[s * 16 + static_cast<std::size_t>(t)];
          snap.resize(static_cast<std::size_t>(c.slot_elems()));
          std::copy_n(St, dk * dv, snap.data() + static_cast<std::int64_t>(h) * dk * dv);
        }
      } else if (chunked) {
        ref::delta_rule_chunked(in, n, St, o, static_cast<std::int64_t>(Hv) * dv, scratch);
      } else {
        ref::delta_rule_recurrent(in, n, St, o, static_cast<std::int64_t>(Hv) * dv, scratch);
      }
    }
  }
  return out;
}

struct GdnDevice {
  Buf<bf16> qkv, a, b;
  Buf<float> nea, dtb, state;
  Buf<std::int32_t> slots, cu;
  Buf<bf16> out;
  gc::GdnParams p;
  explicit GdnDevice(const GdnCase& c)
      : qkv(c.qkv.b), a(c.a.b), b(c.b.b), nea(c.neg_exp_A), dtb(c.dt_bias), state(c.state), slots(c.slots), cu(c.cu),
        out(static_cast<std::size_t>(c.rows) * c.sh.Hv * c.sh.dv) {
    const std::int64_t C = c.C(), Kd = static_cast<std::int64_t>(c.sh.Hk) * c.sh.dk;
    p.q = qkv.get();
    p.k = qkv.get() + Kd;
    p.v = qkv.get() + 2 * Kd;
    p.ld_q = p.ld_k = p.ld_v = C;
    p.a = a.get();
    p.b = b.get();
    p.ld_a = p.ld_b = c.sh.Hv;
    p.neg_exp_A = nea.get();
    p.dt_bias = dtb.get();
    p.state = state.get();
    p.state_slot_stride = c.slot_elems();
    p.slots = slots.get();
    p.cu_seqlens = cu.get();
    p.num_seqs = static_cast<int>(c.lens.size());
    p.out = out.get();
    p.ld_out = static_cast<std::int64_t>(c.sh.Hv) * c.sh.dv;
    p.num_k_heads = c.sh.Hk;
    p.num_v_heads = c.sh.Hv;
    p.dk = c.sh.dk;
    p.dv = c.sh.dv;
  }
};

int max_len(const std::vector<int>& lens) { return lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end()); }

}  // namespace

// ================================================================================================


TEST_CASE("CUDA few-row projection (GEMV): float32 sums of bf16 products, batch-invariant", "[cuda]") {
  GDN_NEED_DEVICE();
  Rng rng(5);
  // Sizes off every multiple the kernel uses (16 outputs a block, 8 rows a group, 256 columns a
  // warp step), with and without 16-byte vector loads (in % 8).
  for (const auto& [in, out] : {std::pair{200, 37}, std::pair{128, 512}, std::pair{77, 19}, std::pair{1032, 48}}) {
    const int max_rows = 20;
    const BfData x = bf_normal(rng, static_cast<std::size_t>(max_rows) * in, 1.0f);
    const BfData w = bf_normal(rng, static_cast<std::size_t>(out) * in, 0.05f);
    std::vector<float> ref(static_cast<std::size_t>(max_rows) * out);
    for (int r = 0; r < max_rows; ++r)
      for (int o = 0; o < out; ++o) {
        double acc = 0;
        for (int i = 0; i < in; ++i) acc += static_cast<double>(x.f[static_cast<std::size_t>(r * in + i)]) * w.f[static_cast<std::size_t>(o * in + i)];
        ref[static_cast<std::size_t>(r * out + o)] = static_cast<float>(acc);
      }
    Buf<bf16> dx(x.b), dw(w.b);
    std::vector<float> first;  // rows computed one at a time
    for (const int rows : {1, 3, 8, 9, 20}) {
      INFO("in " << in << " out " << out << " rows " << rows);
      Buf<float> dy(static_cast<std::size_t>(rows) * out);
      gc::GemvParams p;
      p.x = dx.get();
      p.ldx = in;
      p.w = dw.get();
      p.ldw = in;
      p.y = dy.get();
      p.ldy = out;
      p.f32_out = true;
      p.rows = rows;
      p.in = in;
      p.out = out;
      REQUIRE(gc::gemv(p, no_stream()) == cudaSuccess);
      const auto got = dy.download();
      check_close("gemv vs float64", got, std::vector<float>(ref.begin(), ref.begin() + rows * out), 1e-4f, 1e-4f);
      if (rows == 1) first = got;
      // Row 0 is the same sequence of operations whatever else is in the call.
      CHECK(std::equal(first.begin(), first.end(), got.begin()));
    }
  }
}

TEST_CASE("CUDA causal conv1d: varlen prefill and multi-token update with snapshots", "[cuda]") {
  GDN_NEED_DEVICE();
  constexpr int K = 4;
  const int C = 208;  // the qwen35_cond_mtp fixture's conv_dim: not a multiple of the 128-channel block
  for (const bool update : {false, true}) {
    const std::vector<int> lens = update ? std::vector<int>{1, 4, 2, 3} : std::vector<int>{1, 70, 2, 130, 0};
    INFO((update ? "update" : "prefill"));
    Rng rng(update ? 11 : 12);
    const auto cu = prefix_sums(lens);
    const int rows = cu.back(), n = static_cast<int>(lens.size()), pool = n + 1;
    std::vector<std::int32_t> slots(static_cast<std::size_t>(pool));  // distinct, in no particular order
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng.gen);
    slots.resize(static_cast<std::size_t>(n));
    const BfData x = bf_normal(rng, static_cast<std::size_t>(rows) * C, 1.0f);
    const BfData w = bf_normal(rng, static_cast<std::size_t>(C) * K, 0.5f);
    const BfData hist = bf_normal(rng, static_cast<std::size_t>(pool) * (K - 1) * C, 1.0f);

    std::vector<float> ref_out(static_cast<std::size_t>(rows) * C), ref_hist = hist.f;
    std::vector<float> w_taps(w.f.size());  // the CPU keeps taps tap-major, [K][C]
    for (int c = 0; c < C; ++c)
      for (int j = 0; j < K; ++j) w_taps[static_cast<std::size_t>(j * C + c)] = w.f[static_cast<std::size_t>(c * K + j)];
    std::vector<std::vector<float>> ref_snap(static_cast<std::size_t>(n) * 16);
    for (int s = 0; s < n; ++s) {
      float* st = ref_hist.data() + static_cast<std::int64_t>(slots[static_cast<std::size_t>(s)]) * (K - 1) * C;
      if (!update) {
        ref::causal_conv1d_silu(w_taps.data(), K, C, x.f.data() + cu[s] * C, C, lens[s], st,
                                        ref_out.data() + cu[s] * C, C, 0, C);
        continue;
      }
      for (int t = 0; t < lens[s]; ++t) {  // one token at a time, reading the history after each
        const std::int64_t r = cu[s] + t;
        ref::causal_conv1d_silu(w_taps.data(), K, C, x.f.data() + r * C, C, 1, st, ref_out.data() + r * C, C, 0, C);
        ref_snap[static_cast<std::size_t>(s * 16 + t)].assign(st, st + (K - 1) * C);
      }
    }

    Buf<bf16> dx(x.b), dw(w.b), dhist(hist.b), dout(static_cast<std::size_t>(rows) * C);
    Buf<std::int32_t> dslots(slots), dcu(cu);
    const int max_t = 4;
    // Snapshots by slot (a slot's entries at slots[s]·seq_stride), for every slot of the pool.
    Buf<bf16> dsnap(update ? static_cast<std::size_t>(pool) * max_t * (K - 1) * C : 0);
    gc::Conv1dParams p;
    p.x = dx.get();
    p.ld_x = C;
    p.weight = dw.get();
    p.out = dout.get();
    p.ld_out = C;
    p.state = dhist.get();
    p.state_slot_stride = static_cast<std::int64_t>(K - 1) * C;
    p.slots = dslots.get();
    p.cu_seqlens = dcu.get();
    p.num_seqs = n;
    p.channels = C;
    p.kernel_size = K;
    if (update) {
      p.snapshots = dsnap.get();
      p.snapshot_token_stride = static_cast<std::int64_t>(K - 1) * C;
      p.snapshot_seq_stride = max_t * p.snapshot_token_stride;
      REQUIRE(gc::causal_conv1d_update(p, max_len(lens), no_stream()) == cudaSuccess);
    } else {
      REQUIRE(gc::causal_conv1d_prefill(p, max_len(lens), no_stream()) == cudaSuccess);
    }
    check_close("conv1d output (bf16)", widen(dout.download()), ref_out, 1e-3f, 4e-3f);
    // The history holds raw bf16 inputs: exact.
    check_close("conv1d history (exact)", widen(dhist.download()), ref_hist, 0.0f, 0.0f);
    if (update) {
      const auto snap = widen(dsnap.download());
      std::vector<float> got, want;
      for (int s = 0; s < n; ++s)
        for (int t = 0; t < lens[s]; ++t) {
          const auto& r = ref_snap[static_cast<std::size_t>(s * 16 + t)];
          want.insert(want.end(), r.begin(), r.end());
          const float* g = snap.data() + (static_cast<std::int64_t>(slots[static_cast<std::size_t>(s)]) * max_t + t) * (K - 1) * C;
          got.insert(got.end(), g, g + (K - 1) * C);
        }
      check_close("conv1d per-token snapshots (exact)", got, want, 0.0f, 0.0f);
    }
  }
}

TEST_CASE("CUDA fused recurrent GDN (T = 1..4, gates and q/k norm fused) equals the CPU recurrence", "[cuda]") {
  GDN_NEED_DEVICE();
  for (const GdnShape sh : {GdnShape{2, 6, 16, 24}, GdnShape{2, 4, 128, 128}}) {
    INFO("Hk " << sh.Hk << " Hv " << sh.Hv << " dk " << sh.dk << " dv " << sh.dv);
    std::printf("shape Hk=%d Hv=%d dk=%d dv=%d\n", sh.Hk, sh.Hv, sh.dk, sh.dv);
    const GdnCase c = make_gdn_case(sh, {1, 4, 2, 3}, 21);
    std::vector<float> S = c.state;
    std::vector<std::vector<float>> snaps(c.lens.size() * 16);
    const auto ref = gdn_reference(c, S, false, &snaps);

    GdnDevice d(c);
    const int max_t = 4;
    Buf<float> dsnap(static_cast<std::size_t>(c.pool_slots) * max_t * static_cast<std::size_t>(c.slot_elems()));
    gc::GdnParams p = d.p;
    p.snapshots = dsnap.get();
    p.snapshot_token_stride = c.slot_elems();
    p.snapshot_seq_stride = max_t * c.slot_elems();
    REQUIRE(gc::gdn_recurrent(p, max_t, no_stream()) == cudaSuccess);
    check_close("recurrent output (bf16)", widen(d.out.download()), ref, 1e-3f, 4e-3f);
    check_close("recurrent state (float32)", d.state.download(), S, 2e-5f, 1e-4f);

    const auto snap = dsnap.download();
    std::vector<float> got, want;
    for (std::size_t s = 0; s < c.lens.size(); ++s)
      for (int t = 0; t < c.lens[s]; ++t) {
        const auto& r = snaps[s * 16 + static_cast<std::size_t>(t)];
        want.insert(want.end(), r.begin(), r.end());
        const float* g = snap.data() + (static_cast<std::int64_t>(c.slots[s]) * max_t + t) * c.slot_elems();
        got.insert(got.end(), g, g + c.slot_elems());
      }
    check_close("per-token state snapshots", got, want, 2e-5f, 1e-4f);

    // Rollback: keep[s] tokens accepted; the slot must then hold the state after those tokens.
    const std::vector<std::int32_t> keep = {1, 2, 0, 3};
    Buf<std::int32_t> dkeep(keep);
    gc::SnapshotSelect sel;
    sel.pool = d.state.get();
    sel.slot_stride_bytes = c.slot_elems() * 4;
    sel.slots = d.slots.get();
    sel.snapshots = dsnap.get();
    sel.seq_stride_bytes = p.snapshot_seq_stride * 4;
    sel.token_stride_bytes = p.snapshot_token_stride * 4;
    sel.keep = dkeep.get();
    sel.bytes = c.slot_elems() * 4;
    sel.num_seqs = static_cast<int>(c.lens.size());
    REQUIRE(gc::select_snapshots(sel, no_stream()) == cudaSuccess);
    std::vector<float> want_pool = S;  // keep 0 leaves the final state in place
    for (std::size_t s = 0; s < c.lens.size(); ++s) {
      if (keep[s] == 0) continue;
      const auto& r = snaps[s * 16 + static_cast<std::size_t>(keep[s] - 1)];
      std::copy(r.begin(), r.end(), want_pool.begin() + c.slots[s] * c.slot_elems());
    }
    const auto pool = d.state.download();
    std::vector<float> got_r, want_r;
    for (std::size_t s = 0; s < c.lens.size(); ++s) {
      const auto off = c.slots[s] * c.slot_elems();
      got_r.insert(got_r.end(), pool.begin() + off, pool.begin() + off + c.slot_elems());
      want_r.insert(want_r.end(), want_pool.begin() + off, want_pool.begin() + off + c.slot_elems());
    }
    check_close("rollback to the accepted tokens' state", got_r, want_r, 2e-5f, 1e-4f);
  }
}

TEST_CASE("CUDA chunked GDN prefill (WY/UT, chunk 64, varlen in one launch) equals the CPU chunked form", "[cuda]") {
  GDN_NEED_DEVICE();
  struct Run {
    GdnShape sh;
    std::vector<int> lens;
  };
  // Chunk tails and exact multiples; a zero-length sequence in the batch.
  for (const Run& run : {Run{GdnShape{2, 6, 16, 24}, {65, 1, 0, 130}}, Run{GdnShape{1, 2, 128, 128}, {64, 63, 129}}}) {
    const GdnShape sh = run.sh;
    INFO("Hk " << sh.Hk << " Hv " << sh.Hv << " dk " << sh.dk << " dv " << sh.dv);
    std::printf("shape Hk=%d Hv=%d dk=%d dv=%d\n", sh.Hk, sh.Hv, sh.dk, sh.dv);
    const GdnCase c = make_gdn_case(sh, run.lens, 31);
    std::vector<float> S_chunk = c.state, S_rec = c.state;
    const auto ref_chunk = gdn_reference(c, S_chunk, true);
    const auto ref_rec = gdn_reference(c, S_rec, false);

    GdnDevice d(c);
    Buf<float> ws(gc::gdn_chunked_workspace_bytes(c.rows, sh.Hv) / sizeof(float));
    REQUIRE(gc::gdn_chunked(d.p, max_len(c.lens), ws.get(), no_stream()) == cudaSuccess);
    const auto out = widen(d.out.download());
    const auto state = d.state.download();
    check_close("chunked output vs CPU chunked (bf16)", out, ref_chunk, 2e-3f, 4e-3f);
    check_close("chunked output vs CPU recurrent (bf16)", out, ref_rec, 2e-3f, 4e-3f);
    check_close("chunked final state vs CPU chunked", state, S_chunk, 1e-4f, 1e-4f);
    check_close("chunked final state vs CPU recurrent", state, S_rec, 1e-4f, 1e-4f);
  }
}

// ------------------------------------------------------------------------------------------------
namespace {

// Attention problem: sequences with history (positions already in the cache) and new rows.
struct AttnCase {
  int Hq, Hkv, hd, rot, ps = 16;
  std::vector<int> hist, lens;  // per sequence: positions cached before the step, rows in the step
  std::vector<std::int32_t> cu, kv_lens, page_indptr, page_indices;
  int rows = 0, pages = 0;
  BfData qkv;  // per row: q_proj (q | gate per head) | k | v
  std::vector<float> q_scale, k_scale, inv_freq;
  // The cache before the step: [seq][kv|v][g][pos][hd], bf16 values.
  std::vector<std::vector<float>> cache;
  std::int64_t ld() const { return 2LL * Hq * hd + 2LL * Hkv * hd; }
  std::int64_t page_elems() const { return 2LL * Hkv * ps * hd; }
};

AttnCase make_attn_case(int Hq, int Hkv, int hd, std::vector<int> hist, std::vector<int> lens, unsigned seed) {
  Rng rng(seed);
  AttnCase c;
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.hd = hd;
  c.rot = hd / 4;
  c.hist = hist;
  c.lens = lens;
  c.cu = prefix_sums(lens);
  c.rows = c.cu.back();
  const int n = static_cast<int>(lens.size());
  c.page_indptr.push_back(0);
  std::vector<int> need;
  for (int s = 0; s < n; ++s) {
    c.kv_lens.push_back(hist[static_cast<std::size_t>(s)] + lens[static_cast<std::size_t>(s)]);
    need.push_back((c.kv_lens.back() + c.ps - 1) / c.ps);
    c.page_indptr.push_back(c.page_indptr.back() + need.back());
  }
  c.pages = c.page_indptr.back() + 3;
  std::vector<std::int32_t> perm(static_cast<std::size_t>(c.pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  c.page_indices.assign(perm.begin(), perm.begin() + c.page_indptr.back());
  c.qkv = bf_normal(rng, static_cast<std::size_t>(c.rows * c.ld()), 1.0f);
  for (int i = 0; i < hd; ++i) {
    c.q_scale.push_back(1.0f + rng.normal(0.1f));
    c.k_scale.push_back(1.0f + rng.normal(0.1f));
  }
  const double theta = 1e7;
  for (int i = 0; i < c.rot / 2; ++i)
    c.inv_freq.push_back(static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / c.rot)));
  for (int s = 0; s < n; ++s) {
    std::vector<float> cs(static_cast<std::size_t>(2) * Hkv * c.kv_lens[static_cast<std::size_t>(s)] * hd, 0.0f);
    const int L = c.kv_lens[static_cast<std::size_t>(s)];
    for (int which = 0; which < 2; ++which)
      for (int g = 0; g < Hkv; ++g)
        for (int pos = 0; pos < hist[static_cast<std::size_t>(s)]; ++pos)
          for (int e = 0; e < hd; ++e)
            cs[((static_cast<std::size_t>(which) * Hkv + g) * L + pos) * hd + e] = round_bf(rng.normal(1.0f));
    c.cache.push_back(cs);
  }
  return c;
}

// CPU reference following the CPU backend's attention (kernels/attention.hpp). Returns the gated output [rows][Hq·hd]
// and completes c.cache with the step's keys and values (in `cache`).
std::vector<float> attn_reference(const AttnCase& c, std::vector<std::vector<float>>& cache,
                                  std::vector<float>* q_out = nullptr) {
  const int Hq = c.Hq, Hkv = c.Hkv, hd = c.hd;
  const RefRope rope(c.rot, 1e7);
  const float eps = 1e-6f;
  std::vector<float> q(static_cast<std::size_t>(c.rows) * Hq * hd), out(q.size());
  std::vector<float> cs(static_cast<std::size_t>(c.rot / 2)), sn(cs.size());
  for (std::size_t s = 0; s < c.lens.size(); ++s) {
    const int L = c.kv_lens[s];
    auto at = [&](int which, int g, int pos) { return cache[s].data() + ((static_cast<std::size_t>(which) * Hkv + g) * L + pos) * hd; };
    for (int t = 0; t < c.lens[s]; ++t) {
      const int r = c.cu[s] + t, pos = c.hist[s] + t;
      rope.angles(pos, cs.data(), sn.data());
      const float* p = c.qkv.f.data() + r * c.ld();
      for (int h = 0; h < Hq; ++h) {
        float* qh = q.data() + (static_cast<std::size_t>(r) * Hq + h) * hd;
        ref::rms_norm(p + 2LL * h * hd, c.q_scale.data(), qh, hd, eps);
        rope.apply(qh, cs.data(), sn.data());
      }
      for (int g = 0; g < Hkv; ++g) {
        ref::rms_norm(p + 2LL * Hq * hd + g * hd, c.k_scale.data(), at(0, g, pos), hd, eps);
        rope.apply(at(0, g, pos), cs.data(), sn.data());
        std::copy_n(p + 2LL * Hq * hd + static_cast<std::int64_t>(Hkv) * hd + g * hd, hd, at(1, g, pos));
      }
    }
    if (q_out != nullptr) {  // before rounding: the prepare kernel's own error is checked on these
      q_out->resize(q.size());
      const std::size_t b = static_cast<std::size_t>(c.cu[s]) * Hq * hd, e = static_cast<std::size_t>(c.cu[s + 1]) * Hq * hd;
      std::copy(q.begin() + static_cast<std::ptrdiff_t>(b), q.begin() + static_cast<std::ptrdiff_t>(e),
                q_out->begin() + static_cast<std::ptrdiff_t>(b));
    }
    // The GPU keeps queries and the cache in bf16: the attention itself is checked on those values.
    for (int t = 0; t < c.lens[s]; ++t) {
      const int r = c.cu[s] + t, pos = c.hist[s] + t;
      for (int h = 0; h < Hq; ++h)
        for (int e = 0; e < hd; ++e) q[(static_cast<std::size_t>(r) * Hq + h) * hd + e] = round_bf(q[(static_cast<std::size_t>(r) * Hq + h) * hd + e]);
      for (int g = 0; g < Hkv; ++g)
        for (int e = 0; e < hd; ++e) at(0, g, pos)[e] = round_bf(at(0, g, pos)[e]);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> scores(static_cast<std::size_t>(L));
    for (int t = 0; t < c.lens[s]; ++t) {
      const int r = c.cu[s] + t, len = c.hist[s] + t + 1;
      for (int h = 0; h < Hq; ++h) {
        const int g = h / (Hq / Hkv);
        const float* qh = q.data() + (static_cast<std::size_t>(r) * Hq + h) * hd;
        float mx = -INFINITY;
        for (int j = 0; j < len; ++j) {
          float d = 0.0f;
          for (int e = 0; e < hd; ++e) d += qh[e] * at(0, g, j)[e];
          scores[static_cast<std::size_t>(j)] = d * scale;
          mx = std::max(mx, scores[static_cast<std::size_t>(j)]);
        }
        float sum = 0.0f;
        for (int j = 0; j < len; ++j) sum += scores[static_cast<std::size_t>(j)] = std::exp(scores[static_cast<std::size_t>(j)] - mx);
        float* o = out.data() + (static_cast<std::size_t>(r) * Hq + h) * hd;
        for (int j = 0; j < len; ++j)
          for (int e = 0; e < hd; ++e) o[e] += scores[static_cast<std::size_t>(j)] / sum * at(1, g, j)[e];
        const float* gate = c.qkv.f.data() + r * c.ld() + 2LL * h * hd + hd;
        for (int e = 0; e < hd; ++e) o[e] *= ref::sigmoid(gate[e]);
      }
    }
  }
  return out;
}

struct AttnDevice {
  Buf<bf16> qkv, kv, q;
  Buf<float> qs, ks, freq;
  Buf<std::int32_t> cu, kv_lens, indptr, indices;
  gc::PagedKv pk;
  explicit AttnDevice(const AttnCase& c)
      : qkv(c.qkv.b), kv(static_cast<std::size_t>(c.pages * c.page_elems())), q(static_cast<std::size_t>(c.rows) * c.Hq * c.hd),
        qs(c.q_scale), ks(c.k_scale), freq(c.inv_freq), cu(c.cu), kv_lens(c.kv_lens), indptr(c.page_indptr),
        indices(c.page_indices) {
    // The pool in the CPU KvPagePool layout for one layer: [page][k|v][g][row][hd].
    std::vector<bf16> pool(static_cast<std::size_t>(c.pages * c.page_elems()), tobf(NAN));
    for (std::size_t s = 0; s < c.lens.size(); ++s) {
      const int L = c.kv_lens[s];
      for (int which = 0; which < 2; ++which)
        for (int g = 0; g < c.Hkv; ++g)
          for (int pos = 0; pos < c.hist[s]; ++pos) {
            const int page = c.page_indices[static_cast<std::size_t>(c.page_indptr[s] + pos / c.ps)];
            const std::int64_t off = page * c.page_elems() + ((static_cast<std::int64_t>(which) * c.Hkv + g) * c.ps + pos % c.ps) * c.hd;
            for (int e = 0; e < c.hd; ++e)
              pool[static_cast<std::size_t>(off + e)] = tobf(c.cache[s][((static_cast<std::size_t>(which) * c.Hkv + g) * L + pos) * c.hd + e]);
          }
    }
    kv.upload(pool);
    pk.data = kv.get();
    pk.page_stride = c.page_elems();
    pk.kv_stride = static_cast<std::int64_t>(c.Hkv) * c.ps * c.hd;
    pk.head_stride = static_cast<std::int64_t>(c.ps) * c.hd;
    pk.row_stride = c.hd;
    pk.page_size = c.ps;
    pk.page_indptr = indptr.get();
    pk.page_indices = indices.get();
    pk.kv_lens = kv_lens.get();
  }
  gc::AttnPrepareParams prepare(const AttnCase& c) const {
    gc::AttnPrepareParams p;
    p.q_gate = qkv.get();
    p.ld_q = c.ld();
    p.k = qkv.get() + 2LL * c.Hq * c.hd;
    p.v = p.k + static_cast<std::int64_t>(c.Hkv) * c.hd;
    p.ld_k = p.ld_v = c.ld();
    p.q_norm_scale = qs.get();
    p.k_norm_scale = ks.get();
    p.inv_freq = freq.get();
    p.rotary_dim = c.rot;
    p.eps = 1e-6f;
    p.q_out = q.get();
    p.ld_q_out = static_cast<std::int64_t>(c.Hq) * c.hd;
    p.kv = pk;
    p.cu_seqlens = cu.get();
    p.num_seqs = static_cast<int>(c.lens.size());
    p.rows = c.rows;
    p.num_q_heads = c.Hq;
    p.num_kv_heads = c.Hkv;
    p.head_dim = c.hd;
    return p;
  }
  gc::AttnParams attn(const AttnCase& c, bf16* out) const {
    gc::AttnParams p;
    p.q = q.get();
    p.ld_q = static_cast<std::int64_t>(c.Hq) * c.hd;
    p.gate = qkv.get() + c.hd;
    p.ld_gate = c.ld();
    p.gate_head_stride = 2LL * c.hd;
    p.out = out;
    p.ld_out = static_cast<std::int64_t>(c.Hq) * c.hd;
    p.kv = pk;
    p.cu_seqlens = cu.get();
    p.num_seqs = static_cast<int>(c.lens.size());
    p.rows = c.rows;
    p.num_q_heads = c.Hq;
    p.num_kv_heads = c.Hkv;
    p.head_dim = c.hd;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    return p;
  }
  // The step's keys and values as written to the pages, [seq] → [k|v][g][pos][hd] for new positions only.
  std::vector<float> appended(const AttnCase& c) const {
    const auto pool = kv.download();
    std::vector<float> out;
    for (std::size_t s = 0; s < c.lens.size(); ++s)
      for (int which = 0; which < 2; ++which)
        for (int g = 0; g < c.Hkv; ++g)
          for (int pos = c.hist[s]; pos < c.kv_lens[s]; ++pos) {
            const int page = c.page_indices[static_cast<std::size_t>(c.page_indptr[s] + pos / c.ps)];
            const std::int64_t off = page * c.page_elems() + ((static_cast<std::int64_t>(which) * c.Hkv + g) * c.ps + pos % c.ps) * c.hd;
            for (int e = 0; e < c.hd; ++e) out.push_back(bf(pool[static_cast<std::size_t>(off + e)]));
          }
    return out;
  }
};

std::vector<float> appended_reference(const AttnCase& c, const std::vector<std::vector<float>>& cache) {
  std::vector<float> out;
  for (std::size_t s = 0; s < c.lens.size(); ++s) {
    const int L = c.kv_lens[s];
    for (int which = 0; which < 2; ++which)
      for (int g = 0; g < c.Hkv; ++g)
        for (int pos = c.hist[s]; pos < L; ++pos)
          for (int e = 0; e < c.hd; ++e) out.push_back(cache[s][((static_cast<std::size_t>(which) * c.Hkv + g) * L + pos) * c.hd + e]);
  }
  return out;
}

}  // namespace

TEST_CASE("CUDA gated attention over paged KV: prepare (norm, rope, append), split-K decode, prefill", "[cuda]") {
  GDN_NEED_DEVICE();
  struct Run {
    int Hq, Hkv, hd;
    std::vector<int> hist, lens;
    bool decode;
  };
  const std::vector<Run> runs = {
      // Decode and MTP verify: 1..4 rows per sequence over long and short histories.
      {4, 2, 32, {40, 0, 17, 100}, {1, 1, 4, 3}, true},
      {6, 1, 256, {33, 70}, {1, 4}, true},
      // Prefill: fresh sequences and continuations of cached prefixes.
      {4, 2, 32, {0, 5, 33}, {1, 17, 40}, false},
      {4, 1, 256, {0, 20}, {35, 9}, false},
  };
  for (const Run& run : runs) {
    INFO("Hq " << run.Hq << " Hkv " << run.Hkv << " hd " << run.hd << (run.decode ? " decode" : " prefill"));
    std::printf("attention Hq=%d Hkv=%d hd=%d %s\n", run.Hq, run.Hkv, run.hd, run.decode ? "decode" : "prefill");
    const AttnCase c = make_attn_case(run.Hq, run.Hkv, run.hd, run.hist, run.lens, 41);
    auto cache = c.cache;
    std::vector<float> ref_q;
    const auto ref = attn_reference(c, cache, &ref_q);

    AttnDevice d(c);
    REQUIRE(gc::attention_prepare(d.prepare(c), no_stream()) == cudaSuccess);
    check_close("normed, rotated queries (bf16)", widen(d.q.download()), ref_q, 1e-3f, 4e-3f);
    check_close("appended keys and values (bf16)", d.appended(c), appended_reference(c, cache), 1e-3f, 4e-3f);

    Buf<bf16> out(static_cast<std::size_t>(c.rows) * c.Hq * c.hd);
    if (run.decode) {
      // Split lengths: one split for everything, a few, and many short ones (some rows then have
      // empty splits); the same arithmetic per split either way.
      const int longest = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
      for (const int split_len : {longest, 16, 48, gc::attention_decode_split_len(longest)}) {
        const int splits = gc::attention_decode_splits(longest, split_len);
        Buf<float> ws(gc::attention_decode_workspace_bytes(c.rows, c.Hq, c.hd, splits) / sizeof(float) + 1);
        REQUIRE(gc::attention_decode(d.attn(c, out.get()), splits, split_len, ws.get(), no_stream()) == cudaSuccess);
        const std::string what = "decode output, " + std::to_string(splits) + " split(s) of " + std::to_string(split_len);
        check_close(what.c_str(), widen(out.download()), ref, 2e-3f, 5e-3f);
      }
    } else {
      REQUIRE(gc::attention_prefill(d.attn(c, out.get()), max_len(c.lens), no_stream()) == cudaSuccess);
      check_close("prefill output", widen(out.download()), ref, 2e-3f, 5e-3f);
    }
  }
}

// ------------------------------------------------------------------------------------------------

TEST_CASE("CUDA RMSNorm (zero-centred and plain, fused residual), gated norm, SwiGLU, RoPE, embedding", "[cuda]") {
  GDN_NEED_DEVICE();
  Rng rng(51);
  const float eps = 1e-6f;
  for (const int n : {64, 1000}) {
    for (const bool with_res : {false, true}) {
      for (const float offset : {1.0f, 0.0f}) {
        INFO("n " << n << " residual " << with_res << " offset " << offset);
        const int rows = 3;
        const BfData x = bf_normal(rng, static_cast<std::size_t>(rows) * n, 1.0f);
        const BfData res = bf_normal(rng, static_cast<std::size_t>(rows) * n, 1.0f);
        std::vector<float> w(static_cast<std::size_t>(n));
        for (auto& v : w) v = rng.normal(0.1f) + (offset == 0.0f ? 1.0f : 0.0f);
        std::vector<float> ref(static_cast<std::size_t>(rows) * n), ref_res = res.f, scale(w.size());
        for (std::size_t i = 0; i < w.size(); ++i) scale[i] = w[i] + offset;
        for (int r = 0; r < rows; ++r) {
          std::vector<float> in(x.f.begin() + r * n, x.f.begin() + (r + 1) * n);
          if (with_res)
            for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = ref_res[static_cast<std::size_t>(r * n + i)] =
                                            round_bf(in[static_cast<std::size_t>(i)] + res.f[static_cast<std::size_t>(r * n + i)]);
          ref::rms_norm(in.data(), scale.data(), ref.data() + r * n, n, eps);
        }
        Buf<bf16> dx(x.b), dres(res.b), dy(static_cast<std::size_t>(rows) * n);
        Buf<float> dw(w);
        REQUIRE(gc::rmsnorm(dx.get(), n, with_res ? dres.get() : nullptr, n, dw.get(), offset, dy.get(), n, rows, n, eps,
                            no_stream()) == cudaSuccess);
        check_close("rmsnorm", widen(dy.download()), ref, 1e-3f, 4e-3f);
        if (with_res) check_close("rmsnorm residual sum (bf16)", widen(dres.download()), ref_res, 0.0f, 0.0f);
      }
    }
  }
  {
    const int rows = 3, heads = 5, hd = 24;
    const BfData x = bf_normal(rng, static_cast<std::size_t>(rows) * heads * hd, 1.0f);
    const BfData z = bf_normal(rng, x.f.size(), 1.0f);
    std::vector<float> w(static_cast<std::size_t>(hd));
    for (auto& v : w) v = 1.0f + rng.normal(0.1f);
    std::vector<float> ref(x.f.size());
    for (int r = 0; r < rows * heads; ++r)
      ref::rms_norm_gated(x.f.data() + r * hd, z.f.data() + r * hd, w.data(), ref.data() + r * hd, hd, eps);
    Buf<bf16> dx(x.b), dz(z.b);
    Buf<float> dw(w);
    REQUIRE(gc::rmsnorm_gated(dx.get(), heads * hd, dz.get(), heads * hd, dw.get(), dx.get(), heads * hd, rows, heads, hd,
                              eps, no_stream()) == cudaSuccess);
    check_close("gated rmsnorm (in place)", widen(dx.download()), ref, 1e-3f, 4e-3f);
  }
  {
    const int rows = 2, I = 300;
    const BfData gu = bf_normal(rng, static_cast<std::size_t>(rows) * 2 * I, 2.0f);
    std::vector<float> ref(static_cast<std::size_t>(rows) * I);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < I; ++i)
        ref[static_cast<std::size_t>(r * I + i)] =
            ref::silu(gu.f[static_cast<std::size_t>(r * 2 * I + i)]) * gu.f[static_cast<std::size_t>(r * 2 * I + I + i)];
    Buf<bf16> din(gu.b), dout(static_cast<std::size_t>(rows) * I);
    REQUIRE(gc::swiglu(din.get(), 2 * I, I, dout.get(), I, rows, I, no_stream()) == cudaSuccess);
    check_close("swiglu", widen(dout.download()), ref, 1e-3f, 4e-3f);
  }
  {
    const int rows = 3, heads = 2, hd = 64, rot = 16;
    const BfData x = bf_normal(rng, static_cast<std::size_t>(rows) * heads * hd, 1.0f);
    const std::vector<std::int32_t> pos = {0, 7, 262143};
    const RefRope rope(rot, 1e7);
    std::vector<float> inv_freq;
    for (int i = 0; i < rot / 2; ++i) inv_freq.push_back(static_cast<float>(1.0 / std::pow(1e7, static_cast<double>(2 * i) / rot)));
    std::vector<float> ref = x.f, cs(rot / 2), sn(rot / 2);
    for (int r = 0; r < rows; ++r) {
      rope.angles(pos[static_cast<std::size_t>(r)], cs.data(), sn.data());
      for (int h = 0; h < heads; ++h) rope.apply(ref.data() + (r * heads + h) * hd, cs.data(), sn.data());
    }
    Buf<bf16> dx(x.b);
    Buf<std::int32_t> dpos(pos);
    Buf<float> dfreq(inv_freq);
    REQUIRE(gc::rope_neox(dx.get(), heads * hd, hd, heads, rot, dpos.get(), dfreq.get(), rows, no_stream()) == cudaSuccess);
    check_close("partial NeoX rope (in place)", widen(dx.download()), ref, 1e-3f, 4e-3f);
  }
  {
    const int V = 50, n = 40, rows = 4;
    const BfData table = bf_normal(rng, static_cast<std::size_t>(V) * n, 1.0f);
    const std::vector<std::int32_t> tokens = {3, 49, 0, 3};
    std::vector<float> ref;
    for (const int t : tokens) ref.insert(ref.end(), table.f.begin() + t * n, table.f.begin() + (t + 1) * n);
    Buf<bf16> dt(table.b), dout(static_cast<std::size_t>(rows) * n);
    Buf<std::int32_t> dtok(tokens);
    REQUIRE(gc::embedding_gather(dt.get(), n, dtok.get(), dout.get(), n, rows, n, no_stream()) == cudaSuccess);
    check_close("embedding gather (exact)", widen(dout.download()), ref, 0.0f, 0.0f);
  }
}

// ------------------------------------------------------------------------------------------------
namespace {

struct SampleRow {
  float temperature;
  int top_k;
  float top_p, min_p;
};

// gdn::Sampler::distribution without penalties, transcribed (the standalone build has no libgdn).
std::vector<float> reference_distribution(const std::vector<float>& l, const SampleRow& sp) {
  const std::size_t V = l.size();
  std::vector<float> probs(V, 0.0f);
  if (sp.temperature <= 0.0f) {
    probs[static_cast<std::size_t>(std::max_element(l.begin(), l.end()) - l.begin())] = 1.0f;
    return probs;
  }
  const double inv_t = 1.0 / sp.temperature, mx = *std::max_element(l.begin(), l.end());
  const auto weight = [&](std::int32_t t) { return std::exp((l[static_cast<std::size_t>(t)] - mx) * inv_t); };
  std::vector<std::int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return l[static_cast<std::size_t>(a)] > l[static_cast<std::size_t>(b)];
  });
  const std::size_t K = sp.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(sp.top_k), V) : V;
  double Z = 0.0;
  for (std::size_t i = 0; i < K; ++i) Z += weight(order[i]);
  std::size_t n = K;
  if (sp.top_p < 1.0f || sp.min_p > 0.0f) {
    std::size_t cut_p = K, cut_m = K;
    if (sp.top_p < 1.0f) {
      double cum = 0.0;
      for (std::size_t i = 0; i < K; ++i) {
        cum += weight(order[i]) / Z;
        if (cum >= sp.top_p) {
          cut_p = i + 1;
          break;
        }
      }
    }
    if (sp.min_p > 0.0f) {
      cut_m = 1;
      while (cut_m < K && weight(order[cut_m]) >= sp.min_p) ++cut_m;
    }
    n = std::min(cut_p, cut_m);
  }
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) total += weight(order[i]);
  for (std::size_t i = 0; i < n; ++i) probs[static_cast<std::size_t>(order[i])] = static_cast<float>(weight(order[i]) / total);
  return probs;
}

}  // namespace

TEST_CASE("CUDA sampling: greedy, temperature, top-k, top-p, min-p, draw in vocabulary order", "[cuda]") {
  GDN_NEED_DEVICE();
  Rng rng(61);
  const int V = 5000;
  const std::vector<SampleRow> rows = {
      {0.0f, 0, 1.0f, 0.0f},     {0.8f, 20, 1.0f, 0.0f},   {1.0f, 0, 0.6f, 0.0f},   {1.0f, 0, 0.95f, 0.05f},
      {0.7f, 2000, 1.0f, 0.0f},  {1.0f, 40, 0.5f, 0.0f},   {0.6f, 1, 1.0f, 0.0f},   {1.0f, 3000, 0.8f, 0.0f},
      {1.0f, 0, 1.0f, 0.0f},     {0.9f, 50, 1.0f, 0.2f},
  };
  const int R = static_cast<int>(rows.size());
  std::vector<float> logits(static_cast<std::size_t>(R) * V);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < V; ++i) {
      // Peaked rows, flat rows, and exact ties (quantised logits) around the cuts.
      const float x = rng.normal(r % 3 == 0 ? 4.0f : 2.0f);
      logits[static_cast<std::size_t>(r * V + i)] = r % 2 == 0 ? std::round(x * 8.0f) / 8.0f : x;
    }
  std::vector<float> temp, top_p, min_p, uni;
  std::vector<std::int32_t> top_k;
  for (const auto& s : rows) {
    temp.push_back(s.temperature);
    top_k.push_back(s.top_k);
    top_p.push_back(s.top_p);
    min_p.push_back(s.min_p);
    uni.push_back(rng.uniform(0.0f, 1.0f));
  }
  Buf<float> dl(logits), dt(temp), dp(top_p), dm(min_p), du(uni), dprobs(logits.size());
  Buf<std::int32_t> dk(top_k), dtok(static_cast<std::size_t>(R)), dflags(static_cast<std::size_t>(R));
  gc::SampleParams p;
  p.logits = dl.get();
  p.ld_logits = V;
  p.rows = R;
  p.vocab = V;
  p.temperature = dt.get();
  p.top_k = dk.get();
  p.top_p = dp.get();
  p.min_p = dm.get();
  p.uniforms = du.get();
  p.tokens = dtok.get();
  p.probs = dprobs.get();
  p.ld_probs = V;
  p.flags = dflags.get();
  REQUIRE(gc::sample(p, no_stream()) == cudaSuccess);
  const auto probs = dprobs.download();
  const auto tokens = dtok.download();
  const auto flags = dflags.download();
  for (int r = 0; r < R; ++r) {
    INFO("row " << r << ": T " << rows[static_cast<std::size_t>(r)].temperature << " top_k " << rows[static_cast<std::size_t>(r)].top_k
                << " top_p " << rows[static_cast<std::size_t>(r)].top_p << " min_p " << rows[static_cast<std::size_t>(r)].min_p);
    const std::vector<float> l(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    const auto ref = reference_distribution(l, rows[static_cast<std::size_t>(r)]);
#if !defined(GDN_CUDA_STANDALONE)
    {
      gdn::SamplingParams sp;
      sp.temperature = rows[static_cast<std::size_t>(r)].temperature;
      sp.top_k = rows[static_cast<std::size_t>(r)].top_k;
      sp.top_p = rows[static_cast<std::size_t>(r)].top_p;
      sp.min_p = rows[static_cast<std::size_t>(r)].min_p;
      gdn::Sampler sampler(sp, V);
      std::vector<float> lib(static_cast<std::size_t>(V));
      sampler.distribution(l, lib);
      check_close("test's reference vs gdn::Sampler", ref, lib, 1e-6f, 1e-5f);
    }
#endif
    const std::vector<float> got(probs.begin() + r * V, probs.begin() + (r + 1) * V);
    check_close("sampling distribution", got, ref, 1e-6f, 1e-4f);
    CHECK(flags[static_cast<std::size_t>(r)] == 0);
    // The draw: first token in vocabulary order whose cumulative mass exceeds u, unless u lies
    // within rounding of a boundary.
    const float u = uni[static_cast<std::size_t>(r)];
    double cum = 0.0;
    int want = -1;
    bool near = false;
    for (int i = 0; i < V; ++i) {
      if (ref[static_cast<std::size_t>(i)] <= 0.0f) continue;
      cum += ref[static_cast<std::size_t>(i)];
      near = near || std::fabs(cum - u) < 1e-4;
      want = i;
      if (u < cum) break;
    }
    if (!near) CHECK(tokens[static_cast<std::size_t>(r)] == want);
  }
  // Greedy only.
  Buf<std::int32_t> dam(static_cast<std::size_t>(R));
  REQUIRE(gc::argmax(dl.get(), V, R, V, dam.get(), no_stream()) == cudaSuccess);
  const auto am = dam.download();
  for (int r = 0; r < R; ++r) {
    const auto first = logits.begin() + r * V;
    CHECK(am[static_cast<std::size_t>(r)] == static_cast<int>(std::max_element(first, first + V) - first));
  }
  // A flat row with top_k = 0 and top_p near 1: the cut lies beyond 1024 candidates, and is flagged.
  {
    std::vector<float> flat(static_cast<std::size_t>(V));
    for (auto& x : flat) x = rng.normal(0.01f);
    Buf<float> dflat(flat);
    gc::SampleParams q = p;
    q.logits = dflat.get();
    q.rows = 1;
    q.probs = nullptr;
    const std::vector<float> t1 = {1.0f}, p1 = {0.999f}, m1 = {0.0f};
    const std::vector<std::int32_t> k1 = {0};
    Buf<float> dt1(t1), dp1(p1), dm1(m1);
    Buf<std::int32_t> dk1(k1);
    q.temperature = dt1.get();
    q.top_p = dp1.get();
    q.min_p = dm1.get();
    q.top_k = dk1.get();
    REQUIRE(gc::sample(q, no_stream()) == cudaSuccess);
    CHECK(dflags.download()[0] == 1);
    const int tok = dtok.download()[0];
    CHECK((tok >= 0 && tok < V));
  }
}

// ------------------------------------------------------------------------------------------------
#if !defined(GDN_CUDA_EMULATE)

TEST_CASE("CUDA bf16 GEMM through cuBLASLt (fp32 accumulate, bf16/f32 out, residual epilogue)", "[cuda]") {
  GDN_NEED_DEVICE();
  Rng rng(71);
  const int in = 256, out = 384;
  gc::Gemm gemm;
  REQUIRE(gemm.init() == 0);
  for (const int rows : {1, 5}) {
    const BfData x = bf_normal(rng, static_cast<std::size_t>(rows) * in, 1.0f);
    const BfData w = bf_normal(rng, static_cast<std::size_t>(out) * in, 0.1f);
    const BfData res = bf_normal(rng, static_cast<std::size_t>(rows) * out, 1.0f);
    std::vector<float> ref(static_cast<std::size_t>(rows) * out), ref_res(ref.size());
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) {
        float acc = 0.0f;
        for (int i = 0; i < in; ++i) acc += x.f[static_cast<std::size_t>(r * in + i)] * w.f[static_cast<std::size_t>(o * in + i)];
        ref[static_cast<std::size_t>(r * out + o)] = acc;
        ref_res[static_cast<std::size_t>(r * out + o)] = acc + res.f[static_cast<std::size_t>(r * out + o)];
      }
    Buf<bf16> dx(x.b), dw(w.b), dy(static_cast<std::size_t>(rows) * out), dres(res.b);
    Buf<float> dyf(static_cast<std::size_t>(rows) * out);
    gc::GemmArgs a;
    a.x = dx.get();
    a.ldx = in;
    a.w = dw.get();
    a.ldw = in;
    a.y = dy.get();
    a.ldy = out;
    a.rows = rows;
    a.in = in;
    a.out = out;
    REQUIRE(gemm.run(a, nullptr) == 0);
    check_close("gemm bf16 out", widen(dy.download()), ref, 1e-2f, 4e-3f);
    a.y = dyf.get();
    a.out_type = gc::GemmOut::float32;
    REQUIRE(gemm.run(a, nullptr) == 0);
    check_close("gemm f32 out", dyf.download(), ref, 1e-3f, 1e-3f);
    a.y = dres.get();
    a.out_type = gc::GemmOut::bfloat16;
    a.beta = 1.0f;  // y = x·Wᵀ + y: the residual add in the epilogue
    REQUIRE(gemm.run(a, nullptr) == 0);
    check_close("gemm + residual (bf16)", widen(dres.download()), ref_res, 2e-2f, 4e-3f);
  }
}

TEST_CASE("CUDA decode kernels replay in a CUDA graph with the same results as direct launches", "[cuda]") {
  GDN_NEED_DEVICE();
  const GdnCase c = make_gdn_case(GdnShape{2, 4, 128, 128}, {1, 1, 1}, 81);
  const AttnCase ac = make_attn_case(6, 1, 256, {50, 10, 300}, {1, 1, 1}, 82);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const auto run = [&](bool graph) {
    GdnDevice d(c);
    AttnDevice ad(ac);
    Buf<bf16> out(static_cast<std::size_t>(ac.rows) * ac.Hq * ac.hd);
    const int split_len = 96, splits = gc::attention_decode_splits(301, split_len);
    Buf<float> ws(gc::attention_decode_workspace_bytes(ac.rows, ac.Hq, ac.hd, splits) / sizeof(float));
    const auto step = [&] {
      REQUIRE(gc::gdn_recurrent(d.p, 1, stream) == cudaSuccess);
      REQUIRE(gc::attention_decode(ad.attn(ac, out.get()), splits, split_len, ws.get(), stream) == cudaSuccess);
    };
    REQUIRE(gc::attention_prepare(ad.prepare(ac), stream) == cudaSuccess);
    if (graph) {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t exec = nullptr;
      REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      step();
      REQUIRE(cudaStreamEndCapture(stream, &g) == cudaSuccess);
      REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
      for (int i = 0; i < 3; ++i) REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    } else {
      for (int i = 0; i < 3; ++i) step();
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    }
    auto r = widen(d.out.download());
    const auto st = d.state.download();
    const auto o = widen(out.download());
    r.insert(r.end(), st.begin(), st.end());
    r.insert(r.end(), o.begin(), o.end());
    return r;
  };
  const auto direct = run(false);
  const auto graphed = run(true);
  check_close("graph replay vs direct (bitwise)", graphed, direct, 0.0f, 0.0f);
  cudaStreamDestroy(stream);
}

#endif
