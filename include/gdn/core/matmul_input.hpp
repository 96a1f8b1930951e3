#pragma once
// The precision activations enter the projections (the products with the weight matrices) at.

#include <cstdint>

namespace gdn {

// float32  exact: every projection is a float32 dot product of the float activations with the
//          weights (the default; what the golden tests hold to 2e-3 of transformers in float32).
// bf16     each activation is rounded to bf16 (to nearest even) before the product, as transformers
//          computes a bf16 checkpoint in bfloat16 and llama.cpp its bf16 weights; products stay
//          exact and sums float32. On AVX-512-BF16 CPUs (without AMX) the projections then run on
//          vdpbf16ps at twice the multiply-adds per cycle, which speeds up prefill and batched decode
//          (compute-bound); batch-1 decode is bound by the weight stream either way. Elsewhere the
//          rounding is applied and the float32 kernel runs: the same numbers, no speed-up.
//          Everything else (norms, attention, the recurrence, the state) stays float32.
enum class MatmulInput : std::uint8_t { float32, bf16 };

}  // namespace gdn
