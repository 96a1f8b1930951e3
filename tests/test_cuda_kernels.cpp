// CUDA kernels against the CPU implementation. Without a device every case skips with a visible
// message (CI has nvcc but no GPU); the device check script runs them for real.

#include <catch2/catch.hpp>

#include <cstdio>
#include <random>
#include <vector>

#include "gdn_cuda.hpp"
#include "gdn/layers/delta_rule.hpp"
#include "gdn/layers/gated_delta_net.hpp"

namespace {

bool have_device() {
  if (gdn::cuda::device_count() > 0) return true;
  static bool said = false;
  if (!said) {
    std::printf("SKIPPED: CUDA kernel tests need a GPU (%s)\n", gdn::cuda::unavailable_reason());
    said = true;
  }
  return false;
}

}  // namespace

TEST_CASE("CUDA delta-rule decode step equals the CPU recurrence", "[cuda]") {
  if (!have_device()) {
    WARN("SKIPPED: no CUDA device: " << gdn::cuda::unavailable_reason());
    return;
  }
  const int heads = 6, dk = 128, dv = 128;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> q(heads * dk), k(heads * dk), v(heads * dv), g(heads), beta(heads), S(heads * dk * dv);
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : S) x = 0.1f * nd(rng);
  for (int h = 0; h < heads; ++h) {
    gdn::layers::l2_normalize(q.data() + h * dk, dk, 1.0f / std::sqrt(static_cast<float>(dk)));
    gdn::layers::l2_normalize(k.data() + h * dk, dk, 1.0f);
    g[h] = -ud(rng);
    beta[h] = ud(rng);
  }
  std::vector<float> S_cpu = S, S_gpu = S, o_cpu(heads * dv), o_gpu(heads * dv);
  for (int h = 0; h < heads; ++h) {
    gdn::layers::DeltaRuleInput in;
    in.q = q.data() + h * dk;
    in.k = k.data() + h * dk;
    in.v = v.data() + h * dv;
    in.g = g.data() + h;
    in.beta = beta.data() + h;
    in.dk = dk;
    in.dv = dv;
    gdn::layers::delta_rule_recurrent(in, 1, S_cpu.data() + h * dk * dv, o_cpu.data() + h * dv, dv);
  }
  REQUIRE(gdn::cuda::delta_rule_decode_host(q.data(), k.data(), v.data(), g.data(), beta.data(), S_gpu.data(),
                                            o_gpu.data(), heads, dk, dv) == 0);
  float d = 0.0f;
  for (std::size_t i = 0; i < o_cpu.size(); ++i) d = std::max(d, std::fabs(o_cpu[i] - o_gpu[i]));
  for (std::size_t i = 0; i < S_cpu.size(); ++i) d = std::max(d, std::fabs(S_cpu[i] - S_gpu[i]));
  CHECK(d < 1e-5f);
}
