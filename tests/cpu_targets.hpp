#pragma once
// The CPU targets (backend/cpu/target.hpp) this machine can run, for the kernel tests that call
// each target's kernels directly.

#include <vector>

#include "backend/cpu/target.hpp"

namespace gdn::test {

inline std::vector<cpu::Target> supported_targets() {
  std::vector<cpu::Target> out;
  for (const cpu::Target t : {cpu::Target::scalar, cpu::Target::avx2, cpu::Target::avx512, cpu::Target::avx512bf16})
    if (cpu::target_supported(t)) out.push_back(t);
  return out;
}

}  // namespace gdn::test
