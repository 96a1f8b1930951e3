#pragma once
// Gated full attention of Qwen3.5/3.6 and Qwen3-Next. q_proj yields, per head, hd query values
// followed by hd gate values (split per head, not in halves of the whole projection). q and k get
// a zero-centred RMSNorm per head, then partial NeoX RoPE; GQA maps query head h to kv head
// h / (Hq/Hkv); softmax in float32 with scale 1/sqrt(hd); the output is multiplied by
// sigmoid(gate) before o_proj. Keys and values live in the paged KV cache.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "gdn/backend/cpu/exec.hpp"
#include "gdn/backend/cpu/vec_math.hpp"
#include "gdn/layers/activations.hpp"
#include "gdn/layers/rms_norm.hpp"
#include "gdn/layers/rope.hpp"
#include "gdn/model/config.hpp"
#include "gdn/state/kv_pages.hpp"

namespace gdn::layers {

struct AttentionBuffers {
  float* proj;  // [rows, ld_proj]: q_proj output (q|gate per head) | k | v
  std::int64_t ld_proj;
  float* q;     // [rows, Hq·hd]: normed, rotated queries
  float* core;  // [rows, Hq·hd]: gated attention output
  const float* cos;  // [rows, rotary/2]
  const float* sin;
};

class AttentionLayer {
 public:
  AttentionLayer(const ModelConfig& c, const AttentionWeights& w, const Rope& rope) : c_(c), w_(w), rope_(rope) {}

  // kv_layer: this layer's index among the KV pool's layers. page_tables[slot] lists a slot's pages.
  void forward(cpu::Exec& ex, std::span<const cpu::Segment> segs, const float* xn, std::int64_t ldx,
               std::int64_t rows, float* out, std::int64_t ldo, KvPagePool& kv, int kv_layer,
               std::span<const std::vector<std::int32_t>> page_tables, const AttentionBuffers& b) const {
    const int Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads, hd = c_.head_dim;
    const std::int64_t qg = 2LL * Hq * hd, kvd = static_cast<std::int64_t>(Hkv) * hd;
    ex.linear({{w_.q_proj, b.proj, b.ld_proj}, {w_.k_proj, b.proj + qg, b.ld_proj}, {w_.v_proj, b.proj + qg + kvd, b.ld_proj}},
              xn, ldx, rows);

    const int half = rope_.rotary_dim() / 2;
    const int ps = kv.page_size();
    // Norm + RoPE, then write this step's keys and values into the cache: one parallel region
    // over all rows (a batch of decodes is many one-row segments).
    ex.pool.parallel_for(rows, 4, [&](std::int64_t r0, std::int64_t r1, int) {
      // Segments are in row order; find the one holding r0, then walk on.
      auto seg = std::upper_bound(segs.begin(), segs.end(), r0, [](std::int64_t r, const cpu::Segment& sg) { return r < sg.row; }) - 1;
      for (std::int64_t row = r0; row < r1; ++row) {
        while (row >= seg->row + seg->n) ++seg;
        const auto& pages = page_tables[static_cast<std::size_t>(seg->slot)];
        const std::int64_t pos = seg->pos + (row - seg->row);
        const float* cs = b.cos + row * half;
        const float* sn = b.sin + row * half;
        const float* p = b.proj + row * b.ld_proj;
        float* q = b.q + row * Hq * hd;
        for (int h = 0; h < Hq; ++h) {
          rms_norm(p + 2LL * h * hd, w_.q_norm_scale.data(), q + h * hd, hd, c_.rms_norm_eps);
          rope_.apply(q + h * hd, cs, sn);
        }
        const std::int32_t page = pages[static_cast<std::size_t>(pos / ps)];
        const std::int64_t off = (pos % ps) * hd;
        for (int g = 0; g < Hkv; ++g) {
          float* k = kv.keys(page, kv_layer, g) + off;
          rms_norm(p + qg + g * hd, w_.k_norm_scale.data(), k, hd, c_.rms_norm_eps);
          rope_.apply(k, cs, sn);
          std::copy_n(p + qg + kvd + g * hd, hd, kv.values(page, kv_layer, g) + off);
        }
      }
    });

    // Attention, one task per (segment, kv head, block of up to 16 rows): the query heads of a kv
    // head share each block of keys and values while it sits in L2. Per query vector the softmax
    // is the online (running max) form over blocks of 64 positions at fixed absolute boundaries,
    // so a row's result is the same sequence of operations whatever the segment length or batch:
    // a prefill row, a decode row and a verification row agree bit for bit.
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const int group = Hq / Hkv;
    constexpr std::int64_t row_block = 16;
    std::int64_t tasks = 0;
    for (const auto& s : segs) tasks += Hkv * ((s.n + row_block - 1) / row_block);
    ex.pool.parallel_for(tasks, 1, [&](std::int64_t i0, std::int64_t i1, int thread) {
      float* scores = ex.threads[static_cast<std::size_t>(thread)].scores.data();
      for (std::int64_t i = i0; i < i1; ++i) {
        std::int64_t t = i;
        std::size_t si = 0;
        for (;; ++si) {
          const std::int64_t n = Hkv * ((segs[si].n + row_block - 1) / row_block);
          if (t < n) break;
          t -= n;
        }
        const auto& s = segs[si];
        const int g = static_cast<int>(t % Hkv);
        const std::int64_t r0 = (t / Hkv) * row_block, r1 = std::min(s.n, r0 + row_block);
        attend(kv, kv_layer, g, page_tables[static_cast<std::size_t>(s.slot)], s, r0, r1, group, scale, b, scores);
      }
    });
    ex.linear(w_.o_proj, b.core, static_cast<std::int64_t>(Hq) * hd, rows, out, ldo);
  }

 private:
  // Rows [r0, r1) of segment s, query heads g·group .. of kv head g. Writes gated outputs to b.core.
  // The query heads of a row are processed together (up to 4): each key and value row is loaded
  // once for them, and the outputs stay in registers over a block of positions. Per query vector
  // the operations do not depend on how many rows the task holds.
  void attend(const KvPagePool& kv, int kv_layer, int g, const std::vector<std::int32_t>& pages, const cpu::Segment& s,
              std::int64_t r0, std::int64_t r1, int group, float scale, const AttentionBuffers& b, float* scores) const {
    const int Hq = c_.num_attention_heads, hd = c_.head_dim;
    const int ps = kv.page_size();
    constexpr int pos_block = 64;
    const float* kp[pos_block];
    const float* vp[pos_block];
    const int nq = static_cast<int>((r1 - r0) * group);
    float mx[16 * 64], sum[16 * 64];  // row_block × group (group ≤ 64)
    float scb[4 * pos_block];         // scores of up to 4 heads over one block
    (void)scores;
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
          for (int j = 0; j < n; ++j) dot_heads(qv, G, kp[j], hd, scale, sc, j);
          float* p[4];
          for (int e = 0; e < G; ++e) {
            const int q = static_cast<int>(t - r0) * group + h0 + e;
            float bmax = -INFINITY;
            for (int j = 0; j < n; ++j) bmax = std::max(bmax, sc[e][j]);
            const float m_new = std::max(mx[q], bmax);
            const float bsum = cpu::vec::exp_shift_sum(sc[e], n, m_new);
            if (mx[q] == -INFINITY) {
              sum[q] = bsum;
            } else {
              const float corr = cpu::vec::exp1(mx[q] - m_new);
              sum[q] = sum[q] * corr + bsum;
              cpu::vec::scale(o[e], corr, hd);
            }
            mx[q] = m_new;
            p[e] = sc[e];
          }
          accumulate_values(o, G, p, vp, n, hd);
        }
      }
    }
    for (int q = 0; q < nq; ++q) {
      const std::int64_t row = s.row + r0 + q / group;
      const int h = g * group + q % group;
      float* o = b.core + row * Hq * hd + h * hd;
      cpu::vec::scale(o, 1.0f / sum[q], hd);
      cpu::vec::mul_sigmoid(o, b.proj + row * b.ld_proj + 2LL * h * hd + hd, hd);
    }
  }

  // sc[e][j] = scale · q[e]·k for G ≤ 4 query vectors against one key row.
  static void dot_heads(const float* const* q, int G, const float* k, int hd, float scale, float* const* sc, int j) {
#if defined(__AVX512F__)
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
    for (int e = 0; e < G; ++e) sc[e][j] = cpu::vec::dot(q[e], k, hd) * scale;
  }

  // o[e] += Σ_j p[e][j] · v_j, positions in order, for G ≤ 4 outputs.
  static void accumulate_values(float* const* o, int G, float* const* p, const float* const* v, int n, int hd) {
#if defined(__AVX512F__)
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
      for (int j = 0; j < n; ++j) cpu::vec::axpy(o[e], p[e][j], v[j], hd);
  }

  const ModelConfig& c_;
  const AttentionWeights& w_;
  const Rope& rope_;
};

}  // namespace gdn::layers
