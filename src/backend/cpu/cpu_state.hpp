#pragma once
// The CPU backend's data, as its per-target code (forward_impl.hpp) sees it: the types here are
// compiled for the baseline and shared by every target, so one CpuState serves whichever target the
// CPU runs. Everything is allocated when the context is created; a pass allocates nothing.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "gdn/core/error.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/model/config.hpp"

#include "../backend.hpp"
#include "gdn_state.hpp"
#include "gdn_step_log.hpp"
#include "kernel_types.hpp"
#include "kv_store.hpp"
#include "linear.hpp"
#include "prepared_weights.hpp"

namespace gdn::cpu {

struct ThreadScratch {
  DeltaRuleScratch delta;
  std::vector<float> state;   // one head's recurrent state widened to float (bf16 state)
  std::vector<float> attention;  // an attention task's scratch: attention_scratch_floats(Hq/Hkv, head_dim)
  LinearWorkspace linear;     // packed activations of a projection (used by the calling thread, index 0)
};

// The thread pool, per-thread scratch and matmul input mode a kernel runs with.
struct Exec {
  ThreadPool& pool;
  std::span<ThreadScratch> threads;
  MatmulInput matmul_input = MatmulInput::float32;

  void linear(const Linear& w, const float* x, std::int64_t ldx, std::int64_t rows, float* y, std::int64_t ldy) {
    const LinearPart part{w.w, y, ldy, w.image, w.layout};
    linear_multi(pool, threads[0].linear, std::span(&part, 1), x, ldx, rows, matmul_input);
  }

  // Projections of the same input in one pass over their weights (see linear_multi).
  struct Out {
    const Linear& w;
    float* y;
    std::int64_t ldy;
  };
  void linear(std::initializer_list<Out> outs, const float* x, std::int64_t ldx, std::int64_t rows) {
    constexpr std::size_t max_parts = 8;
    if (outs.size() > max_parts) throw Error(Status::internal, "Exec::linear: more than 8 fused projections");
    LinearPart parts[max_parts];
    std::size_t n = 0;
    for (const auto& o : outs)
      if (!o.w.empty()) parts[n++] = LinearPart{o.w.w, o.y, o.ldy, o.w.image, o.w.layout};
    linear_multi(pool, threads[0].linear, std::span<const LinearPart>(parts, n), x, ldx, rows, matmul_input);
  }
};

// The mutable state and work buffers of one CPU backend.
struct CpuState {
  CpuState(const ModelConfig& config, const PreparedWeights& weights, const BackendParams& params);

  const ModelConfig& c;
  const PreparedWeights& w;
  BackendParams p;
  ThreadPool pool;
  std::vector<ThreadScratch> threads;
  GdnStatePool gdn_state;
  GdnStepLog step_log;
  KvStore kv;
  std::vector<int> key_head;    // per value head: the key head it reads (h / (Hv/Hk))
  std::vector<float> inv_freq;  // RoPE: theta^(−2i/rotary_dim)

  // Work buffers for U = max_pass_rows rows.
  std::int64_t U = 0, ld_proj = 0, ld_fused = 0, ld_aux = 0;
  std::vector<float> x, xn, mix, proj, fused, aux, gates, core, cos, sin;

  // Attention spread over threads by chunk (kernels/kernel_set.hpp, attn_core): the partial states
  // of up to attention_row_block split rows, each pass segment's offset in them (−1: not split),
  // and the chunks a row may have. Empty where attention never splits (host_memory.hpp).
  std::vector<float> attention_partials;
  std::vector<std::int64_t> attention_split;
  std::int64_t attention_chunks = 0;

  Exec exec() { return Exec{pool, threads, p.matmul_input}; }
};

}  // namespace gdn::cpu
