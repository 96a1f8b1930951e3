#include "host_memory.hpp"

#include <algorithm>
#include <thread>

#include "cpu_state.hpp"
#include "linear.hpp"

namespace gdn::cpu {

HostMemory host_memory(const ModelConfig& c, bool has_mtp, const BackendParams& p) {
  HostMemory m;
  const std::int64_t f = sizeof(float);
  const std::int64_t gdn_layers = c.count_layers(LayerKind::linear_attention);
  const std::int64_t C = c.gdn_conv_dim(), Vd = c.gdn_value_dim(), Hv = c.linear_num_value_heads;
  const std::int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const std::int64_t conv_floats = static_cast<std::int64_t>(c.linear_conv_kernel_dim - 1) * C;
  const std::int64_t rec = Hv * dk * dv * static_cast<std::int64_t>(dtype_size(p.state_dtype));
  m.conv_per_slot = gdn_layers * conv_floats * f;
  m.recurrent_per_slot = gdn_layers * rec;

  const std::int64_t kv_layers = c.count_layers(LayerKind::full_attention) + (has_mtp ? 1 : 0);
  if (kv_layers > 0 && p.kv_pages > 0) {
    m.kv_bytes_per_token = kv_layers * 2 * static_cast<std::int64_t>(c.attn_kv_dim()) * static_cast<std::int64_t>(dtype_size(p.kv_dtype));
    m.kv_bytes = p.kv_pages * p.kv_page_size * m.kv_bytes_per_token;
  }
  if (p.max_rollback_tokens > 0)
    m.rollback_per_slot = m.conv_per_slot + m.recurrent_per_slot + gdn_layers * p.max_rollback_tokens * (C + 2 * Hv) * f;

  // CpuState's work buffers for U rows.
  const std::int64_t U = p.max_pass_rows, H = c.hidden_size, I = c.intermediate_size;
  const std::int64_t qd = c.attn_q_dim(), kvd = c.attn_kv_dim();
  const std::int64_t ld_proj = std::max({C + Vd + 2 * Hv, 2 * qd + 2 * kvd, 2 * I, 2 * H});
  const std::int64_t ld_fused = c.gdn_layout == GdnProjectionLayout::fused_per_key_group ? 2 * c.gdn_key_dim() + 2 * Vd + 2 * Hv : 0;
  const std::int64_t ld_aux = std::max(C, qd);
  std::int64_t floats = 3 * U * H + U * ld_proj + U * ld_fused + U * ld_aux + 2 * Hv * U + U * std::max(Vd, qd) +
                        2 * U * (c.rotary_dim / 2);
  floats += Hv + c.rotary_dim / 2;  // key_head (int, the size of a float), inv_freq
  // Per thread: the delta rule's chunk buffers, a widened state, an attention task's scratch; then the
  // partial states of attention split by chunk, and each segment's offset in them (int64).
  constexpr std::int64_t chunk = DeltaRuleScratch::chunk;
  const std::int64_t per_thread = 3 * chunk + 2 * chunk * chunk + chunk * dv + chunk * dk + 3 * dv + dk * dv +
                                  (c.num_key_value_heads > 0
                                       ? attention_scratch_floats(c.num_attention_heads / c.num_key_value_heads, c.head_dim)
                                       : 0);
  m.threads = p.threads > 0 ? p.threads : std::max<std::int64_t>(1, std::thread::hardware_concurrency());
  const std::int64_t partials = attention_partial_floats(c, p, m.threads);
  floats += m.threads * per_thread + partials + (partials > 0 ? 2 * static_cast<std::int64_t>(p.slots) : 0);
  m.scratch = floats * f + static_cast<std::int64_t>(LinearWorkspace::reserve_bytes(
                               std::max<std::int64_t>(U, p.max_output_rows), std::max({2 * H, I, Vd, qd, C}), p.matmul_input));
  return m;
}

}  // namespace gdn::cpu
