#pragma once
// Plain types and setup helpers of the CPU kernels (kernels/), compiled for the baseline: every
// target's kernels take them, and tests build them to call the kernels directly.

#include <cmath>
#include <cstdint>
#include <vector>

namespace gdn::cpu {

// One value head's inputs to the delta rule for n consecutive tokens. Row r of q is
// q + r·q_stride, and so on.
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

// Query rows per attention task (kernels/attention.hpp).
inline constexpr std::int64_t attention_row_block = 16;
// Positions per attention chunk: a row's online softmax restarts at every multiple of it and the
// chunks' partial states are folded in order, so a long row can be split across threads (one task
// per chunk, then attention_merge) with the same bits as one task.
inline constexpr std::int64_t attention_chunk = 2048;
// The chunks of a row of len ≥ 1 positions.
inline std::int64_t attention_chunks(std::int64_t len) { return (len - 1) / attention_chunk + 1; }
// A thread's scratch for one attention task: per query vector of up to attention_row_block rows,
// the running max and sum of the row and of the current chunk, the query in the kernel's form and
// the current chunk's output.
inline std::int64_t attention_scratch_floats(std::int64_t group, std::int64_t hd) {
  return attention_row_block * group * (4 + 2 * hd);
}

// Where the attention kernel (kernels/attention.hpp) reads queries and gates and writes outputs.
struct AttentionRows {
  const float* q;     // [rows][Hq·hd]: normed, rotated queries
  const float* gate;  // head h of row r at gate + r·ld_gate + 2h·hd + hd (q_proj's layout)
  std::int64_t ld_gate;
  float* core;        // [rows][Hq·hd]: gated attention output
};

// An attention task's share of its rows' positions: all of them (chunk < 0), or chunk `chunk`
// alone, whose partial softmax state per row and query head — [m, s, o[hd]] at
// partials + ((t·Hq + h)·chunks + c)·(hd + 2), t the row in the segment — attention_merge folds.
struct AttentionSplit {
  std::int64_t chunk = -1;
  float* partials = nullptr;
  std::int64_t chunks = 0;  // the partials' stride in chunks
  // Row t's, query head h's partial state of chunk c.
  float* partial(std::int64_t t, int h, int Hq, int hd, std::int64_t c) const {
    return partials + ((t * Hq + h) * chunks + c) * (hd + 2);
  }
};

// Working memory of the delta rule for one thread, sized once for the model's head dims; the
// kernels never allocate.
class DeltaRuleScratch {
 public:
  static constexpr int chunk = 64;
  void reserve(int dk, int dv) {
    const std::size_t c = chunk;
    gamma.resize(c);
    eg.resize(c);
    el.resize(c);
    A.resize(c * c);
    QK.resize(c * c);
    U.resize(c * static_cast<std::size_t>(dv));
    W.resize(c * static_cast<std::size_t>(dk));
    sk.resize(static_cast<std::size_t>(dv));
    sq.resize(static_cast<std::size_t>(dv));
    du.resize(static_cast<std::size_t>(dv));
  }
  std::vector<float> gamma, eg, el, A, QK, U, W;  // chunked form
  std::vector<float> sk, sq, du;                   // recurrent form: Sᵀk, Sᵀq, δ
};

// RoPE's inverse frequencies theta^(−2i/rotary_dim), i < rotary_dim/2, computed in double and
// rounded to float as transformers does.
inline std::vector<float> rope_inverse_frequencies(int rotary_dim, double theta) {
  std::vector<float> f(static_cast<std::size_t>(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i)
    f[static_cast<std::size_t>(i)] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / rotary_dim));
  return f;
}

}  // namespace gdn::cpu
