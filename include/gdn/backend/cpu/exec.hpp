#pragma once
// What a CPU layer needs to run: the thread pool, per-thread scratch, and the description of the
// rows it works on. A pass through the layers processes a "ubatch" of rows; each sequence in it
// owns a contiguous run of rows (a Segment) at consecutive positions.

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "gdn/backend/cpu/linear.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/layers/delta_rule.hpp"
#include "gdn/model/weights.hpp"

namespace gdn::cpu {

struct Segment {
  int slot = 0;             // sequence slot in the context
  std::int64_t row = 0;     // first row in the ubatch
  std::int64_t n = 0;       // rows (tokens)
  std::int64_t pos = 0;     // position of the first row
  bool record = false;      // keep what an exact rollback of this step needs (GdnStepLog)
};

struct ThreadScratch {
  layers::DeltaRuleScratch delta;
  std::vector<float> state;   // one head's recurrent state widened to float (bf16 state)
  std::vector<float> scores;  // attention scores over a sequence's positions
  LinearWorkspace linear;     // packed activations of a projection (used by the calling thread, index 0)
};

struct Exec {
  ThreadPool& pool;
  std::span<ThreadScratch> threads;
  MatmulInput matmul_input = MatmulInput::float32;

  void linear(const LinearWeight& w, const float* x, std::int64_t ldx, std::int64_t rows, float* y,
              std::int64_t ldy) {
    const LinearPart part{&w.w, y, ldy, w.image, w.image_layout};
    cpu::linear_multi(pool, threads[0].linear, std::span(&part, 1), x, ldx, rows, matmul_input);
  }

  // Projections of the same input in one pass over their weights (see linear_multi).
  struct Out {
    const LinearWeight& w;
    float* y;
    std::int64_t ldy;
  };
  void linear(std::initializer_list<Out> outs, const float* x, std::int64_t ldx, std::int64_t rows) {
    LinearPart parts[8];
    std::size_t n = 0;
    for (const auto& o : outs)
      if (!o.w.w.empty()) parts[n++] = LinearPart{&o.w.w, o.y, o.ldy, o.w.image, o.w.image_layout};
    cpu::linear_multi(pool, threads[0].linear, std::span<const LinearPart>(parts, n), x, ldx, rows, matmul_input);
  }
};

}  // namespace gdn::cpu
