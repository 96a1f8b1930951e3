#pragma once
// The CPU kernels as a plain C++ reference, with no vector paths: gdn::cpu::reference. For the
// CUDA kernel tests, which hold the device kernels to the CPU's arithmetic and also build without
// libgdn (cmake -S cuda). The engine itself runs the per-target copies (forward_impl.hpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "kernel_types.hpp"

#define GDN_CPU_TARGET reference
#include "target_begin.hpp"

namespace gdn::cpu::reference {

#include "kernels/vec_math.hpp"
#include "kernels/activations.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rope.hpp"
#include "kernels/conv.hpp"
#include "kernels/delta_rule.hpp"

}  // namespace gdn::cpu::reference

#include "target_end.hpp"
#undef GDN_CPU_TARGET
