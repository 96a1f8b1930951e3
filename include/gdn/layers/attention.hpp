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
    ex.linear(w_.q_proj, xn, ldx, rows, b.proj, b.ld_proj);
    ex.linear(w_.k_proj, xn, ldx, rows, b.proj + qg, b.ld_proj);
    ex.linear(w_.v_proj, xn, ldx, rows, b.proj + qg + kvd, b.ld_proj);

    const int half = rope_.rotary_dim() / 2;
    const int ps = kv.page_size();
    // Norm + RoPE, then write this step's keys and values into the cache.
    for (const auto& s : segs) {
      const auto& pages = page_tables[static_cast<std::size_t>(s.slot)];
      ex.pool.parallel_for(s.n, 4, [&](std::int64_t t0, std::int64_t t1, int) {
        for (std::int64_t t = t0; t < t1; ++t) {
          const std::int64_t row = s.row + t;
          const std::int64_t pos = s.pos + t;
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
    }

    // Attention per (row, query head) over positions [0, pos].
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const int group = Hq / Hkv;
    for (const auto& s : segs) {
      const auto& pages = page_tables[static_cast<std::size_t>(s.slot)];
      ex.pool.parallel_for(s.n * Hq, 1, [&](std::int64_t i0, std::int64_t i1, int thread) {
        float* scores = ex.threads[static_cast<std::size_t>(thread)].scores.data();
        for (std::int64_t i = i0; i < i1; ++i) {
          const std::int64_t t = i / Hq;
          const int h = static_cast<int>(i % Hq);
          const int g = h / group;
          const std::int64_t row = s.row + t;
          const std::int64_t len = s.pos + t + 1;
          const float* q = b.q + row * Hq * hd + h * hd;
          float mx = -INFINITY;
          for (std::int64_t j = 0; j < len; ++j) {
            const float* k = kv.keys(pages[static_cast<std::size_t>(j / ps)], kv_layer, g) + (j % ps) * hd;
            float d = 0.0f;
            for (int e = 0; e < hd; ++e) d += q[e] * k[e];
            scores[j] = d * scale;
            mx = std::max(mx, scores[j]);
          }
          float sum = 0.0f;
          for (std::int64_t j = 0; j < len; ++j) sum += scores[j] = std::exp(scores[j] - mx);
          const float inv = 1.0f / sum;
          float* o = b.core + row * Hq * hd + h * hd;
          std::fill(o, o + hd, 0.0f);
          for (std::int64_t j = 0; j < len; ++j) {
            const float* v = kv.values(pages[static_cast<std::size_t>(j / ps)], kv_layer, g) + (j % ps) * hd;
            const float pj = scores[j] * inv;
            for (int e = 0; e < hd; ++e) o[e] += pj * v[e];
          }
          const float* gate = b.proj + row * b.ld_proj + 2LL * h * hd + hd;
          for (int e = 0; e < hd; ++e) o[e] *= sigmoid(gate[e]);
        }
      });
    }
    ex.linear(w_.o_proj, b.core, static_cast<std::int64_t>(Hq) * hd, rows, out, ldo);
  }

 private:
  const ModelConfig& c_;
  const AttentionWeights& w_;
  const Rope& rope_;
};

}  // namespace gdn::layers
