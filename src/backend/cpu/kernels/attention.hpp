// Causal softmax attention of one kv head's query heads over a sequence's paged keys and values
// (the core of gdn/layers/attention.hpp on the CPU). A fragment of a target region.
//
// One task is (segment, kv head, block of up to 16 rows): the query heads of a kv head share each
// block of keys and values while it sits in L2. Per query vector the softmax is the online
// (running max) form over blocks of 64 positions at fixed absolute boundaries, so a row's result
// is the same sequence of operations whatever the segment length or batch: a prefill row, a decode
// row and a verification row agree bit for bit.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

// Where attend() reads queries and gates and writes outputs.
struct AttentionRows {
  const float* q;       // [rows][Hq·hd]: normed, rotated queries
  const float* gate;    // head h of row r at gate + r·ld_gate + 2h·hd + hd (q_proj's layout)
  std::int64_t ld_gate;
  float* core;          // [rows][Hq·hd]: gated attention output
};

// sc[e][j] = scale · q[e]·k for G ≤ 4 query vectors against one key row.
inline void attention_dot_heads(const float* const* q, int G, const float* k, int hd, float scale, float* const* sc, int j) {
#if GDN_CPU_AVX512
  if (hd % 16 == 0) {
    __m512 acc[4][4];
    for (int e = 0; e < 4; ++e)
      for (int u = 0; u < 4; ++u) acc[e][u] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 16) {
      const __m512 kv = _mm512_loadu_ps(k + i);
      const int u = (i / 16) & 3;
      for (int e = 0; e < G; ++e) acc[e][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q[e] + i), kv, acc[e][u]);
    }
    for (int e = 0; e < G; ++e)
      sc[e][j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[e][0], acc[e][1]), _mm512_add_ps(acc[e][2], acc[e][3]))) * scale;
    return;
  }
#endif
  for (int e = 0; e < G; ++e) sc[e][j] = vec::dot(q[e], k, hd) * scale;
}

// o[e] += Σ_j p[e][j] · v_j, positions in order, for G ≤ 4 outputs.
inline void attention_accumulate_values(float* const* o, int G, float* const* p, const float* const* v, int n, int hd) {
#if GDN_CPU_AVX512
  if (hd % 16 == 0) {
    for (int c = 0; c < hd; c += 16) {
      __m512 acc[4];
      for (int e = 0; e < G; ++e) acc[e] = _mm512_loadu_ps(o[e] + c);
      for (int j = 0; j < n; ++j) {
        const __m512 vv = _mm512_loadu_ps(v[j] + c);
        for (int e = 0; e < G; ++e) acc[e] = _mm512_fmadd_ps(_mm512_set1_ps(p[e][j]), vv, acc[e]);
      }
      for (int e = 0; e < G; ++e) _mm512_storeu_ps(o[e] + c, acc[e]);
    }
    return;
  }
#endif
  for (int e = 0; e < G; ++e)
    for (int j = 0; j < n; ++j) vec::axpy(o[e], p[e][j], v[j], hd);
}

// Rows [r0, r1) of segment s, query heads g·group .. g·group + group − 1 of kv head g. The query
// heads of a row are processed together (up to 4): each key and value row is loaded once for them,
// and the outputs stay in registers over a block of positions. Per query vector the operations do
// not depend on how many rows the task holds. `stats` holds 2 · (r1 − r0) · group floats (the
// running max and sum of each query vector; the caller's per-thread scratch, sized for any group).
inline void attend(const KvStore& kv, int kv_layer, int g, const std::vector<std::int32_t>& pages, const PassSegment& s,
                   std::int64_t r0, std::int64_t r1, int Hq, int hd, int group, float scale, const AttentionRows& b,
                   float* stats) {
  const int ps = kv.page_size();
  constexpr int pos_block = 64;
  const float* kp[pos_block];
  const float* vp[pos_block];
  const int nq = static_cast<int>((r1 - r0) * group);
  float* mx = stats;
  float* sum = stats + nq;
  float scb[4 * pos_block];  // scores of up to 4 heads over one block
  for (int q = 0; q < nq; ++q) {
    mx[q] = -INFINITY;
    sum[q] = 0.0f;
    const std::int64_t row = s.row + r0 + q / group;
    float* o = b.core + row * Hq * hd + (g * group + q % group) * hd;
    std::fill(o, o + hd, 0.0f);
  }
  const std::int64_t max_len = s.pos + r1;
  for (std::int64_t j0 = 0; j0 < max_len; j0 += pos_block) {
    const int nb = static_cast<int>(std::min<std::int64_t>(pos_block, max_len - j0));
    for (int j = 0; j < nb; ++j) {
      const std::int64_t pos = j0 + j;
      const std::int32_t page = pages[static_cast<std::size_t>(pos / ps)];
      kp[j] = kv.keys(page, kv_layer, g) + (pos % ps) * hd;
      vp[j] = kv.values(page, kv_layer, g) + (pos % ps) * hd;
    }
    for (std::int64_t t = r0; t < r1; ++t) {
      const std::int64_t len = s.pos + t + 1;
      if (len <= j0) continue;
      const int n = static_cast<int>(std::min<std::int64_t>(len - j0, pos_block));
      const std::int64_t row = s.row + t;
      for (int h0 = 0; h0 < group; h0 += 4) {
        const int G = std::min(4, group - h0);
        const float* qv[4];
        float* o[4];
        float* sc[4];
        for (int e = 0; e < G; ++e) {
          const int h = g * group + h0 + e;
          qv[e] = b.q + row * Hq * hd + h * hd;
          o[e] = b.core + row * Hq * hd + h * hd;
          sc[e] = scb + e * pos_block;
        }
        for (int j = 0; j < n; ++j) attention_dot_heads(qv, G, kp[j], hd, scale, sc, j);
        float* p[4];
        for (int e = 0; e < G; ++e) {
          const int q = static_cast<int>(t - r0) * group + h0 + e;
          float bmax = -INFINITY;
          for (int j = 0; j < n; ++j) bmax = std::max(bmax, sc[e][j]);
          const float m_new = std::max(mx[q], bmax);
          const float bsum = vec::exp_shift_sum(sc[e], n, m_new);
          if (mx[q] == -INFINITY) {
            sum[q] = bsum;
          } else {
            const float corr = vec::exp1(mx[q] - m_new);
            sum[q] = sum[q] * corr + bsum;
            vec::scale(o[e], corr, hd);
          }
          mx[q] = m_new;
          p[e] = sc[e];
        }
        attention_accumulate_values(o, G, p, vp, n, hd);
      }
    }
  }
  for (int q = 0; q < nq; ++q) {
    const std::int64_t row = s.row + r0 + q / group;
    const int h = g * group + q % group;
    float* o = b.core + row * Hq * hd + h * hd;
    vec::scale(o, 1.0f / sum[q], hd);
    vec::mul_sigmoid(o, b.gate + row * b.ld_gate + 2LL * h * hd + hd, hd);
  }
}
