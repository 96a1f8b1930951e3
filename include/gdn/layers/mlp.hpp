#pragma once
// SwiGLU MLP: down(silu(gate·x) ⊙ up·x). Dense in every layer of the models libgdn runs.

#include <cstdint>

#include "gdn/backend/cpu/exec.hpp"
#include "gdn/backend/cpu/vec_math.hpp"
#include "gdn/layers/activations.hpp"

namespace gdn::layers {

struct MlpBuffers {
  float* gate_up;  // [rows, 2I]: gate then up
  std::int64_t ld;
};

inline void mlp_forward(cpu::Exec& ex, const MlpWeights& w, const float* xn, std::int64_t ldx, std::int64_t rows,
                        float* out, std::int64_t ldo, const MlpBuffers& buf) {
  const std::int64_t I = w.gate_proj.out();
  ex.linear({{w.gate_proj, buf.gate_up, buf.ld}, {w.up_proj, buf.gate_up + I, buf.ld}}, xn, ldx, rows);
  ex.pool.parallel_for(rows, 1, [&](std::int64_t r0, std::int64_t r1, int) {
    for (std::int64_t r = r0; r < r1; ++r) {
      float* g = buf.gate_up + r * buf.ld;
      cpu::vec::silu_mul(g, g + I, I);
    }
  });
  ex.linear(w.down_proj, buf.gate_up, buf.ld, rows, out, ldo);
}

}  // namespace gdn::layers
