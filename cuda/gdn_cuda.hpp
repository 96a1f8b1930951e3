#pragma once
// Host-side entry points of the CUDA backend. Kernels take device pointers, explicit strides and
// a stream, and return cudaError_t as an int (so this header needs no CUDA include); the *_host
// helpers copy to and from the device and exist for tests and self-checks.

#include <cstdint>

namespace gdn::cuda {

// Number of usable CUDA devices (0 when there is no driver or no device).
int device_count() noexcept;
// Human-readable reason when device_count() is 0.
const char* unavailable_reason() noexcept;

// One decode token of the gated delta rule for `sequences × value_heads` heads, state in float32
// (key-major dk×dv per head, as the CPU backend keeps it). q/k are L2-normalised (q scaled),
// indexed per value head (the caller maps value head → key head). Updates state in place.
int delta_rule_decode(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
                      float* out, int heads, int dk, int dv, void* stream) noexcept;

// Same on host buffers; allocates device memory, copies, runs, copies back.
int delta_rule_decode_host(const float* q, const float* k, const float* v, const float* g, const float* beta,
                           float* state, float* out, int heads, int dk, int dv) noexcept;

}  // namespace gdn::cuda
