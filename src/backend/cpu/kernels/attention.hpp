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

// KV elements as float32: exact for both store dtypes (a bf16 is the upper half of a float).
inline float kv_float(float v) { return v; }
inline float kv_float(bf16 v) { return to_float(v); }
#if GDN_CPU_AVX512
inline __m512 kv_load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 kv_load16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

// Σ a[i]·b[i] of a float query against a stored key, 16 lanes then in order (vec::dot's generic
// order, so a float32 store gives the same sums as before the store had a dtype).
template <typename T>
inline float kv_dot(const float* a, const T* b, int n) {
  if constexpr (std::is_same_v<T, float>) {
    return vec::dot(a, b, n);
  } else {
    float lanes[16] = {};
    int i = 0;
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; ++j) lanes[j] += a[i + j] * kv_float(b[i + j]);
    float total = 0.0f;
    for (int j = 0; j < 16; ++j) total += lanes[j];
    for (; i < n; ++i) total += a[i] * kv_float(b[i]);
    return total;
  }
}

// sc[e][j] = scale · q[e]·k for G query vectors against one key row. The accumulators are four
// 16-lane partial sums per query (chunk c of 16 goes to sum c mod 4), held in registers: G is a
// template argument so every index is a constant.
template <int G, typename T>
inline void attention_dot_heads(const float* const* q, const T* k, int hd, float scale, float* const* sc, int j) {
#if GDN_CPU_AVX512
  if (hd % 16 == 0) {
    __m512 acc[G][4];
    for (int e = 0; e < G; ++e)
      for (int u = 0; u < 4; ++u) acc[e][u] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= hd; i += 64)
      for (int u = 0; u < 4; ++u) {
        const __m512 kv = kv_load16(k + i + 16 * u);
        for (int e = 0; e < G; ++e) acc[e][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q[e] + i + 16 * u), kv, acc[e][u]);
      }
    for (int u = 0; u < 3; ++u, i += 16) {  // the last hd mod 64 dims, at most three chunks
      if (i >= hd) break;
      const __m512 kv = kv_load16(k + i);
      for (int e = 0; e < G; ++e) acc[e][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q[e] + i), kv, acc[e][u]);
    }
    for (int e = 0; e < G; ++e)
      sc[e][j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[e][0], acc[e][1]), _mm512_add_ps(acc[e][2], acc[e][3]))) * scale;
    return;
  }
#endif
  for (int e = 0; e < G; ++e) sc[e][j] = kv_dot(q[e], k, hd) * scale;
}

// o[e] += Σ_j p[e][j] · v_j for G outputs, each element summing positions in order. Value rows are
// read front to back, four at a time (the outputs go through L1 once per four rows, not once per
// row), so the stream from memory is sequential within a page.
template <int G, typename T>
inline void attention_accumulate_values(float* const* o, float* const* p, const T* const* v, int n, int hd) {
#if GDN_CPU_AVX512
  if (hd % 16 == 0) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      __m512 w[G][4];
      for (int e = 0; e < G; ++e)
        for (int r = 0; r < 4; ++r) w[e][r] = _mm512_set1_ps(p[e][j + r]);
      for (int c = 0; c < hd; c += 16) {
        __m512 acc[G];
        for (int e = 0; e < G; ++e) acc[e] = _mm512_loadu_ps(o[e] + c);
        for (int r = 0; r < 4; ++r) {
          const __m512 vv = kv_load16(v[j + r] + c);
          for (int e = 0; e < G; ++e) acc[e] = _mm512_fmadd_ps(w[e][r], vv, acc[e]);
        }
        for (int e = 0; e < G; ++e) _mm512_storeu_ps(o[e] + c, acc[e]);
      }
    }
    for (; j < n; ++j)
      for (int c = 0; c < hd; c += 16) {
        const __m512 vv = kv_load16(v[j] + c);
        for (int e = 0; e < G; ++e)
          _mm512_storeu_ps(o[e] + c, _mm512_fmadd_ps(_mm512_set1_ps(p[e][j]), vv, _mm512_loadu_ps(o[e] + c)));
      }
    return;
  }
#endif
  for (int e = 0; e < G; ++e)
    for (int j = 0; j < n; ++j) {
      const float a = p[e][j];
      for (int i = 0; i < hd; ++i) o[e][i] += a * kv_float(v[j][i]);
    }
}

// Pulls one key row and one value row towards L2. A page holds 16 positions of a head: runs of a
// few KiB, too short for the hardware prefetcher to ramp up on before the stream jumps to the next
// page, so decode at long context waited on memory between pages.
template <typename T>
inline void prefetch_kv_row(const T* k, const T* v, int hd) {
  const auto* kc = reinterpret_cast<const char*>(k);
  const auto* vc = reinterpret_cast<const char*>(v);
  const int bytes = hd * static_cast<int>(sizeof(T));
  for (int off = 0; off < bytes; off += 64) {
    __builtin_prefetch(kc + off, 0, 2);
    __builtin_prefetch(vc + off, 0, 2);
  }
}

// Rows of the block after the one being computed, to prefetch while computing it (n = 0: none).
template <typename T>
struct KvPrefetch {
  const T* const* k;
  const T* const* v;
  int n;
};

// The query heads of one row against one block of positions, G at a time (G ≤ 4 a constant),
// prefetching `next` as the keys are read.
template <int G, typename T>
inline void attention_heads(const float* const* qv, float* const* o, float* const* sc, const T* const* kp, const T* const* vp,
                            int n, int hd, float scale, float* mx, float* sum, KvPrefetch<T> next) {
  for (int j = 0; j < n; ++j) {
    if (j < next.n) prefetch_kv_row(next.k[j], next.v[j], hd);
    attention_dot_heads<G>(qv, kp[j], hd, scale, sc, j);
  }
  for (int j = n; j < next.n; ++j) prefetch_kv_row(next.k[j], next.v[j], hd);
  for (int e = 0; e < G; ++e) {
    float bmax = -INFINITY;
    for (int j = 0; j < n; ++j) bmax = std::max(bmax, sc[e][j]);
    const float m_new = std::max(mx[e], bmax);
    const float bsum = vec::exp_shift_sum(sc[e], n, m_new);
    if (mx[e] == -INFINITY) {
      sum[e] = bsum;
    } else {
      const float corr = vec::exp1(mx[e] - m_new);
      sum[e] = sum[e] * corr + bsum;
      vec::scale(o[e], corr, hd);
    }
    mx[e] = m_new;
  }
  attention_accumulate_values<G>(o, sc, vp, n, hd);
}

// Rows [r0, r1) of segment s, query heads g·group .. g·group + group − 1 of kv head g. The query
// heads of a row are processed together (up to 4): each key and value row is loaded once for them,
// and the outputs stay in registers over a block of positions. Per query vector the operations do
// not depend on how many rows the task holds. `stats` holds 2 · (r1 − r0) · group floats (the
// running max and sum of each query vector; the caller's per-thread scratch, sized for any group).
template <typename T>
inline void attend(const KvStore& kv, int kv_layer, int g, const std::vector<std::int32_t>& pages, const PassSegment& s,
                   std::int64_t r0, std::int64_t r1, int Hq, int hd, int group, float scale, const AttentionRows& b,
                   float* stats) {
  const int ps = kv.page_size();
  constexpr int pos_block = 64;
  const T* kv_rows[2][2][pos_block];  // [this block, the next][keys, values]
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
  const auto block_rows = [&](std::int64_t j0, const T** kr, const T** vr) {
    const int nb = static_cast<int>(std::clamp<std::int64_t>(max_len - j0, 0, pos_block));
    for (int j = 0; j < nb; ++j) {
      const std::int64_t pos = j0 + j;
      const std::int32_t page = pages[static_cast<std::size_t>(pos / ps)];
      kr[j] = kv.keys<T>(page, kv_layer, g) + (pos % ps) * hd;
      vr[j] = kv.values<T>(page, kv_layer, g) + (pos % ps) * hd;
    }
    return nb;
  };
  int nb_next = block_rows(0, kv_rows[1][0], kv_rows[1][1]);
  for (std::int64_t j0 = 0, blk = 0; j0 < max_len; j0 += pos_block, ++blk) {
    const T* const* kp = kv_rows[(blk + 1) % 2][0];
    const T* const* vp = kv_rows[(blk + 1) % 2][1];
    nb_next = block_rows(j0 + pos_block, kv_rows[blk % 2][0], kv_rows[blk % 2][1]);
    bool prefetched = false;  // the first row that reads this block prefetches the next
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
        const int q0 = static_cast<int>(t - r0) * group + h0;
        const KvPrefetch<T> next{kv_rows[blk % 2][0], kv_rows[blk % 2][1], prefetched ? 0 : nb_next};
        prefetched = true;
        switch (G) {
          case 4: attention_heads<4>(qv, o, sc, kp, vp, n, hd, scale, mx + q0, sum + q0, next); break;
          case 3: attention_heads<3>(qv, o, sc, kp, vp, n, hd, scale, mx + q0, sum + q0, next); break;
          case 2: attention_heads<2>(qv, o, sc, kp, vp, n, hd, scale, mx + q0, sum + q0, next); break;
          default: attention_heads<1>(qv, o, sc, kp, vp, n, hd, scale, mx + q0, sum + q0, next); break;
        }
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
