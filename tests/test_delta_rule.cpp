// The gated delta rule on its own: chunked (WY/UT) form vs the per-token recurrence vs a plain
// double-precision reference written from the equations, on random inputs that cross several
// chunk boundaries and include strong and weak decays; and the causal conv. Each kernel is the
// one the engine runs, called through the CPU backend's table for every target this CPU supports
// (avx512, avx2, scalar).

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/target.hpp"
#include "cpu_targets.hpp"

using gdn::cpu::DeltaRuleInput;
using gdn::cpu::DeltaRuleScratch;
using gdn::cpu::Target;

namespace {

void l2_normalize(float* x, int n, float scale) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(scale / std::sqrt(s + 1e-6));
  for (int i = 0; i < n; ++i) x[i] *= r;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

struct Inputs {
  int n, dk, dv;
  std::vector<float> q, k, v, g, beta;
};

Inputs random_inputs(int n, int dk, int dv, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  Inputs in{n, dk, dv, {}, {}, {}, {}, {}};
  in.q.resize(static_cast<std::size_t>(n * dk));
  in.k.resize(in.q.size());
  in.v.resize(static_cast<std::size_t>(n * dv));
  for (auto& x : in.q) x = nd(rng);
  for (auto& x : in.k) x = nd(rng);
  for (auto& x : in.v) x = nd(rng);
  for (int t = 0; t < n; ++t) {
    l2_normalize(in.q.data() + t * dk, dk, 1.0f / std::sqrt(static_cast<float>(dk)));
    l2_normalize(in.k.data() + t * dk, dk, 1.0f);
    // Mix of near-1 decays (state carried far) and strong decays.
    in.g.push_back(t % 7 == 0 ? -3.0f * ud(rng) : -0.05f * ud(rng));
    in.beta.push_back(ud(rng));
  }
  return in;
}

DeltaRuleInput view(const Inputs& in) {
  DeltaRuleInput d;
  d.q = in.q.data();
  d.k = in.k.data();
  d.v = in.v.data();
  d.q_stride = d.k_stride = in.dk;
  d.v_stride = in.dv;
  d.g = in.g.data();
  d.beta = in.beta.data();
  d.dk = in.dk;
  d.dv = in.dv;
  return d;
}

// The equations, in double, with S as a plain dk×dv array.
std::vector<double> reference(const Inputs& in, std::vector<double>& S) {
  std::vector<double> o(static_cast<std::size_t>(in.n * in.dv));
  for (int t = 0; t < in.n; ++t) {
    const double decay = std::exp(static_cast<double>(in.g[static_cast<std::size_t>(t)]));
    for (auto& s : S) s *= decay;
    std::vector<double> u(static_cast<std::size_t>(in.dv));
    for (int b = 0; b < in.dv; ++b) {
      double kv = 0;
      for (int a = 0; a < in.dk; ++a) kv += S[static_cast<std::size_t>(a * in.dv + b)] * in.k[static_cast<std::size_t>(t * in.dk + a)];
      u[static_cast<std::size_t>(b)] = in.beta[static_cast<std::size_t>(t)] * (in.v[static_cast<std::size_t>(t * in.dv + b)] - kv);
    }
    for (int a = 0; a < in.dk; ++a)
      for (int b = 0; b < in.dv; ++b)
        S[static_cast<std::size_t>(a * in.dv + b)] += in.k[static_cast<std::size_t>(t * in.dk + a)] * u[static_cast<std::size_t>(b)];
    for (int b = 0; b < in.dv; ++b) {
      double acc = 0;
      for (int a = 0; a < in.dk; ++a) acc += S[static_cast<std::size_t>(a * in.dv + b)] * in.q[static_cast<std::size_t>(t * in.dk + a)];
      o[static_cast<std::size_t>(t * in.dv + b)] = acc;
    }
  }
  return o;
}

template <typename A, typename B>
double max_diff(const A& a, const B& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

}  // namespace

TEST_CASE("recurrent and chunked delta rule agree with the double-precision equations", "[delta_rule]") {
  for (const Target target : gdn::test::supported_targets()) {
  const auto& K = gdn::cpu::target_kernels(target);
  // Head sizes of every supported model (128), the fixtures', odd ones, and value heads far larger
  // than any shipped model (600, 1024): the kernels have no size limit of their own.
  for (const auto& [n, dk, dv] : {std::tuple{1, 16, 32}, std::tuple{63, 16, 24}, std::tuple{64, 32, 32},
                                  std::tuple{65, 16, 16}, std::tuple{200, 128, 128}, std::tuple{130, 64, 128},
                                  std::tuple{70, 32, 600}, std::tuple{3, 128, 1024}}) {
    const auto in = random_inputs(n, dk, dv, static_cast<unsigned>(n * 7 + dk));
    // Start from a non-zero state, as a continuing sequence would.
    std::vector<float> S0(static_cast<std::size_t>(dk * dv));
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    for (auto& s : S0) s = nd(rng);
    std::vector<double> Sref(S0.begin(), S0.end());
    const auto oref = reference(in, Sref);

    std::vector<float> Sr = S0, Sc = S0;
    std::vector<float> orec(static_cast<std::size_t>(n * dv)), ochk(orec.size());
    DeltaRuleScratch ws;
    ws.reserve(dk, dv);
    K.delta_rule_recurrent(view(in), n, Sr.data(), orec.data(), dv, ws);
    K.delta_rule_chunked(view(in), n, Sc.data(), ochk.data(), dv, ws);

    INFO("target " << K.name << " n=" << n << " dk=" << dk << " dv=" << dv);
    CHECK(max_diff(orec, oref) < 2e-5);
    CHECK(max_diff(ochk, oref) < 2e-5);
    CHECK(max_diff(Sr, Sref) < 2e-5);
    CHECK(max_diff(Sc, Sref) < 2e-5);
  }
  }
}

TEST_CASE("chunked delta rule in pieces equals one call (state carried between calls)", "[delta_rule]") {
  for (const Target target : gdn::test::supported_targets()) {
  const auto& K = gdn::cpu::target_kernels(target);
  INFO("target " << K.name);
  const int n = 150, dk = 32, dv = 48;
  const auto in = random_inputs(n, dk, dv, 99);
  std::vector<float> S1(static_cast<std::size_t>(dk * dv), 0.0f), S2 = S1;
  std::vector<float> o1(static_cast<std::size_t>(n * dv)), o2(o1.size());
  DeltaRuleScratch ws;
  ws.reserve(dk, dv);
  K.delta_rule_chunked(view(in), n, S1.data(), o1.data(), dv, ws);
  // 37 + 1 + 112 tokens: odd split points inside chunks, and a single-token recurrent piece.
  auto v = view(in);
  K.delta_rule_chunked(v, 37, S2.data(), o2.data(), dv, ws);
  auto shift = [&](DeltaRuleInput d, int by) {
    d.q += by * dk; d.k += by * dk; d.v += by * dv; d.g += by; d.beta += by;
    return d;
  };
  K.delta_rule_recurrent(shift(v, 37), 1, S2.data(), o2.data() + 37 * dv, dv, ws);
  K.delta_rule_chunked(shift(v, 38), n - 38, S2.data(), o2.data() + 38 * dv, dv, ws);
  CHECK(max_diff(o1, o2) < 1e-5);
  CHECK(max_diff(S1, S2) < 1e-5);
  }
}

TEST_CASE("causal conv with state equals the conv over the whole sequence", "[conv]") {
  for (const Target target : gdn::test::supported_targets()) {
  const auto& kernels = gdn::cpu::target_kernels(target);
  INFO("target " << kernels.name);
  const int K = 4, C = 5, n = 11;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> w(static_cast<std::size_t>(C * K)), x(static_cast<std::size_t>(n * C));
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  // Whole sequence at once from a zero state.
  std::vector<float> st(static_cast<std::size_t>((K - 1) * C), 0.0f), whole(x.size());
  kernels.causal_conv1d_silu(w.data(), K, C, x.data(), C, n, st.data(), whole.data(), C, 0, C);
  // Direct formula.
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < C; ++c) {
      float acc = 0;
      for (int j = 0; j < K; ++j) {
        const int src = t - (K - 1) + j;
        if (src >= 0) acc += w[static_cast<std::size_t>(j * C + c)] * x[static_cast<std::size_t>(src * C + c)];  // taps [K][C]
      }
      CHECK(whole[static_cast<std::size_t>(t * C + c)] == Approx(silu(acc)).margin(1e-6));
    }
  // In pieces of 1, 2 and the rest, carrying the state.
  std::vector<float> st2(st.size(), 0.0f), pieces(x.size());
  int t0 = 0;
  for (const int len : {1, 2, n - 3}) {
    kernels.causal_conv1d_silu(w.data(), K, C, x.data() + t0 * C, C, len, st2.data(), pieces.data() + t0 * C, C, 0, C);
    t0 += len;
  }
  CHECK(max_diff(whole, pieces) == 0.0);
  CHECK(max_diff(st, st2) == 0.0);
  }
}
