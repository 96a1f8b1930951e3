#pragma once
// The gated delta rule, the recurrence at the heart of a Gated DeltaNet layer, for one value head.
// State S is dk×dv, key-major (S[a][b], a over key dims), float32, as in transformers.
//
// Per token t (q already L2-normalised and scaled by 1/sqrt(dk), k L2-normalised):
//   S ← exp(g_t)·S;  u = β_t·(v_t − Sᵀk_t);  S ← S + k_t·uᵀ;  o_t = Sᵀq_t
//
// delta_rule_recurrent() is that loop, literally: the decode path and the test oracle.
// delta_rule_chunked() is the WY/UT chunked form used for prefill (chunks of 64): within a chunk,
// with γ the cumulative log-decay and Γ_ij = exp(γ_i − γ_j),
//   T = I + strict_tril(diag(β)·K·Kᵀ ⊙ Γ),  U = T⁻¹(β ⊙ V),  W = T⁻¹(β ⊙ exp(γ) ⊙ K)
//   Vn = U − W·S,  O = (exp(γ) ⊙ Q)·S + (Q·Kᵀ ⊙ Γ ⊙ causal)·Vn,  S ← exp(γ_last)·S + (exp(γ_last − γ) ⊙ K)ᵀ·Vn
// T⁻¹ is applied by forward substitution (T is unit lower triangular). Both forms are exact
// rewrites of each other; tests hold them to float32 rounding.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace gdn::layers {

// One head's inputs for n consecutive tokens. Row r of q is q + r*q_stride, and so on.
struct DeltaRuleInput {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  std::int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* g = nullptr;     // log-decay per token (≤ 0), contiguous
  const float* beta = nullptr;  // write strength per token, contiguous
  int dk = 0;
  int dv = 0;
};

inline void delta_rule_recurrent(const DeltaRuleInput& in, std::int64_t n, float* S, float* o, std::int64_t o_stride) {
  const int dk = in.dk, dv = in.dv;
  float kv[512];
  float delta[512];
  for (std::int64_t t = 0; t < n; ++t) {
    const float* q = in.q + t * in.q_stride;
    const float* k = in.k + t * in.k_stride;
    const float* v = in.v + t * in.v_stride;
    const float decay = std::exp(in.g[t]);
    const float beta = in.beta[t];
    std::fill(kv, kv + dv, 0.0f);
    for (int a = 0; a < dk; ++a) {
      float* row = S + static_cast<std::int64_t>(a) * dv;
      const float ka = k[a];
      for (int b = 0; b < dv; ++b) {
        row[b] *= decay;
        kv[b] += ka * row[b];
      }
    }
    for (int b = 0; b < dv; ++b) delta[b] = beta * (v[b] - kv[b]);
    float* out = o + t * o_stride;
    std::fill(out, out + dv, 0.0f);
    for (int a = 0; a < dk; ++a) {
      float* row = S + static_cast<std::int64_t>(a) * dv;
      const float ka = k[a];
      const float qa = q[a];
      for (int b = 0; b < dv; ++b) {
        row[b] += ka * delta[b];
        out[b] += qa * row[b];
      }
    }
  }
}

// Working memory for delta_rule_chunked, for one thread. Sized once; the kernel never allocates.
class DeltaRuleScratch {
 public:
  static constexpr int chunk = 64;
  void reserve(int dk, int dv) {
    const std::size_t c = chunk;
    gamma.resize(c);
    A.resize(c * c);
    QK.resize(c * c);
    U.resize(c * static_cast<std::size_t>(dv));
    W.resize(c * static_cast<std::size_t>(dk));
  }
  std::vector<float> gamma, A, QK, U, W;
};

inline void delta_rule_chunked(const DeltaRuleInput& in, std::int64_t n, float* S, float* o, std::int64_t o_stride,
                               DeltaRuleScratch& ws) {
  const int dk = in.dk, dv = in.dv;
  constexpr int C = DeltaRuleScratch::chunk;
  float* gamma = ws.gamma.data();
  float* A = ws.A.data();
  float* QK = ws.QK.data();
  float* U = ws.U.data();  // becomes Vn in place
  float* W = ws.W.data();
  const auto dot = [](const float* x, const float* y, int len) {
    float s = 0.0f;
    for (int i = 0; i < len; ++i) s += x[i] * y[i];
    return s;
  };
  for (std::int64_t c0 = 0; c0 < n; c0 += C) {
    const int m = static_cast<int>(std::min<std::int64_t>(C, n - c0));
    const auto q = [&](int i) { return in.q + (c0 + i) * in.q_stride; };
    const auto k = [&](int i) { return in.k + (c0 + i) * in.k_stride; };
    const auto v = [&](int i) { return in.v + (c0 + i) * in.v_stride; };
    const float* g = in.g + c0;
    const float* beta = in.beta + c0;

    float acc = 0.0f;
    for (int i = 0; i < m; ++i) gamma[i] = acc += g[i];

    // Strictly lower A and causal Q·Kᵀ (diagonal included), both with the decay Γ.
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j <= i; ++j) {
        const float decay = std::exp(gamma[i] - gamma[j]);
        if (j < i) A[i * C + j] = beta[i] * dot(k(i), k(j), dk) * decay;
        QK[i * C + j] = dot(q(i), k(j), dk) * decay;
      }
    }
    // Forward substitution: U = T⁻¹(β ⊙ V), W = T⁻¹(β ⊙ exp(γ) ⊙ K).
    for (int i = 0; i < m; ++i) {
      float* u = U + static_cast<std::int64_t>(i) * dv;
      float* w = W + static_cast<std::int64_t>(i) * dk;
      const float bi = beta[i];
      const float bei = beta[i] * std::exp(gamma[i]);
      for (int b = 0; b < dv; ++b) u[b] = bi * v(i)[b];
      for (int a = 0; a < dk; ++a) w[a] = bei * k(i)[a];
      for (int j = 0; j < i; ++j) {
        const float aij = A[i * C + j];
        const float* uj = U + static_cast<std::int64_t>(j) * dv;
        const float* wj = W + static_cast<std::int64_t>(j) * dk;
        for (int b = 0; b < dv; ++b) u[b] -= aij * uj[b];
        for (int a = 0; a < dk; ++a) w[a] -= aij * wj[a];
      }
    }
    // Vn = U − W·S (in place in U), and the inter-chunk output (exp(γ) ⊙ Q)·S.
    for (int i = 0; i < m; ++i) {
      float* u = U + static_cast<std::int64_t>(i) * dv;
      const float* w = W + static_cast<std::int64_t>(i) * dk;
      float* out = o + (c0 + i) * o_stride;
      const float eg = std::exp(gamma[i]);
      const float* qi = q(i);
      std::fill(out, out + dv, 0.0f);
      for (int a = 0; a < dk; ++a) {
        const float* row = S + static_cast<std::int64_t>(a) * dv;
        const float wa = w[a];
        const float qa = qi[a] * eg;
        for (int b = 0; b < dv; ++b) {
          u[b] -= wa * row[b];
          out[b] += qa * row[b];
        }
      }
    }
    // Intra-chunk output.
    for (int i = 0; i < m; ++i) {
      float* out = o + (c0 + i) * o_stride;
      for (int j = 0; j <= i; ++j) {
        const float s = QK[i * C + j];
        const float* vn = U + static_cast<std::int64_t>(j) * dv;
        for (int b = 0; b < dv; ++b) out[b] += s * vn[b];
      }
    }
    // State update.
    const float last = gamma[m - 1];
    const float chunk_decay = std::exp(last);
    for (int a = 0; a < dk; ++a) {
      float* row = S + static_cast<std::int64_t>(a) * dv;
      for (int b = 0; b < dv; ++b) row[b] *= chunk_decay;
    }
    for (int j = 0; j < m; ++j) {
      const float* kj = k(j);
      const float e = std::exp(last - gamma[j]);
      const float* vn = U + static_cast<std::int64_t>(j) * dv;
      for (int a = 0; a < dk; ++a) {
        float* row = S + static_cast<std::int64_t>(a) * dv;
        const float ka = kj[a] * e;
        for (int b = 0; b < dv; ++b) row[b] += ka * vn[b];
      }
    }
  }
}

}  // namespace gdn::layers
