#pragma once
// Private: the engine behind gdn::Context, shared by context.cpp (validation, the step plan) and
// sequence_state.cpp (snapshots, forks, rollback, save/load). It never touches a number of the
// model: that is the backend's (src/backend/backend.hpp).

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/runtime/context.hpp"

#include "../backend/backend.hpp"
#include "page_allocator.hpp"

namespace gdn {

// Handles: slot (or snapshot) index in the low 32 bits, its generation in the high 32.
constexpr int handle_index(std::uint64_t id) { return static_cast<int>(id & 0xffffffffu); }
constexpr std::uint32_t handle_generation(std::uint64_t id) { return static_cast<std::uint32_t>(id >> 32); }
constexpr std::uint64_t make_handle(int index, std::uint32_t generation) {
  return (static_cast<std::uint64_t>(generation) << 32) | static_cast<std::uint32_t>(index);
}
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Test hooks that are not part of ContextParams (see make_context_for_tests in testing.hpp).
struct ContextHooks {
  bool tiled_value_heads = false;  // BackendParams::tiled_value_heads
  bool drop_conv_state = false;    // zero every GDN conv state of a step's sequences before it runs
};

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
    std::unique_ptr<StateCopy> state;  // held by the backend
    std::vector<std::int32_t> pages;   // retained
  };

  Impl(std::shared_ptr<const Model> m, const ContextParams& params, const ContextHooks& hooks);

  // --- sequences and handles
  Slot& slot_for(SeqId id, const char* what);
  const Slot& slot_for(SeqId id, const char* what) const { return const_cast<Impl*>(this)->slot_for(id, what); }
  int acquire_slot(const char* what);
  Snapshot& snapshot_for(SnapshotId id, const char* what);
  // Throws when an earlier failure left the backend's state half-written.
  void check_usable(const char* what) const;

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
  // Walks the batch in passes of at most max_batch_tokens rows and runs each through the backend.
  void run_passes(const Batch& batch, bool mtp, const float* hidden);
  // Runs fn() (a backend call); a failure that leaves the backend unusable poisons the context.
  template <typename F>
  void guarded(F&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      if (!backend->usable()) failure = e.what();
      throw;
    }
  }

  std::shared_ptr<const Model> model;
  const ModelConfig& c;
  ContextParams p;
  ContextHooks hooks;
  std::unique_ptr<BackendInterface> backend;
  std::string failure;  // set when the backend became unusable: every later call reports it
  PageAllocator pages;
  std::vector<Slot> slots;
  std::vector<std::vector<std::int32_t>> page_tables;  // per slot; capacity reserved up front
  std::vector<Snapshot> snapshots;
  std::vector<std::uint32_t> seen_stamp;  // duplicate detection in validate()
  std::uint32_t stamp = 0;

  // The plan of the current pass (capacity reserved up front: a step allocates nothing).
  std::vector<PassSegment> segs;
  std::vector<PassOutput> outputs;
  std::vector<float> logits_buf, hidden_buf;
  std::vector<std::vector<float>> retired_outputs;  // outgrown output buffers, kept for stale views
  std::vector<bool> row_has_logits;
  std::int64_t output_rows = 0;
};

}  // namespace gdn
