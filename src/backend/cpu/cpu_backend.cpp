// The CPU backend: state storage in host memory, the weights in the CPU's prepared form, and the
// forward pass of the target this CPU runs (target.hpp). Rollback replays the logged step
// (gdn_step_log.hpp); snapshots are host copies.

#include <cstring>
#include <new>

#include <fmt/format.h>

#include "gdn/core/system_memory.hpp"

#include "../backend.hpp"
#include "host_memory.hpp"
#include "cpu_state.hpp"
#include "target.hpp"

namespace gdn {
namespace cpu {

Target current_target() noexcept {
  switch (linear_kernel()) {
    case LinearKernel::amx:
    case LinearKernel::avx512bf16: return Target::avx512bf16;
    case LinearKernel::avx512: return Target::avx512;
    case LinearKernel::avx2: return Target::avx2;
    default: return Target::scalar;
  }
}

bool target_supported(Target t) noexcept { return t <= current_target(); }

const TargetKernels& target_kernels(Target t) noexcept {
  switch (t) {
    case Target::avx512bf16: return avx512bf16_kernels;
    case Target::avx512: return avx512_kernels;
    case Target::avx2: return avx2_kernels;
    default: return scalar_kernels;
  }
}

CpuState::CpuState(const ModelConfig& config, const PreparedWeights& weights, const BackendParams& params)
    : c(config), w(weights), p(params), pool(params.threads) {
  gdn_state = GdnStatePool(c, p.slots, p.state_dtype);
  if (p.max_rollback_tokens > 0) step_log = GdnStepLog(c, p.slots, p.state_dtype, p.max_rollback_tokens);
  const int n_kv_layers = c.count_layers(LayerKind::full_attention) + (w.mtp ? 1 : 0);
  kv = KvStore(n_kv_layers > 0 ? p.kv_pages : 0, p.kv_page_size, n_kv_layers, c.num_key_value_heads, c.head_dim,
               p.kv_dtype);
  const int Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  key_head.resize(static_cast<std::size_t>(Hv));
  for (int h = 0; h < Hv; ++h) key_head[static_cast<std::size_t>(h)] = p.tiled_value_heads ? h % Hk : h / (Hv / Hk);
  inv_freq = rope_inverse_frequencies(c.rotary_dim, c.rope_theta);

  const std::int64_t H = c.hidden_size;
  const std::int64_t C = c.gdn_conv_dim(), Vd = c.gdn_value_dim();
  const std::int64_t qd = c.attn_q_dim(), kvd = c.attn_kv_dim(), I = c.intermediate_size;
  U = p.max_pass_rows;
  ld_proj = std::max({C + Vd + 2 * Hv, 2 * qd + 2 * kvd, 2 * I, 2 * H});
  ld_fused = c.gdn_layout == GdnProjectionLayout::fused_per_key_group ? 2 * c.gdn_key_dim() + 2 * Vd + 2 * Hv : 0;
  ld_aux = std::max(C, qd);
  x.assign(static_cast<std::size_t>(U * H), 0.0f);
  xn.assign(x.size(), 0.0f);
  mix.assign(x.size(), 0.0f);
  proj.assign(static_cast<std::size_t>(U * ld_proj), 0.0f);
  fused.assign(static_cast<std::size_t>(U * ld_fused), 0.0f);
  aux.assign(static_cast<std::size_t>(U * ld_aux), 0.0f);
  gates.assign(static_cast<std::size_t>(2 * Hv * U), 0.0f);
  core.assign(static_cast<std::size_t>(U * std::max(Vd, qd)), 0.0f);
  cos.assign(static_cast<std::size_t>(U * (c.rotary_dim / 2)), 0.0f);
  sin.assign(cos.size(), 0.0f);
  threads.resize(static_cast<std::size_t>(pool.size()));
  for (auto& t : threads) {
    t.delta.reserve(c.linear_key_head_dim, c.linear_value_head_dim);
    t.state.assign(static_cast<std::size_t>(c.linear_key_head_dim) * static_cast<std::size_t>(c.linear_value_head_dim), 0.0f);
    if (c.num_key_value_heads > 0)
      t.attention.assign(static_cast<std::size_t>(attention_scratch_floats(c.num_attention_heads / c.num_key_value_heads, c.head_dim)),
                         0.0f);
  }
  attention_partials.assign(static_cast<std::size_t>(attention_partial_floats(c, p, pool.size())), 0.0f);
  if (!attention_partials.empty()) attention_split.assign(static_cast<std::size_t>(p.slots), -1);
  attention_chunks = attention_max_chunks(p);
  // Packed activations for the widest projection input (the MTP fc reads 2H), so no step allocates.
  threads[0].linear.reserve(std::max<std::int64_t>(U, p.max_output_rows), std::max({2 * H, I, Vd, qd, C}), p.matmul_input);
}

namespace {

struct HostStateCopy final : StateCopy {
  std::vector<float> conv;
  std::vector<std::byte> recurrent;
};

class CpuBackend final : public BackendInterface {
 public:
  CpuBackend(std::shared_ptr<const Model> model, const BackendParams& params)
      : model_(std::move(model)),
        weights_(prepare_weights(*model_)),
        s_(model_->config(), *weights_, params),
        kernels_(target_kernels(current_target())) {
    const ModelConfig& c = model_->config();
    layout_.state_dtype = params.state_dtype;
    layout_.kv_dtype = params.kv_dtype;
    layout_.gdn_layers = c.count_layers(LayerKind::linear_attention);
    layout_.conv_floats = s_.gdn_state.conv_floats();
    layout_.recurrent_elements = s_.gdn_state.recurrent_elements();
    layout_.kv_layers = s_.kv.pages() > 0 ? c.count_layers(LayerKind::full_attention) + (model_->has_mtp() ? 1 : 0) : 0;
    layout_.kv_dim = c.attn_kv_dim();
    layout_.page_size = params.kv_page_size;
  }

  const char* name() const noexcept override { return "cpu"; }
  const StateLayout& layout() const noexcept override { return layout_; }

  void forward(const PassPlan& plan, const PassOutputs& out) override { kernels_.forward(s_, plan, out); }

  void clear_slot(int slot) override { s_.gdn_state.clear(slot); }

  void copy_slot(int from, int to) override {
    if (layout_.gdn_layers == 0) return;
    std::copy_n(s_.gdn_state.conv(from, 0), layout_.gdn_layers * layout_.conv_floats, s_.gdn_state.conv(to, 0));
    std::copy_n(s_.gdn_state.recurrent(from, 0), layout_.recurrent_bytes_per_slot(), s_.gdn_state.recurrent(to, 0));
  }

  void copy_kv_page(std::int32_t from, std::int32_t to) override { s_.kv.copy_page(from, to); }

  void rollback(int slot, std::int64_t keep) override { kernels_.replay(s_, slot, keep); }

  std::unique_ptr<StateCopy> save_slot(int slot) override {
    auto copy = std::make_unique<HostStateCopy>();
    copy->conv.resize(static_cast<std::size_t>(layout_.gdn_layers * layout_.conv_floats));
    copy->recurrent.resize(static_cast<std::size_t>(layout_.recurrent_bytes_per_slot()));
    read_slot(slot, copy->conv.data(), copy->recurrent.data());
    return copy;
  }

  void restore_slot(int slot, const StateCopy& copy) override {
    const auto& h = static_cast<const HostStateCopy&>(copy);
    write_slot(slot, h.conv.data(), h.recurrent.data());
  }

  void read_slot(int slot, float* conv, std::byte* recurrent) override {
    if (layout_.gdn_layers == 0) return;
    std::copy_n(s_.gdn_state.conv(slot, 0), layout_.gdn_layers * layout_.conv_floats, conv);
    std::copy_n(s_.gdn_state.recurrent(slot, 0), layout_.recurrent_bytes_per_slot(), recurrent);
  }

  void write_slot(int slot, const float* conv, const std::byte* recurrent) override {
    if (layout_.gdn_layers == 0) return;
    std::copy_n(conv, layout_.gdn_layers * layout_.conv_floats, s_.gdn_state.conv(slot, 0));
    std::copy_n(recurrent, layout_.recurrent_bytes_per_slot(), s_.gdn_state.recurrent(slot, 0));
  }

  void read_kv_page(std::int32_t page, float* out) override { s_.kv.read_page(page, out); }
  void write_kv_page(std::int32_t page, const float* in) override { s_.kv.write_page(page, in); }

  std::int64_t rollback_bytes_per_sequence() const noexcept override {
    return s_.step_log.enabled() ? s_.step_log.bytes_per_sequence() : 0;
  }
  std::int64_t kv_bytes_per_token() const noexcept override {
    return layout_.kv_layers * 2 * layout_.kv_dim * static_cast<std::int64_t>(dtype_size(layout_.kv_dtype));
  }

 private:
  std::shared_ptr<const Model> model_;
  std::shared_ptr<const PreparedWeights> weights_;
  CpuState s_;
  const TargetKernels& kernels_;
  StateLayout layout_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<BackendInterface> make_cpu_backend(std::shared_ptr<const Model> model, const BackendParams& params) {
  // Refused before anything is allocated when it cannot fit: zeroing the buffers of a context larger
  // than memory would get the process killed, not an error. The engine's output rows are counted too.
  const ModelConfig& c = model->config();
  const cpu::HostMemory need = cpu::host_memory(c, model->has_mtp(), params);
  const std::int64_t outputs = static_cast<std::int64_t>(params.max_output_rows) * (c.vocab_size + c.hidden_size) * 4;
  const std::int64_t total = need.total(params.slots) + outputs;
  if (const SystemMemory mem = system_memory(); total > mem.available)
    throw Error(Status::out_of_capacity,
                fmt::format("a CPU context of {} sequences x {} positions needs {} ({} GDN state, {} KV cache, {} rollback log, "
                            "{} work buffers, {} outputs) but {}; lower max_sequences, max_context, kv_pages or "
                            "max_batch_tokens (gdn info prints the plan)",
                            params.slots, params.max_context, format_bytes(total),
                            format_bytes(params.slots * (need.conv_per_slot + need.recurrent_per_slot)), format_bytes(need.kv_bytes),
                            format_bytes(params.slots * need.rollback_per_slot), format_bytes(need.scratch), format_bytes(outputs),
                            mem.describe()));
  try {
    return std::make_unique<cpu::CpuBackend>(std::move(model), params);
  } catch (const std::bad_alloc&) {
    throw Error(Status::out_of_capacity, "cannot allocate the CPU backend's state and work buffers: not enough memory");
  }
}

}  // namespace gdn
