#pragma once
// Private: the state behind gdn::Context, shared by context.cpp (the model graph and steps) and
// sequence_state.cpp (snapshots, forks, rollback, save/load).

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "gdn/backend/cpu/exec.hpp"
#include "gdn/core/error.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/layers/rope.hpp"
#include "gdn/runtime/context.hpp"
#include "gdn/state/gdn_state.hpp"
#include "gdn/state/gdn_step_log.hpp"
#include "gdn/state/kv_pages.hpp"

namespace gdn {

// Handles: slot (or snapshot) index in the low 32 bits, its generation in the high 32.
constexpr int handle_index(std::uint64_t id) { return static_cast<int>(id & 0xffffffffu); }
constexpr std::uint32_t handle_generation(std::uint64_t id) { return static_cast<std::uint32_t>(id >> 32); }
constexpr std::uint64_t make_handle(int index, std::uint32_t generation) {
  return (static_cast<std::uint64_t>(generation) << 32) | static_cast<std::uint32_t>(index);
}
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Context::Impl {
  struct Slot {
    bool live = false;
    std::uint32_t generation = 0;
    std::int64_t length = 0;      // positions consumed by the main model
    std::int64_t mtp_length = 0;  // positions consumed by the MTP layer
    // The last step, as far as rollback() can undo it: start position and token count.
    std::int64_t log_start = 0;
    std::int64_t log_tokens = 0;
  };
  struct Snapshot {
    bool live = false;
    std::uint32_t generation = 0;
    std::int64_t length = 0, mtp_length = 0;
    std::vector<float> conv;
    std::vector<std::byte> recurrent;
    std::vector<std::int32_t> pages;  // retained
  };
  // Where a wanted logits row comes from in the current ubatch.
  struct OutputRow {
    std::int64_t ubatch_row;
    std::int64_t out_row;
    bool logits;  // else only the hidden state
  };

  Impl(std::shared_ptr<const Model> m, const ContextParams& params);

  // --- sequences and handles
  Slot& slot_for(SeqId id, const char* what);
  const Slot& slot_for(SeqId id, const char* what) const { return const_cast<Impl*>(this)->slot_for(id, what); }
  int acquire_slot(const char* what);
  Snapshot& snapshot_for(SnapshotId id, const char* what);

  // --- KV pages
  // Positions a slot's page table must cover.
  std::int64_t covered_positions(const Slot& s) const { return std::max(s.length, s.mtp_length); }
  // Pages that make positions [begin, end) writable for slot s: new pages plus copies of shared ones.
  std::int64_t pages_needed(int s, std::int64_t begin, std::int64_t end) const;
  // Makes positions [begin, end) writable (after pages_needed() was checked against free pages).
  void prepare_pages(int s, std::int64_t begin, std::int64_t end);
  void release_pages_from(int s, std::int64_t first_page);
  void release_pages(int s) { release_pages_from(s, 0); }

  // --- steps
  void ensure_output_rows(std::int64_t rows);
  void set_output_flags(const Batch& batch);
  void validate(const Batch& batch, bool mtp);
  void step(const Batch& batch);
  void step_mtp(const Batch& batch, std::span<const float> hidden);
  void rollback(SeqId seq, std::int64_t keep);

  cpu::Exec exec() { return cpu::Exec{pool, thread_scratch, p.matmul_input}; }
  void norm_rows(const float* in, const std::vector<float>& scale, float* out, std::int64_t rows);
  void add_rows(float* acc, const float* d, std::int64_t rows);
  void rope_angles();
  void attention_and_mlp(cpu::Exec& ex, const DecoderLayerWeights& lw, int kv_layer, std::int64_t rows);
  void mlp(cpu::Exec& ex, const DecoderLayerWeights& lw, std::int64_t rows);
  template <typename StateT>
  void forward_layers(std::int64_t rows);
  void emit_outputs(const std::vector<float>& final_scale);
  template <typename Fill, typename Run>
  void for_each_ubatch(const Batch& batch, bool mtp, Fill&& fill, Run&& run);

  std::shared_ptr<const Model> model;
  const ModelConfig& c;
  const ModelWeights& w;
  ContextParams p;
  ThreadPool pool;
  std::vector<cpu::ThreadScratch> thread_scratch;
  GdnStatePool gdn_state;
  GdnStepLog step_log;
  KvPagePool kv;
  std::vector<Slot> slots;
  std::vector<std::vector<std::int32_t>> page_tables;  // per slot; capacity reserved up front
  std::vector<Snapshot> snapshots;
  std::vector<std::uint32_t> seen_stamp;  // duplicate detection in validate()
  std::uint32_t stamp = 0;
  layers::Rope rope;
  std::vector<int> gdn_index, kv_index;  // per layer: index among GDN layers / KV layers (-1 if n/a)
  int mtp_kv_layer = -1;

  // Work buffers for U = max_batch_tokens rows.
  std::int64_t U = 0, ld_proj = 0, ld_fused = 0, ld_aux = 0;
  std::vector<float> x, xn, mix, proj, fused, aux, gates, core, cos, sin;
  std::vector<cpu::Segment> segs;
  std::vector<OutputRow> outputs;
  std::vector<float> logits_buf, hidden_buf;
  std::vector<std::vector<float>> retired_outputs;  // outgrown output buffers, kept for stale views
  std::vector<bool> row_has_logits;
  std::int64_t output_rows = 0;
};

}  // namespace gdn
