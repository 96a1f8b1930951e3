#pragma once
// A Context owns the mutable state for up to max_sequences sequences of one Model: per sequence and
// GDN layer a conv state and a recurrent state, a paged KV cache for the attention layers (and the
// MTP layer), plus all scratch memory of a step, on the backend it was created for (host memory
// for the CPU, device memory for CUDA). Everything is allocated when the context is created; a
// decode step allocates nothing. A Context is used by one thread at a time; several contexts may
// share one Model.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "gdn/core/dtype.hpp"
#include "gdn/core/matmul_input.hpp"
#include "gdn/model/model.hpp"
#include "gdn/runtime/batch.hpp"

namespace gdn {

struct ContextParams {
  int max_sequences = 4;         // sequence slots
  int max_context = 4096;        // positions per sequence
  int kv_page_size = 64;         // positions per KV page: long runs of a sequence's keys (values) in
                                 // memory, which long-context decode streams (docs/performance.md)
  std::int64_t kv_pages = 0;     // 0: enough for every slot to reach max_context
  int max_batch_tokens = 256;    // rows per pass through the layers; larger steps are split
  int max_logits_rows = 0;       // 0: max(max_sequences, 64); grows (allocates) only when exceeded, keeping
                                 // the outgrown buffer so late readers see stale values, not freed memory
  std::optional<DType> state_dtype;  // recurrent state dtype; default: the config's mamba_ssm_dtype (float32)
  std::optional<DType> kv_dtype;     // KV cache element type, F32 or BF16 (keys and values rounded to nearest even
                                     // when written: half the bytes a long-context decode streams; see
                                     // docs/performance.md). Default: the backend's own, F32 on the CPU (exact), BF16
                                     // on CUDA (its only one)
  MatmulInput matmul_input = MatmulInput::float32;  // activations into the projections: exact float32, or
                                                    // rounded to bf16 (faster prefill / batched decode; see
                                                    // gdn/core/matmul_input.hpp)
  int threads = 0;               // 0: one per hardware thread
  int gdn_chunk_min_tokens = 16; // a sequence advancing by at least this many tokens takes chunked GDN
  int max_rollback_tokens = 0;   // > 0: a step of up to this many tokens per sequence can be partly
                                 // undone with rollback(); costs one GDN state copy per slot
  Backend backend = Backend::cpu;  // where the context runs (see Model's Backend)
  int device = 0;                  // CUDA device ordinal (Backend::cuda)
  bool cuda_graphs = true;         // CUDA: replay passes whose shape repeats (decode) from captured graphs
};

// A saved sequence state held by the context (see Context::snapshot). Same handle scheme as SeqId.
using SnapshotId = std::uint64_t;

struct FaultInjection;  // gdn/diagnostics/doctor.hpp
class Context;
namespace detail {
// A context with deliberate faults, for gdn doctor and the tests that prove a check catches the
// bug it is for (src/engine/testing.hpp). Never for real use.
std::unique_ptr<Context> make_context_for_tests(std::shared_ptr<const Model>, const ContextParams&, const FaultInjection&);
}  // namespace detail

class Context {
 public:
  // Throws Error(backend_unavailable) when params.backend is cuda and libgdn has no CUDA backend or
  // the machine no usable device (the message says which), Error(out_of_capacity) when the state
  // does not fit the backend's memory.
  Context(std::shared_ptr<const Model> model, const ContextParams& params = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Model& model() const noexcept;
  const ContextParams& params() const noexcept;

  // Sequences. create_sequence throws Error(out_of_capacity) when every slot is taken.
  SeqId create_sequence();
  // Clears all state: the sequence behaves exactly like a freshly created one.
  void reset_sequence(SeqId seq);
  void free_sequence(SeqId seq);
  bool is_valid(SeqId seq) const noexcept;
  std::int64_t sequence_length(SeqId seq) const;  // positions consumed by the main model
  std::int64_t mtp_length(SeqId seq) const;       // positions consumed by the MTP layer
  int live_sequences() const noexcept;

  // Advances every sequence in the batch by its tokens. The whole batch is validated first (ids,
  // token range, context length, KV capacity); on error nothing has changed. Throws gdn::Error.
  // A failure inside the backend (a device fault) may leave state half-written: the context then
  // reports usable() == false and refuses every later call with that failure's message.
  void step(const Batch& batch);
  bool usable() const noexcept;

  // Outputs of the last step, by output row (see Batch::output_row): logits, and the final hidden
  // state after the last norm (what lm_head and the MTP head read). Valid until the next step.
  std::int64_t output_rows() const noexcept;
  std::span<const float> logits(std::int64_t row) const;
  std::span<const float> hidden(std::int64_t row) const;

  // MTP head: for each batch token x at index i, with hidden[i] the main model's post-norm hidden
  // state of the position before x, runs fc([norm(embed(x)); norm(hidden)]) → MTP decoder layer
  // (its own KV cache, positions continuing from mtp_length) → norm → lm_head. Outputs replace
  // those of the last step (same logits()/hidden() accessors). Throws Error(unsupported_model)
  // when the model has no MTP head.
  void step_mtp(const Batch& batch, std::span<const float> hidden);

  // Exact state control.
  //
  // snapshot() copies the sequence's GDN conv and recurrent states (a fixed size, independent of
  // length) and shares its KV pages by reference count; a later write into a shared page copies
  // that page first (copy-on-write), so neither side ever sees the other's tokens. Snapshots are
  // taken at any token position, independent of the KV page size.
  SnapshotId snapshot(SeqId seq);
  void free_snapshot(SnapshotId snap);
  // Puts `seq` exactly where the snapshot was taken (its own previous state is dropped).
  void restore(SeqId seq, SnapshotId snap);
  // A new sequence starting from the snapshot (prefix reuse).
  SeqId create_sequence_from(SnapshotId snap);
  // A new sequence identical to `seq` now (GDN state copied, KV shared copy-on-write).
  SeqId fork_sequence(SeqId seq);

  // Keeps only the first `keep` tokens (0 <= keep <= n) of the n tokens the last step gave `seq`:
  // afterwards the sequence is bit-identical to one that only ever saw those tokens. Needs
  // max_rollback_tokens >= n; the log is kept only for the sequence's most recent step.
  void rollback(SeqId seq, std::int64_t keep);
  // Tokens of the last step that rollback() can still undo (0 when it cannot).
  std::int64_t rollbackable_tokens(SeqId seq) const;
  // The MTP layer keeps only KV (no recurrent state), so truncating it is exact.
  void truncate_mtp(SeqId seq, std::int64_t mtp_length);

  // Writes the sequence's full state (GDN states, KV of every position, lengths) to `path`:
  // versioned, checksummed, tied to this model's shapes, written atomically (temp file + rename).
  void save_sequence(SeqId seq, const std::string& path) const;
  // Restores a saved state into a new sequence; bit-identical continuation.
  SeqId load_sequence(const std::string& path);

  // Memory accounting.
  std::int64_t snapshot_bytes() const noexcept;       // GDN state copied by snapshot()/fork
  std::int64_t rollback_bytes_per_sequence() const noexcept;
  std::int64_t gdn_state_bytes_per_sequence() const noexcept;
  std::int64_t kv_bytes_per_token() const noexcept;
  std::int64_t kv_free_pages() const noexcept;

  struct Impl;

 private:
  friend std::unique_ptr<Context> detail::make_context_for_tests(std::shared_ptr<const Model>, const ContextParams&,
                                                                 const FaultInjection&);
  explicit Context(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdn
