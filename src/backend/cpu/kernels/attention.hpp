// Causal softmax attention of one kv head's query heads over a sequence's paged keys and values
// (the core of gdn/layers/attention.hpp on the CPU). A fragment of a target region.
//
// One task is (segment, kv head, block of up to 16 rows), or (segment, kv head, chunk of 2048
// positions) for a long decode spread over idle threads: the query heads of a kv head share each
// block of keys and values while it sits in L2. Per query vector the softmax is the online
// (running max) form over blocks of 64 positions, restarted every 2048 (a chunk) and the chunks
// folded in order, all at fixed absolute boundaries, so a row's result is the same sequence of
// operations whatever the segment length, batch or split: a prefill row, a decode row and a
// verification row agree bit for bit.
//
// A bf16 cache on the avx512bf16 target takes its dot products on vdpbf16ps: the queries and the
// softmax weights are rounded to bf16 as well (as llama.cpp rounds its queries to the f16 of its
// cache), which halves the instructions per cached byte; the arithmetic, not the stream, bounded
// decode at long context. Sums stay float32.

#if !defined(GDN_CPU_TARGET_REGION)
#error "a fragment of a CPU target region: include it from forward_impl.hpp"
#endif

// KV elements as float32: exact for both store dtypes (a bf16 is the upper half of a float).
inline float kv_float(float v) { return v; }
inline float kv_float(bf16 v) { return to_float(v); }

// Σ a[i]·b[i] of a float query against a stored key, 16 lanes then in order (the generic path).
template <typename T>
inline float kv_dot(const float* a, const T* b, int n) {
  float lanes[16] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lanes[j] += a[i + j] * kv_float(b[i + j]);
  float total = 0.0f;
  for (int j = 0; j < 16; ++j) total += lanes[j];
  for (; i < n; ++i) total += a[i] * kv_float(b[i]);
  return total;
}

// Pulls bytes [b0, b1) of a stored row towards L2. A page holds kv_page_size positions of a head
// (16 by default): runs of a few KiB, too short for the hardware prefetcher to ramp up on before the stream jumps to the next
// page, so decode at long context waited on memory between pages. The next block's keys are
// prefetched as this block's keys are read, its values as this block's values are, a few lines
// per step of the loop: a burst of them fills the miss buffers and stalls the loads the FMAs need.
template <typename T>
inline void prefetch_row_bytes(const T* row, int b0, int b1) {
  const auto* c = reinterpret_cast<const char*>(row);
  for (int off = b0; off < b1; off += 64) __builtin_prefetch(c + off, 0, 2);
}

// Rows of the block after the one being computed, to prefetch while computing it (n = 0: none).
template <typename T>
struct KvPrefetch {
  const T* const* k;
  const T* const* v;
  int n;
};

// The vector path's order for a bf16 cache (kv_load32 below): per 32 elements, the 16 even ones,
// then the 16 odd. A task puts its query vectors in it before their dot products with bf16 keys,
// and its outputs accumulate bf16 values in it until they are put back, so every product pairs the
// same elements as in natural order and every sum runs in the same order.
template <typename T>
inline constexpr bool kv_pair_order = std::is_same_v<T, bf16>;

inline void to_pair_order(float* x, int n) {
  for (int c = 0; c + 32 <= n; c += 32) {
    float t[32];
    for (int i = 0; i < 16; ++i) {
      t[i] = x[c + 2 * i];
      t[16 + i] = x[c + 2 * i + 1];
    }
    std::copy_n(t, 32, x + c);
  }
}
inline void from_pair_order(float* x, int n) {
  for (int c = 0; c + 32 <= n; c += 32) {
    float t[32];
    for (int i = 0; i < 16; ++i) {
      t[2 * i] = x[c + i];
      t[2 * i + 1] = x[c + 16 + i];
    }
    std::copy_n(t, 32, x + c);
  }
}

#if GDN_CPU_AVX512
// The vector path reads stored rows 32 elements at a time as two float vectors. A float32 row's two
// halves load as they are; a bf16 row's even and odd elements (pair order) come out of one 64-byte
// load by a 16-bit shift and a mask, with no widening instruction: decode with a bf16 cache is
// otherwise bound by the conversions, not by memory.
inline void kv_load32(const float* p, __m512& a, __m512& b) {
  a = _mm512_loadu_ps(p);
  b = _mm512_loadu_ps(p + 16);
}
inline void kv_load32(const bf16* p, __m512& a, __m512& b) {
  const __m512i x = _mm512_loadu_si512(p);
  a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// The lane sums of 16 vectors in one vector: lane 4u + m holds the sum of v[4m + u]. A transpose
// tree (halves, quarters, pairs, singles), 45 operations instead of 16 horizontal reductions;
// each sum's additions depend only on its own vector's lanes.
inline __m512 reduce16(__m512* v) {
  for (int i = 0; i < 8; ++i)
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)
    v[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The 16 dot products of four key rows from j (acc[4e + r]: query e, row j + r), scaled, into
// sc[e][j + r] for the rows below n.
template <int G>
inline void store_scores(__m512* acc, __m512 vscale, int j, int n, float* const* sc) {
  alignas(64) float s[16];
  _mm512_store_ps(s, _mm512_mul_ps(reduce16(acc), vscale));
  const int m = std::min(4, n - j);
  for (int e = 0; e < G; ++e)
    for (int r = 0; r < m; ++r) sc[e][j + r] = s[4 * r + e];
}

// A value slice's G·U output vectors at dim c, rescaled by corr[e] (null: not), and back.
template <int G, int U>
inline void load_outputs(__m512 (&acc)[G][U], float* const* o, int c, const float* corr) {
  for (int e = 0; e < G; ++e)
    for (int u = 0; u < U; ++u) {
      acc[e][u] = _mm512_loadu_ps(o[e] + c + 16 * u);
      if (corr) acc[e][u] = _mm512_mul_ps(acc[e][u], _mm512_set1_ps(corr[e]));
    }
}
template <int G, int U>
inline void store_outputs(const __m512 (&acc)[G][U], float* const* o, int c) {
  for (int e = 0; e < G; ++e)
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(o[e] + c + 16 * u, acc[e][u]);
}

// sc[e][j] = scale · q[e]·k_j for G ≤ 4 query vectors against n key rows, four rows at a time:
// each key chunk is loaded once for the G queries and each query chunk once for the four rows,
// 4·G accumulators (one chain per dot product, chunk by chunk) then one reduce16. A group short
// of four rows repeats its last row and drops those sums. hd is a multiple of 32.
template <int G, typename T>
inline void attention_scores(const float* const* q, const T* const* k, int n, int hd, float scale, float* const* sc,
                             KvPrefetch<T> next) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int j = 0; j < n; j += 4) {
    for (int r = j; r < std::min(j + 4, next.n); ++r) prefetch_row_bytes(next.k[r], 0, hd * static_cast<int>(sizeof(T)));
    const T* kr[4];
    for (int r = 0; r < 4; ++r) kr[r] = k[std::min(j + r, n - 1)];
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 32) {
      __m512 qa[G], qb[G];
      for (int e = 0; e < G; ++e) {
        qa[e] = _mm512_loadu_ps(q[e] + i);
        qb[e] = _mm512_loadu_ps(q[e] + i + 16);
        // Held in registers for the four rows: left to itself GCC reloads them for every product,
        // and two loads per FMA make this loop load-bound at half the FMA rate.
        __asm__("" : "+v"(qa[e]), "+v"(qb[e]));
      }
      for (int r = 0; r < 4; ++r) {
        __m512 ka, kb;
        kv_load32(kr[r] + i, ka, kb);
        __asm__("" : "+v"(ka), "+v"(kb));  // likewise: one load per key chunk, not one per query
        for (int e = 0; e < G; ++e) acc[4 * e + r] = _mm512_fmadd_ps(qb[e], kb, _mm512_fmadd_ps(qa[e], ka, acc[4 * e + r]));
      }
    }
    store_scores<G>(acc, vscale, j, n, sc);
  }
}

// o[e] = corr[e]·o[e] + Σ_j p[e][j]·v_j for G ≤ 4 outputs (corr null: no rescaling), 16·U dims
// from c: the G·U output vectors stay in registers while all n value rows stream through, so
// outputs are loaded and stored once per block. Each element sums the positions in order. Every
// index is a constant, or the compiler keeps the accumulators in memory.
template <int G, int U, typename T>
inline void attention_values_slice(float* const* o, const float* const* p, const T* const* v, int n, int c, const float* corr,
                                   KvPrefetch<T> next) {
  __m512 acc[G][U];
  load_outputs(acc, o, c, corr);
  const float* pe[G];
  for (int e = 0; e < G; ++e) pe[e] = p[e];
  // This slice's bytes of the next block's value rows (the same columns: the same share of lines).
  const int pb0 = c * static_cast<int>(sizeof(T)), pb1 = (c + 16 * U) * static_cast<int>(sizeof(T));
  for (int j = 0; j < n; ++j) {
    if (j < next.n) prefetch_row_bytes(next.v[j], pb0, pb1);
    __m512 x[U];
    for (int u = 0; u < U; u += 2) kv_load32(v[j] + c + 16 * u, x[u], x[u + 1]);
    for (int e = 0; e < G; ++e) {
      const __m512 w = _mm512_set1_ps(pe[e][j]);
      for (int u = 0; u < U; ++u) acc[e][u] = _mm512_fmadd_ps(w, x[u], acc[e][u]);
    }
  }
  for (int j = n; j < next.n; ++j) prefetch_row_bytes(next.v[j], pb0, pb1);
  store_outputs(acc, o, c);
}

// All hd dims (a multiple of 32), 64 at a time: the block's value rows are in L2 after the first
// slice.
template <int G, typename T>
inline void attention_values(float* const* o, const float* const* p, const T* const* v, int n, int hd, const float* corr,
                             KvPrefetch<T> next) {
  int c = 0;
  for (; c + 64 <= hd; c += 64) attention_values_slice<G, 4>(o, p, v, n, c, corr, next);
  if (c < hd) attention_values_slice<G, 2>(o, p, v, n, c, corr, next);
}
#endif

#if GDN_CPU_AVX512BF16
// The bf16 dot-product path (vdpbf16ps: per float lane, acc += a[2i]·b[2i] + a[2i+1]·b[2i+1], the
// products exact). A task's copy of a query becomes bf16 in place: its hd bf16 occupy the bytes of
// its first hd/2 floats (element i's 64-byte group lands on floats i/2 .. i/2 + 15, which the
// groups up to i have already read).
inline __m512bh as_bf16x32(__m512i x) { return (__m512bh)x; }
inline __m512i as_si512(__m512bh x) { return (__m512i)x; }

inline void queries_to_bf16(float* q, int hd) {
  for (int i = 0; i < hd; i += 32) {
    const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + i + 16), _mm512_loadu_ps(q + i));
    _mm512_storeu_si512(reinterpret_cast<bf16*>(q) + i, as_si512(x));
  }
}

// sc[e][j] = scale · q[e]·k_j as attention_scores above, 32 elements of a bf16 query and key per
// instruction: four rows at a time, one accumulator chain per dot product, then one reduce16.
template <int G>
inline void attention_scores_bf16dot(const bf16* const* q, const bf16* const* k, int n, int hd, float scale, float* const* sc,
                                     KvPrefetch<bf16> next) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int j = 0; j < n; j += 4) {
    for (int r = j; r < std::min(j + 4, next.n); ++r) prefetch_row_bytes(next.k[r], 0, hd * 2);
    const bf16* kr[4];
    for (int r = 0; r < 4; ++r) kr[r] = k[std::min(j + r, n - 1)];
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 32) {
      __m512i qx[G];
      for (int e = 0; e < G; ++e) {
        qx[e] = _mm512_loadu_si512(q[e] + i);
        __asm__("" : "+v"(qx[e]));  // held in registers for the four rows, as above
      }
      for (int r = 0; r < 4; ++r) {
        __m512i kx = _mm512_loadu_si512(kr[r] + i);
        __asm__("" : "+v"(kx));
        for (int e = 0; e < G; ++e)
          acc[4 * e + r] = _mm512_dpbf16_ps(acc[4 * e + r], as_bf16x32(qx[e]), as_bf16x32(kx));
      }
    }
    store_scores<G>(acc, vscale, j, n, sc);
  }
}

// The weights of n positions (n ≤ 64) as bf16 pairs: pairs[i] holds p[2i] (low half) and p[2i+1],
// a zero weight after an odd n's last position.
inline void weight_pairs_bf16(const float* p, int n, std::uint32_t* pairs) {
  for (int j = 0; j < n; j += 32) {
    const __mmask16 lo = static_cast<__mmask16>(n - j >= 16 ? 0xFFFFu : (1u << (n - j)) - 1u);
    const __mmask16 hi = static_cast<__mmask16>(n - j >= 32 ? 0xFFFFu : n - j <= 16 ? 0u : (1u << (n - j - 16)) - 1u);
    const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, p + j + 16), _mm512_maskz_loadu_ps(lo, p + j));
    _mm512_storeu_si512(pairs + j / 2, as_si512(x));
  }
}

// o[e] = corr[e]·o[e] + Σ_j p[e][j]·v_j for 16·U dims from c (U = 2 or 4), two positions per
// instruction: the two value rows' chunks of 32 interleaved by unpacklo/unpackhi, each times the
// broadcast weight pair. Unpacking works within 128-bit lanes, so the outputs are kept in "unpack
// order" — per 32 dims, first the dims 8m..8m+3, then 8m+4..8m+7, m = 0..3 — until the task puts
// them back (from_unpack_order). A position pair past an odd n pairs the last row with itself at
// weight zero.
template <int G, int U>
inline void attention_values_slice_bf16dot(float* const* o, const std::uint32_t* const* w, const bf16* const* v, int n, int c,
                                           const float* corr, KvPrefetch<bf16> next) {
  __m512 acc[G][U];
  load_outputs(acc, o, c, corr);
  const int pb0 = c * 2, pb1 = (c + 16 * U) * 2;
  for (int j = 0; j < n; j += 2) {
    for (int r = j; r < std::min(j + 2, next.n); ++r) prefetch_row_bytes(next.v[r], pb0, pb1);
    const bf16* v0 = v[j] + c;
    const bf16* v1 = v[std::min(j + 1, n - 1)] + c;
    __m512i x[U];
    for (int u = 0; u < U; u += 2) {
      const __m512i a = _mm512_loadu_si512(v0 + 16 * u), b = _mm512_loadu_si512(v1 + 16 * u);
      x[u] = _mm512_unpacklo_epi16(a, b);
      x[u + 1] = _mm512_unpackhi_epi16(a, b);
    }
    for (int e = 0; e < G; ++e) {
      const __m512i wp = _mm512_set1_epi32(static_cast<int>(w[e][j / 2]));
      for (int u = 0; u < U; ++u)
        acc[e][u] = _mm512_dpbf16_ps(acc[e][u], as_bf16x32(wp), as_bf16x32(x[u]));
    }
  }
  for (int j = n + (n & 1); j < next.n; ++j) prefetch_row_bytes(next.v[j], pb0, pb1);
  store_outputs(acc, o, c);
}

template <int G>
inline void attention_values_bf16dot(float* const* o, const std::uint32_t* const* w, const bf16* const* v, int n, int hd,
                                     const float* corr, KvPrefetch<bf16> next) {
  int c = 0;
  for (; c + 64 <= hd; c += 64) attention_values_slice_bf16dot<G, 4>(o, w, v, n, c, corr, next);
  if (c < hd) attention_values_slice_bf16dot<G, 2>(o, w, v, n, c, corr, next);
}

inline void from_unpack_order(float* x, int n) {
  for (int c = 0; c + 32 <= n; c += 32) {
    float t[32];
    for (int k = 0; k < 16; ++k) {
      t[8 * (k / 4) + k % 4] = x[c + k];
      t[8 * (k / 4) + 4 + k % 4] = x[c + 16 + k];
    }
    std::copy_n(t, 32, x + c);
  }
}
#endif

#if GDN_CPU_AVX2
// The 8-lane path (AVX2; hd a multiple of 16): rows in natural order, a bf16 element widened by a
// zero extension and a 16-bit shift. Each key or value vector loaded serves the G query heads, so
// the widening is one instruction per G FMAs.
inline __m256 kv_load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 kv_load8(const bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// The lane sums of 8 vectors in one vector (lane i: the sum of v[i]): pairs, quads, then the two
// 128-bit halves; each sum's additions depend only on its own vector's lanes.
inline __m256 reduce8(const __m256* v) {
  const __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
}

// sc[e][j] = scale · q[e]·k_j for G ≤ 4 query vectors, two key rows at a time: 2·G accumulators
// (one chain per dot product, 8 dims a step: enough chains to keep both FMA units busy) and one
// reduce8. A pair short of a row repeats its last row and drops that sum.
template <int G, typename T>
inline void attention_scores8(const float* const* q, const T* const* k, int n, int hd, float scale, float* const* sc,
                              KvPrefetch<T> next) {
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int j = 0; j < n; j += 2) {
    for (int r = j; r < std::min(j + 2, next.n); ++r) prefetch_row_bytes(next.k[r], 0, hd * static_cast<int>(sizeof(T)));
    const T* k0 = k[j];
    const T* k1 = k[std::min(j + 1, n - 1)];
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
      const __m256 ka = kv_load8(k0 + i), kb = kv_load8(k1 + i);
      for (int e = 0; e < G; ++e) {
        const __m256 qe = _mm256_loadu_ps(q[e] + i);
        acc[2 * e] = _mm256_fmadd_ps(qe, ka, acc[2 * e]);
        acc[2 * e + 1] = _mm256_fmadd_ps(qe, kb, acc[2 * e + 1]);
      }
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, _mm256_mul_ps(reduce8(acc), vscale));
    for (int e = 0; e < G; ++e) {
      sc[e][j] = sums[2 * e];
      if (j + 1 < n) sc[e][j + 1] = sums[2 * e + 1];
    }
  }
}

// o[e] = corr[e]·o[e] + Σ_j p[e][j]·v_j (corr null: no rescaling), 16 dims at a time: the G·2
// output vectors stay in registers while the block's value rows stream through (from L2 after
// the first slice). Each element sums the positions in order.
template <int G, typename T>
inline void attention_values8(float* const* o, const float* const* p, const T* const* v, int n, int hd, const float* corr,
                              KvPrefetch<T> next) {
  for (int c = 0; c < hd; c += 16) {
    __m256 acc[G][2];
    for (int e = 0; e < G; ++e)
      for (int u = 0; u < 2; ++u) {
        acc[e][u] = _mm256_loadu_ps(o[e] + c + 8 * u);
        if (corr) acc[e][u] = _mm256_mul_ps(acc[e][u], _mm256_set1_ps(corr[e]));
      }
    const int pb0 = c * static_cast<int>(sizeof(T)), pb1 = (c + 16) * static_cast<int>(sizeof(T));
    for (int j = 0; j < n; ++j) {
      if (j < next.n) prefetch_row_bytes(next.v[j], pb0, pb1);
      const __m256 x0 = kv_load8(v[j] + c), x1 = kv_load8(v[j] + c + 8);
      for (int e = 0; e < G; ++e) {
        const __m256 w = _mm256_set1_ps(p[e][j]);
        acc[e][0] = _mm256_fmadd_ps(w, x0, acc[e][0]);
        acc[e][1] = _mm256_fmadd_ps(w, x1, acc[e][1]);
      }
    }
    for (int j = n; j < next.n; ++j) prefetch_row_bytes(next.v[j], pb0, pb1);
    for (int e = 0; e < G; ++e)
      for (int u = 0; u < 2; ++u) _mm256_storeu_ps(o[e] + c + 8 * u, acc[e][u]);
  }
}
#endif

// The generic path of both (any head_dim; other targets): the same quantities, per query vector.
template <int G, typename T>
inline void attention_scores_generic(const float* const* q, const T* const* k, int n, int hd, float scale, float* const* sc,
                                     KvPrefetch<T> next) {
  for (int j = 0; j < n; ++j) {
    if (j < next.n) prefetch_row_bytes(next.k[j], 0, hd * static_cast<int>(sizeof(T)));
    for (int e = 0; e < G; ++e) sc[e][j] = kv_dot(q[e], k[j], hd) * scale;
  }
}
template <int G, typename T>
inline void attention_values_generic(float* const* o, const float* const* p, const T* const* v, int n, int hd, const float* corr) {
  for (int e = 0; e < G; ++e) {
    if (corr) vec::scale(o[e], corr[e], hd);
    for (int j = 0; j < n; ++j) {
      const float a = p[e][j];
      for (int i = 0; i < hd; ++i) o[e][i] += a * kv_float(v[j][i]);
    }
  }
}

// The largest of n scores (n ≤ 64): one vector chain, not n dependent scalar steps.
inline float block_max(const float* x, int n) {
#if GDN_CPU_AVX512
  __m512 m = _mm512_set1_ps(-INFINITY);
  int j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
  if (j < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - j)) - 1u);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + j));
  }
  return _mm512_reduce_max_ps(m);
#else
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
#endif
}

// Which kernels a task runs: the AVX-512 ones (head_dim a multiple of 32; queries and outputs in
// pair order for a bf16 cache), the bf16 dot-product ones (a bf16 cache on the avx512bf16 target;
// queries in bf16, outputs in unpack order), the 8-lane AVX2 ones (head_dim a multiple of 16,
// natural order), or the generic ones (any head_dim; the scalar target).
enum class KvPath { generic, vector, bf16dot, vector8 };

template <typename T>
inline KvPath kv_path(int hd) {
  if (GDN_CPU_AVX512 && hd % 32 == 0) return GDN_CPU_AVX512BF16 && std::is_same_v<T, bf16> ? KvPath::bf16dot : KvPath::vector;
  if (GDN_CPU_AVX2 && hd % 16 == 0) return KvPath::vector8;
  return KvPath::generic;
}

// The query heads of one row against one block of positions, G at a time (G ≤ 4 a constant),
// prefetching `next` as the keys are read: scores, the online softmax's running max and sum, then
// the values weighted by the scores' exponentials.
template <int G, typename T>
inline void attention_heads(const float* const* qv, float* const* o, float* const* sc, const T* const* kp, const T* const* vp,
                            int n, int hd, float scale, float* mx, float* sum, KvPrefetch<T> next, KvPath path) {
#if GDN_CPU_AVX512BF16
  if constexpr (std::is_same_v<T, bf16>)
    if (path == KvPath::bf16dot) {
      const bf16* qb[4];
      for (int e = 0; e < G; ++e) qb[e] = reinterpret_cast<const bf16*>(qv[e]);
      attention_scores_bf16dot<G>(qb, kp, n, hd, scale, sc, next);
    }
#endif
#if GDN_CPU_AVX512
  if (path == KvPath::vector) attention_scores<G>(qv, kp, n, hd, scale, sc, next);
#endif
#if GDN_CPU_AVX2
  if (path == KvPath::vector8) attention_scores8<G>(qv, kp, n, hd, scale, sc, next);
#endif
  if (path == KvPath::generic) attention_scores_generic<G>(qv, kp, n, hd, scale, sc, next);
  for (int j = n; j < next.n; ++j) prefetch_row_bytes(next.k[j], 0, hd * static_cast<int>(sizeof(T)));
  float corr[4];
  bool rescale = false;
  for (int e = 0; e < G; ++e) {
    const float m_new = std::max(mx[e], block_max(sc[e], n));
    const float bsum = vec::exp_shift_sum(sc[e], n, m_new);
    if (mx[e] == -INFINITY) {  // the first block: the output is still zero
      corr[e] = 1.0f;
      sum[e] = bsum;
    } else {
      corr[e] = vec::exp1(mx[e] - m_new);
      sum[e] = sum[e] * corr[e] + bsum;
      rescale = true;
    }
    mx[e] = m_new;
  }
  const float* const* p = sc;
#if GDN_CPU_AVX512BF16
  if constexpr (std::is_same_v<T, bf16>)
    if (path == KvPath::bf16dot) {
      alignas(64) std::uint32_t pairs[4][32];  // 64 positions at most
      const std::uint32_t* w[4];
      for (int e = 0; e < G; ++e) {
        weight_pairs_bf16(p[e], n, pairs[e]);
        w[e] = pairs[e];
      }
      attention_values_bf16dot<G>(o, w, vp, n, hd, rescale ? corr : nullptr, next);
      return;
    }
#endif
#if GDN_CPU_AVX512
  if (path == KvPath::vector) {
    attention_values<G>(o, p, vp, n, hd, rescale ? corr : nullptr, next);
    return;
  }
#endif
#if GDN_CPU_AVX2
  if (path == KvPath::vector8) {
    attention_values8<G>(o, p, vp, n, hd, rescale ? corr : nullptr, next);
    return;
  }
#endif
  for (int j = 0; j < next.n; ++j) prefetch_row_bytes(next.v[j], 0, hd * static_cast<int>(sizeof(T)));
  attention_values_generic<G>(o, p, vp, n, hd, rescale ? corr : nullptr);
}

// A query vector's output in the path's order (pair or unpack order, or natural) put back in
// natural order, normalised by its softmax sum and gated.
inline void finish_output(float* o, float sum, const float* gate, int hd, KvPath path, bool pair_order) {
  if (pair_order) from_pair_order(o, hd);
#if GDN_CPU_AVX512BF16
  if (path == KvPath::bf16dot) from_unpack_order(o, hd);
#endif
  (void)path;
  vec::scale(o, 1.0f / sum, hd);
  vec::mul_sigmoid(o, gate, hd);
}

// Folds one chunk's partial softmax state (m, s, o) into the running one (M, S, O): the one
// merge both a whole task and attention_merge use, with explicit FMAs so that no compiler
// contraction can make the two differ.
inline void merge_chunk(float& M, float& S, float* O, float m, float s, const float* o, int hd) {
  const float Mn = std::max(M, m), a = vec::exp1(M - Mn), c = vec::exp1(m - Mn);
  for (int i = 0; i < hd; ++i) O[i] = std::fma(o[i], c, O[i] * a);
  S = std::fma(s, c, S * a);
  M = Mn;
}

// Rows [r0, r1) of segment s, query heads g·group .. g·group + group − 1 of kv head g. The query
// heads of a row are processed together (up to 4): each key and value row is loaded once for them,
// and the outputs stay in registers over a block of positions. Per query vector the operations do
// not depend on how many rows the task holds.
//
// Positions come in chunks of attention_chunk: the online softmax restarts at each chunk, and the
// chunks' partial states are folded in order by merge_chunk. A task takes either all its chunks
// (split.chunk < 0: chunk 0 accumulates in the output rows, each later one in scratch and is then
// folded in; the rows are finished) or one (split.chunk = c: its partial state per query vector
// goes to split.partials, for attention_merge). Either way a row's result is the same bits, so a
// long decode row can be spread over threads. `scratch`: attention_scratch_floats(group, hd)
// floats, the caller's per-thread memory.
template <typename T>
inline void attend(const KvStore& kv, int kv_layer, int g, const std::vector<std::int32_t>& pages, const PassSegment& s,
                   std::int64_t r0, std::int64_t r1, int Hq, int hd, int group, float scale, const AttentionRows& b,
                   float* scratch, const AttentionSplit& split) {
  const int ps = kv.page_size();
  constexpr int pos_block = 64;
  constexpr std::int64_t C = attention_chunk;
  static_assert(C % pos_block == 0);
  const T* kv_rows[2][2][pos_block];  // [this block, the next][keys, values]
  const int nq = static_cast<int>((r1 - r0) * group);
  // Scratch: the rows' running max and sum, the current chunk's, the queries in the path's form,
  // the current chunk's outputs.
  float* mx = scratch;
  float* sum = mx + nq;
  float* cmx = sum + nq;
  float* csum = cmx + nq;
  float* qs = csum + nq;
  float* co = qs + static_cast<std::ptrdiff_t>(nq) * hd;
  float scb[4 * pos_block];  // scores of up to 4 heads over one block
  const KvPath path = kv_path<T>(hd);
  const bool pair_order = path == KvPath::vector && kv_pair_order<T>;
  const auto row_of = [&](int q) { return s.row + r0 + q / group; };
  const auto head_of = [&](int q) { return g * group + q % group; };
  const auto out_of = [&](int q) { return b.core + row_of(q) * Hq * hd + head_of(q) * hd; };
  const auto len_of = [&](int q) { return s.pos + r0 + q / group + 1; };
  for (int q = 0; q < nq; ++q) {
    mx[q] = -INFINITY;
    sum[q] = 0.0f;
    float* qv = qs + static_cast<std::ptrdiff_t>(q) * hd;
    std::copy_n(b.q + row_of(q) * Hq * hd + head_of(q) * hd, hd, qv);
    if (pair_order) to_pair_order(qv, hd);
#if GDN_CPU_AVX512BF16
    if (path == KvPath::bf16dot) queries_to_bf16(qv, hd);
#endif
  }
  const std::int64_t max_len = s.pos + r1;
  const std::int64_t j_begin = split.chunk < 0 ? 0 : split.chunk * C;
  const std::int64_t j_end = split.chunk < 0 ? max_len : std::min(max_len, (split.chunk + 1) * C);
  const auto block_rows = [&](std::int64_t j0, const T** kr, const T** vr) {
    const int nb = static_cast<int>(std::clamp<std::int64_t>(j_end - j0, 0, pos_block));
    for (int j = 0; j < nb; ++j) {
      const std::int64_t pos = j0 + j;
      const std::int32_t page = pages[static_cast<std::size_t>(pos / ps)];
      kr[j] = kv.keys<T>(page, kv_layer, g) + (pos % ps) * hd;
      vr[j] = kv.values<T>(page, kv_layer, g) + (pos % ps) * hd;
    }
    return nb;
  };
  // Where the current chunk accumulates: chunk 0 of a whole task in the rows themselves.
  bool in_rows = false;
  const auto acc_of = [&](int q) { return in_rows ? out_of(q) : co + static_cast<std::ptrdiff_t>(q) * hd; };
  int nb_next = block_rows(j_begin, kv_rows[1][0], kv_rows[1][1]);
  for (std::int64_t j0 = j_begin, blk = 0; j0 < j_end; j0 += pos_block, ++blk) {
    const std::int64_t c = j0 / C;
    if (j0 % C == 0) {  // a chunk starts
      in_rows = split.chunk < 0 && c == 0;
      for (int q = 0; q < nq; ++q) {
        cmx[q] = -INFINITY;
        csum[q] = 0.0f;
        std::fill_n(acc_of(q), hd, 0.0f);
      }
    }
    float* amx = in_rows ? mx : cmx;
    float* asum = in_rows ? sum : csum;
    const T* const* kp = kv_rows[(blk + 1) % 2][0];
    const T* const* vp = kv_rows[(blk + 1) % 2][1];
    nb_next = block_rows(j0 + pos_block, kv_rows[blk % 2][0], kv_rows[blk % 2][1]);
    bool prefetched = false;  // the first row that reads this block prefetches the next
    for (std::int64_t t = r0; t < r1; ++t) {
      const std::int64_t len = s.pos + t + 1;
      if (len <= j0) continue;
      const int n = static_cast<int>(std::min<std::int64_t>(len - j0, pos_block));
      for (int h0 = 0; h0 < group; h0 += 4) {
        const int G = std::min(4, group - h0);
        const int q0 = static_cast<int>(t - r0) * group + h0;
        const float* qv[4];
        float* o[4];
        float* sc[4];
        for (int e = 0; e < G; ++e) {
          qv[e] = qs + static_cast<std::ptrdiff_t>(q0 + e) * hd;
          o[e] = acc_of(q0 + e);
          sc[e] = scb + e * pos_block;
        }
        const KvPrefetch<T> next{kv_rows[blk % 2][0], kv_rows[blk % 2][1], prefetched ? 0 : nb_next};
        prefetched = true;
        switch (G) {
          case 4: attention_heads<4>(qv, o, sc, kp, vp, n, hd, scale, amx + q0, asum + q0, next, path); break;
          case 3: attention_heads<3>(qv, o, sc, kp, vp, n, hd, scale, amx + q0, asum + q0, next, path); break;
          case 2: attention_heads<2>(qv, o, sc, kp, vp, n, hd, scale, amx + q0, asum + q0, next, path); break;
          default: attention_heads<1>(qv, o, sc, kp, vp, n, hd, scale, amx + q0, asum + q0, next, path); break;
        }
      }
    }
    if ((j0 + pos_block) % C != 0 && j0 + pos_block < j_end) continue;
    // A chunk ends: its partial states leave for attention_merge, or are folded in here.
    for (int q = 0; q < nq; ++q) {
      if (len_of(q) <= c * C) continue;  // the row ends before this chunk
      if (split.chunk >= 0) {
        float* p = split.partial(row_of(q) - s.row, head_of(q), Hq, hd, c);
        p[0] = cmx[q];
        p[1] = csum[q];
        std::copy_n(co + static_cast<std::ptrdiff_t>(q) * hd, hd, p + 2);
      } else if (!in_rows) {
        merge_chunk(mx[q], sum[q], out_of(q), cmx[q], csum[q], co + static_cast<std::ptrdiff_t>(q) * hd, hd);
      }
    }
  }
  if (split.chunk >= 0) return;
  for (int q = 0; q < nq; ++q)
    finish_output(out_of(q), sum[q], b.gate + row_of(q) * b.ld_gate + 2LL * head_of(q) * hd + hd, hd, path, pair_order);
}

// The kernel for the cache's dtype (TargetKernels::attention).
inline void attention(const KvStore& kv, int kv_layer, int g, const std::vector<std::int32_t>& pages, const PassSegment& s,
                      std::int64_t r0, std::int64_t r1, int Hq, int hd, int group, float scale, const AttentionRows& rows,
                      float* scratch, const AttentionSplit& split) {
  if (kv.dtype() == DType::bf16) attend<bf16>(kv, kv_layer, g, pages, s, r0, r1, Hq, hd, group, scale, rows, scratch, split);
  else attend<float>(kv, kv_layer, g, pages, s, r0, r1, Hq, hd, group, scale, rows, scratch, split);
}

// Row t of a segment whose tasks each took one chunk (split): query head h's partial states from
// split.partials folded in chunk order, as a whole task folds them, then finished
// (TargetKernels::attention_merge).
inline void attention_merge(DType kv_dtype, const PassSegment& s, std::int64_t t, int h, int Hq, int hd,
                            const AttentionRows& b, const AttentionSplit& split) {
  const KvPath path = kv_dtype == DType::bf16 ? kv_path<bf16>(hd) : kv_path<float>(hd);
  const bool pair_order = path == KvPath::vector && kv_dtype == DType::bf16;
  const std::int64_t chunks = attention_chunks(s.pos + t + 1);
  const float* p = split.partial(t, h, Hq, hd, 0);
  float* o = b.core + (s.row + t) * Hq * hd + h * hd;
  float M = p[0], S = p[1];
  std::copy_n(p + 2, hd, o);
  for (std::int64_t c = 1; c < chunks; ++c) {
    const float* pc = split.partial(t, h, Hq, hd, c);
    merge_chunk(M, S, o, pc[0], pc[1], pc + 2, hd);
  }
  finish_output(o, S, b.gate + (s.row + t) * b.ld_gate + 2LL * h * hd + hd, hd, path, pair_order);
}
