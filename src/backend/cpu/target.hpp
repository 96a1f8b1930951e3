#pragma once
// The CPU targets the numerics are compiled for, and the one this process runs. Each target's
// entry points live in its own translation unit (forward_<target>.cpp, all from forward_impl.hpp);
// the choice follows the projection kernel's (linear.hpp: CPU features, lowered by
// GDN_CPU_KERNEL), so a process never mixes the vector paths of two targets.

#include <cstdint>

#include "../backend.hpp"
#include "kernel_types.hpp"
#include "kv_store.hpp"

namespace gdn::cpu {

struct CpuState;

// avx512bf16: the avx512 numerics, with the bf16 KV cache's attention on vdpbf16ps (its queries
// and softmax weights rounded to bf16 as well; kernels/attention.hpp).
enum class Target { scalar, avx2, avx512, avx512bf16 };

// What one target compiled: the backend's entry points, and its kernels for tests (which run the
// very code the engine runs, on every target the CPU supports).
struct TargetKernels {
  const char* name;
  void (*forward)(CpuState& s, const PassPlan& plan, const PassOutputs& out);
  void (*replay)(CpuState& s, int slot, std::int64_t keep);
  void (*delta_rule_recurrent)(const DeltaRuleInput& in, std::int64_t n, float* S, float* o, std::int64_t o_stride,
                               DeltaRuleScratch& ws);
  void (*delta_rule_chunked)(const DeltaRuleInput& in, std::int64_t n, float* S, float* o, std::int64_t o_stride,
                             DeltaRuleScratch& ws);
  void (*causal_conv1d_silu)(const float* w, int K, std::int64_t C, const float* in, std::int64_t ld_in, std::int64_t n,
                             float* state, float* out, std::int64_t ld_out, std::int64_t c0, std::int64_t c1);
  void (*rms_norm)(const float* x, const float* scale, float* y, std::int64_t n, float eps);
  void (*rms_norm_gated)(const float* x, const float* z, const float* w, float* y, std::int64_t n, float eps);
  // Gated causal attention of rows [r0, r1) of segment s for kv head g over the keys and values of
  // `pages` in `kv` (either dtype), all positions or one chunk of them (AttentionSplit); scratch:
  // attention_scratch_floats(group, hd) floats.
  void (*attention)(const KvStore& kv, int kv_layer, int g, const std::vector<std::int32_t>& pages, const PassSegment& s,
                    std::int64_t r0, std::int64_t r1, int Hq, int hd, int group, float scale, const AttentionRows& rows,
                    float* scratch, const AttentionSplit& split);
  // Row t of segment s, query head h, from the partial states its chunk tasks left in split.partials.
  void (*attention_merge)(DType kv_dtype, const PassSegment& s, std::int64_t t, int h, int Hq, int hd,
                          const AttentionRows& rows, const AttentionSplit& split);
};

// The target this process runs (from linear_kernel(): amx and avx512bf16 run avx512bf16).
Target current_target() noexcept;
// Whether this CPU can run t.
bool target_supported(Target t) noexcept;
const TargetKernels& target_kernels(Target t) noexcept;

extern const TargetKernels scalar_kernels;
extern const TargetKernels avx2_kernels;
extern const TargetKernels avx512_kernels;
extern const TargetKernels avx512bf16_kernels;

}  // namespace gdn::cpu
