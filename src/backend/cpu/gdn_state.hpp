#pragma once
// The CPU backend's fixed-size state of the Gated DeltaNet layers, per sequence slot and GDN layer:
//  - conv state: the last kernel-1 raw (pre-conv) qkv inputs, [kernel-1][conv_dim], float32;
//  - recurrent state: Hv matrices of dk×dv (key-major, as transformers), float32 by default
//    (mamba_ssm_dtype); bf16 only when asked for, because writing the state back in bf16 every
//    step is a known cause of slow degeneration.
// Everything is allocated when the context is created. The recurrent state is the one large part
// (20 MB a sequence on the 0.8B shape, 150 MB on the 27B) and a decode step reads and writes all of
// it, so it lives in 2 MiB pages: with 4 KiB pages the delta rule's sweep, one 64 KiB matrix per
// head, took a TLB miss every 4 KiB and streamed about a fifth slower.

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gdn/core/dtype.hpp"
#include "gdn/model/config.hpp"

namespace gdn::cpu {

class GdnStatePool {
 public:
  GdnStatePool() = default;
  GdnStatePool(const ModelConfig& c, int slots, DType state_dtype);

  DType state_dtype() const noexcept { return state_dtype_; }
  std::int64_t conv_floats() const noexcept { return conv_floats_; }
  std::int64_t recurrent_elements() const noexcept { return recurrent_elems_; }
  // Bytes of GDN state one sequence owns (all GDN layers).
  std::int64_t bytes_per_sequence() const noexcept {
    return layers_ * (conv_floats_ * 4 + recurrent_elems_ * static_cast<std::int64_t>(dtype_size(state_dtype_)));
  }

  float* conv(int slot, int gdn_layer) noexcept {
    return conv_.data() + (static_cast<std::int64_t>(slot) * layers_ + gdn_layer) * conv_floats_;
  }
  // float* when state_dtype is f32, bf16* when bf16.
  std::byte* recurrent(int slot, int gdn_layer) noexcept {
    return recurrent_.get() + (static_cast<std::int64_t>(slot) * layers_ + gdn_layer) * recurrent_elems_ *
                                   static_cast<std::int64_t>(dtype_size(state_dtype_));
  }

  // Zeroes every GDN state of one slot: a reused slot is indistinguishable from a new one.
  void clear(int slot) noexcept;

 private:
  DType state_dtype_ = DType::f32;
  std::int64_t layers_ = 0, conv_floats_ = 0, recurrent_elems_ = 0;
  std::vector<float> conv_;
  std::unique_ptr<std::byte[]> recurrent_;
};

}  // namespace gdn::cpu
