// The gated delta rule, the recurrence at the heart of a Gated DeltaNet layer, for one value head.
// State S is dk×dv, key-major (S[a][b], a over key dims), float32, as in transformers.
//
// Per token t (q already L2-normalised and scaled by 1/sqrt(dk), k L2-normalised):
//   S ← exp(g_t)·S;  u = β_t·(v_t − Sᵀk_t);  S ← S + k_t·uᵀ;  o_t = Sᵀq_t
//
// delta_rule_recurrent() is that loop (fused into two sweeps over S per token): the decode path and
// the test oracle.
// delta_rule_chunked() is the WY/UT chunked form used for prefill (chunks of 64): within a chunk,
// with γ the cumulative log-decay and Γ_ij = exp(γ_i − γ_j),
//   T = I + strict_tril(diag(β)·K·Kᵀ ⊙ Γ),  U = T⁻¹(β ⊙ V),  W = T⁻¹(β ⊙ exp(γ) ⊙ K)
//   Vn = U − W·S,  O = (exp(γ) ⊙ Q)·S + (Q·Kᵀ ⊙ Γ ⊙ causal)·Vn,  S ← exp(γ_last)·S + (exp(γ_last − γ) ⊙ K)ᵀ·Vn
// T⁻¹ is applied by forward substitution (T is unit lower triangular). Both forms are exact
// rewrites of each other; tests hold them to float32 rounding.

// A fragment of a target region; DeltaRuleInput and DeltaRuleScratch are in cpu_state.hpp.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

inline void delta_rule_recurrent(const DeltaRuleInput& in, std::int64_t n, float* S, float* o, std::int64_t o_stride,
                                 DeltaRuleScratch& ws) {
  // Fused per head: one read-only sweep over S for Sᵀk and Sᵀq, then one read-modify-write sweep,
  // using S' = d·S + k·δᵀ with δ = β(v − d·Sᵀk), hence S'ᵀq = d·Sᵀq + (k·q)·δ.
  const int dk = in.dk, dv = in.dv;
  float* ks = ws.sk.data();  // [dv] each: sized by reserve(), any head size
  float* qs = ws.sq.data();
  float* delta = ws.du.data();
  for (std::int64_t t = 0; t < n; ++t) {
    const float* q = in.q + t * in.q_stride;
    const float* k = in.k + t * in.k_stride;
    const float* v = in.v + t * in.v_stride;
    const float decay = std::exp(in.g[t]);
    const float beta = in.beta[t];
    std::fill(ks, ks + dv, 0.0f);
    std::fill(qs, qs + dv, 0.0f);
    for (int a = 0; a < dk; ++a) {
      const float* row = S + static_cast<std::int64_t>(a) * dv;
      const float ka = k[a], qa = q[a];
      for (int b = 0; b < dv; ++b) {
        ks[b] += ka * row[b];
        qs[b] += qa * row[b];
      }
    }
    const float qk = vec::dot(q, k, dk);
    float* out = o + t * o_stride;
    for (int b = 0; b < dv; ++b) {
      delta[b] = beta * (v[b] - decay * ks[b]);
      out[b] = decay * qs[b] + qk * delta[b];
    }
    for (int a = 0; a < dk; ++a) {
      float* row = S + static_cast<std::int64_t>(a) * dv;
      const float ka = k[a];
      for (int b = 0; b < dv; ++b) row[b] = decay * row[b] + ka * delta[b];
    }
  }
}

// The chunk's matrix products run as small register-blocked GEMMs (vec::gemm_bcast); only the
// forward substitution is row by row.
inline void delta_rule_chunked(const DeltaRuleInput& in, std::int64_t n, float* S, float* o, std::int64_t o_stride,
                               DeltaRuleScratch& ws) {
  const int dk = in.dk, dv = in.dv;
  constexpr int C = DeltaRuleScratch::chunk;
  float* gamma = ws.gamma.data();
  float* eg = ws.eg.data();  // exp(γ_i)
  float* el = ws.el.data();  // exp(γ_last − γ_j)
  float* A = ws.A.data();
  float* QK = ws.QK.data();
  float* U = ws.U.data();  // becomes Vn in place
  float* W = ws.W.data();
  for (std::int64_t c0 = 0; c0 < n; c0 += C) {
    const int m = static_cast<int>(std::min<std::int64_t>(C, n - c0));
    const auto q = [&](int i) { return in.q + (c0 + i) * in.q_stride; };
    const auto k = [&](int i) { return in.k + (c0 + i) * in.k_stride; };
    const auto v = [&](int i) { return in.v + (c0 + i) * in.v_stride; };
    const float* g = in.g + c0;
    const float* beta = in.beta + c0;
    float* out0 = o + c0 * o_stride;

    float acc = 0.0f;
    for (int i = 0; i < m; ++i) gamma[i] = acc += g[i];
    for (int i = 0; i < m; ++i) {
      eg[i] = std::exp(gamma[i]);
      el[i] = std::exp(gamma[m - 1] - gamma[i]);
    }

    // Strictly lower A and causal Q·Kᵀ (diagonal included, zero above), both with the decay Γ.
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j <= i; ++j) {
        const float decay = std::exp(gamma[i] - gamma[j]);
        if (j < i) A[i * C + j] = beta[i] * vec::dot(k(i), k(j), dk) * decay;
        QK[i * C + j] = vec::dot(q(i), k(j), dk) * decay;
      }
      for (int j = i + 1; j < m; ++j) QK[i * C + j] = 0.0f;
    }
    // Forward substitution: U = T⁻¹(β ⊙ V), W = T⁻¹(β ⊙ exp(γ) ⊙ K), one row at a time.
    for (int i = 0; i < m; ++i) {
      float* u = U + static_cast<std::int64_t>(i) * dv;
      float* w = W + static_cast<std::int64_t>(i) * dk;
      const float bi = beta[i];
      const float bei = beta[i] * eg[i];
      for (int b = 0; b < dv; ++b) u[b] = bi * v(i)[b];
      for (int a = 0; a < dk; ++a) w[a] = bei * k(i)[a];
      const float* ai = A + i * C;
      vec::gemm_bcast(1, dv, i, [&](int, int j) { return -ai[j]; }, U, dv, u, dv, true);
      vec::gemm_bcast(1, dk, i, [&](int, int j) { return -ai[j]; }, W, dk, w, dk, true);
    }
    // Inter-chunk output (exp(γ) ⊙ Q)·S, then Vn = U − W·S in place.
    vec::gemm_bcast(m, dv, dk, [&](int i, int a) { return q(i)[a] * eg[i]; }, S, dv, out0, o_stride, false);
    vec::gemm_bcast(m, dv, dk, [&](int i, int a) { return -W[i * dk + a]; }, S, dv, U, dv, true);
    // Intra-chunk output: O += (Q·Kᵀ ⊙ Γ ⊙ causal)·Vn.
    vec::gemm_bcast(m, dv, m, [&](int i, int j) { return QK[i * C + j]; }, U, dv, out0, o_stride, true);
    // State update: S ← exp(γ_last)·S + (exp(γ_last − γ) ⊙ K)ᵀ·Vn.
    vec::gemm_bcast(dk, dv, m, [&](int a, int j) { return k(j)[a] * el[j]; }, U, dv, S, dv, true,
                         std::exp(gamma[m - 1]));
  }
}

