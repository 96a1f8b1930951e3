#pragma once
// What the CPU backend's exact rollback inside the last step needs, per sequence slot: the GDN state at the start
// of the step (conv and recurrent, one copy) and the step's small per-token inputs (raw pre-conv
// qkv, g and β) for up to max_tokens tokens. Rolling back to j tokens restores the start state and
// re-applies the j accepted tokens' conv and recurrence: the result is bit-identical to a step that
// only ever saw those j tokens, and costs no weight reads.
//
// Memory per slot: one GDN state (conv + recurrent) + max_tokens · (conv_dim + 2·Hv) floats per GDN
// layer, instead of one full state copy per drafted token.

#include <cstdint>
#include <vector>

#include "gdn/model/config.hpp"
#include "gdn_state.hpp"

namespace gdn::cpu {

class GdnStepLog {
 public:
  GdnStepLog() = default;
  GdnStepLog(const ModelConfig& c, int slots, DType state_dtype, int max_tokens)
      : start_(c, slots, state_dtype), max_tokens_(max_tokens) {
    layers_ = c.count_layers(LayerKind::linear_attention);
    conv_dim_ = c.gdn_conv_dim();
    heads_ = c.linear_num_value_heads;
    raw_.assign(static_cast<std::size_t>(slots * layers_ * max_tokens * conv_dim_), 0.0f);
    gates_.assign(static_cast<std::size_t>(slots * layers_ * 2 * heads_ * max_tokens), 0.0f);
  }

  int max_tokens() const noexcept { return max_tokens_; }
  bool enabled() const noexcept { return max_tokens_ > 0; }
  GdnStatePool& start() noexcept { return start_; }

  // [max_tokens][conv_dim] raw qkv inputs of the step.
  float* raw(int slot, int layer) noexcept {
    return raw_.data() + (static_cast<std::int64_t>(slot) * layers_ + layer) * max_tokens_ * conv_dim_;
  }
  // [2·Hv][max_tokens]: g then β, head-major like the layer's gate buffer.
  float* gates(int slot, int layer) noexcept {
    return gates_.data() + (static_cast<std::int64_t>(slot) * layers_ + layer) * 2 * heads_ * max_tokens_;
  }
  std::int64_t bytes_per_sequence() const noexcept {
    return start_.bytes_per_sequence() +
           static_cast<std::int64_t>(layers_) * max_tokens_ * (conv_dim_ + 2 * heads_) * static_cast<std::int64_t>(sizeof(float));
  }

 private:
  GdnStatePool start_;
  int max_tokens_ = 0;
  std::int64_t layers_ = 0, conv_dim_ = 0, heads_ = 0;
  std::vector<float> raw_, gates_;
};

}  // namespace gdn::cpu
