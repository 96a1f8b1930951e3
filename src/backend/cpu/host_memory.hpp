#pragma once
// What the CPU backend allocates for a context, from the sizes alone: the figures of a memory plan
// (gdn/model/memory_plan.hpp), and the check that refuses, with a Status, a context the machine
// cannot hold (instead of the kernel's OOM killer ending the process while it zeroes the buffers).
// It mirrors the constructors of CpuState, GdnStatePool, GdnStepLog and KvStore; test_memory_plan
// compares it with what creating a context really allocates.

#include <cstdint>

#include "gdn/model/config.hpp"

#include "../backend.hpp"
#include "kernel_types.hpp"

namespace gdn::cpu {

struct HostMemory {
  std::int64_t conv_per_slot = 0;       // GDN conv history, float32, every GDN layer
  std::int64_t recurrent_per_slot = 0;  // GDN recurrent state in the state dtype, every GDN layer
  std::int64_t kv_bytes_per_token = 0;  // every attention layer and the MTP layer, float32 keys and values
  std::int64_t kv_bytes = 0;            // the whole page pool
  std::int64_t rollback_per_slot = 0;   // the step log (max_rollback_tokens > 0)
  std::int64_t scratch = 0;             // a pass's work buffers and every thread's scratch
  std::int64_t threads = 0;             // the pool's size the scratch was counted for

  std::int64_t total(std::int64_t slots) const noexcept {
    return slots * (conv_per_slot + recurrent_per_slot + rollback_per_slot) + kv_bytes + scratch;
  }
};

HostMemory host_memory(const ModelConfig& c, bool has_mtp, const BackendParams& p);

// The chunks (attention_chunk positions) of a row of up to max_context positions.
inline std::int64_t attention_max_chunks(const BackendParams& p) {
  return (static_cast<std::int64_t>(p.max_context) + attention_chunk - 1) / attention_chunk;
}
// Floats of CpuState::attention_partials for a pool of `threads`: the partial states of
// attention_row_block rows split by chunk (Hq heads, head_dim + 2 floats each). None where
// attention never splits: no KV pages, or no more threads than kv heads.
inline std::int64_t attention_partial_floats(const ModelConfig& c, const BackendParams& p, std::int64_t threads) {
  if (p.kv_pages <= 0 || c.num_key_value_heads <= 0 || threads <= c.num_key_value_heads) return 0;
  return attention_row_block * c.num_attention_heads * attention_max_chunks(p) * (c.head_dim + 2);
}

}  // namespace gdn::cpu
