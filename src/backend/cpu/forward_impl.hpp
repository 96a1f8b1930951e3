// One CPU target's numerics: the kernel fragments of kernels/ in the namespace gdn::cpu::<target>,
// compiled for that target (target_begin.hpp says how and why), and its TargetKernels. Included by
// forward_<target>.cpp after defining GDN_CPU_TARGET; never by anything else.

// Everything the fragments use, before the target region opens.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "gdn/core/dtype.hpp"
#include "gdn/layers/decoder.hpp"
#include "gdn/model/config.hpp"

#include "cpu_state.hpp"
#include "target.hpp"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "target_begin.hpp"

namespace gdn::cpu::GDN_CPU_TARGET {

#include "kernels/vec_math.hpp"
#include "kernels/activations.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rope.hpp"
#include "kernels/conv.hpp"
#include "kernels/delta_rule.hpp"
#include "kernels/gdn.hpp"
#include "kernels/attention.hpp"
#include "kernels/kernel_set.hpp"

void forward(CpuState& s, const PassPlan& plan, const PassOutputs& out) {
  Kernels k(s, plan, out);
  if (plan.mtp) layers::Decoder<Kernels>::forward_mtp(k, s.w, s.c);
  else layers::Decoder<Kernels>::forward(k, s.w, s.c);
}

void replay(CpuState& s, int slot, std::int64_t keep) { replay_gdn(s, slot, keep); }

}  // namespace gdn::cpu::GDN_CPU_TARGET

#include "target_end.hpp"

namespace gdn::cpu {

const TargetKernels GDN_CPU_CAT(GDN_CPU_TARGET, _kernels){
    GDN_CPU_STR(GDN_CPU_TARGET),
    &GDN_CPU_TARGET::forward,
    &GDN_CPU_TARGET::replay,
    &GDN_CPU_TARGET::delta_rule_recurrent,
    &GDN_CPU_TARGET::delta_rule_chunked,
    &GDN_CPU_TARGET::causal_conv1d_silu,
    &GDN_CPU_TARGET::rms_norm,
    &GDN_CPU_TARGET::rms_norm_gated,
    &GDN_CPU_TARGET::attention,
    &GDN_CPU_TARGET::attention_merge,
};

}  // namespace gdn::cpu
