#pragma once
// The seam between the engine and a backend (docs/architecture.md).
//
// The engine (gdn::Context, src/engine/) owns everything that is bookkeeping: handles and their
// validation, sequence slots, KV page tables and their reference counts, the step plan (which rows
// of a pass belong to which sequence at which position, and which rows are wanted as outputs),
// snapshot / fork / rollback bookkeeping and state files. A backend owns where the numbers live and
// how they are computed: the weights in its own form (CPU packing, a device upload), the GDN and KV
// state storage, one forward pass over a plan, and the state primitives the engine asks for by slot
// and page id. Slots and page ids mean the same on both sides; nothing else crosses the seam.
//
// Everything a backend sees is independent of how it splits the work, so a tensor-parallel backend
// (one instance per rank holding its share of heads and projection rows, collectives inside its
// forward) fits behind the same interface: the plan, the slot and page ids and the state primitives
// are rank-independent, and only rank 0's outputs are copied back.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gdn/core/dtype.hpp"
#include "gdn/core/matmul_input.hpp"
#include "gdn/model/model.hpp"
#include "gdn/runtime/batch.hpp"

namespace gdn {

class Model;

// The rows of one sequence in a pass: consecutive tokens at consecutive positions.
struct PassSegment {
  int slot = 0;            // sequence slot
  std::int64_t row = 0;    // first row of the pass
  std::int64_t n = 0;      // rows
  std::int64_t pos = 0;    // position of the first row
  bool record = false;     // keep what an exact rollback of this step needs
};

// A row whose final hidden state (and, when `logits`, whose logits) the host wants.
struct PassOutput {
  std::int64_t row = 0;      // row of the pass
  std::int64_t out_row = 0;  // row of the step's outputs
  bool logits = false;
};

// One pass through the main model (or the MTP head) for at most max_batch_tokens rows.
struct PassPlan {
  bool mtp = false;
  std::int64_t rows = 0;
  std::span<const Token> tokens;            // one per row
  const float* hidden = nullptr;            // MTP: [rows][hidden_size], the main model's final hidden
                                            // state at the position before each row's token
  std::span<const PassSegment> segments;    // in row order, covering [0, rows)
  std::span<const PassOutput> outputs;      // in row order
  std::span<const std::vector<std::int32_t>> page_tables;  // KV page ids, by slot
};

// Where a pass writes its outputs: row out_row of logits (vocab_size floats each) and hidden
// (hidden_size floats each), host memory owned by the engine.
struct PassOutputs {
  float* logits = nullptr;
  float* hidden = nullptr;
};

// A slot's GDN state (conv + recurrent, every GDN layer) held by a backend: a snapshot.
class StateCopy {
 public:
  virtual ~StateCopy() = default;
};

// A context's KV dtype when ContextParams::kv_dtype is unset: each backend's own.
inline DType default_kv_dtype(Backend b) noexcept { return b == Backend::cuda ? DType::bf16 : DType::f32; }

// What a backend needs from the context parameters (validated by the engine).
struct BackendParams {
  int slots = 0;                 // max_sequences
  std::int64_t kv_pages = 0;     // 0 when the model has no attention layer
  int kv_page_size = 64;
  int max_context = 0;
  int max_pass_rows = 0;         // max_batch_tokens
  int max_output_rows = 0;       // outputs one pass can ask for (≤ max_pass_rows)
  DType state_dtype = DType::f32;
  DType kv_dtype = DType::f32;   // the KV cache's element type (the CPU: F32 or BF16; CUDA: BF16)
  MatmulInput matmul_input = MatmulInput::float32;
  int threads = 0;
  int gdn_chunk_min_tokens = 16;
  int max_rollback_tokens = 0;
  int device = 0;                // CUDA device ordinal
  bool cuda_graphs = true;       // replay repeated pass shapes from captured graphs (CUDA)
  // Test hook (never set by the public API): pair GDN value head h with key head h % Hk, the GGUF
  // order, instead of h / (Hv/Hk), so checks can prove they catch the mix-up.
  bool tiled_value_heads = false;
};

// The numbers a state file and the engine's accounting need, identical for every backend.
struct StateLayout {
  DType state_dtype = DType::f32;
  DType kv_dtype = DType::f32;          // how the backend holds KV; pages cross the interface as float32
  std::int64_t gdn_layers = 0;
  std::int64_t conv_floats = 0;         // per GDN layer: (kernel − 1) × conv_dim
  std::int64_t recurrent_elements = 0;  // per GDN layer: Hv × dk × dv
  std::int64_t kv_layers = 0;           // attention layers + the MTP layer
  std::int64_t kv_dim = 0;              // kv heads × head_dim
  std::int64_t page_size = 0;
  std::int64_t conv_bytes_per_slot() const noexcept { return gdn_layers * conv_floats * 4; }
  std::int64_t recurrent_bytes_per_slot() const noexcept {
    return gdn_layers * recurrent_elements * static_cast<std::int64_t>(dtype_size(state_dtype));
  }
  // floats of one KV page in the backend-neutral layout [layer][key|value][kv_head][row][head_dim]
  // (the values a kv_dtype store holds, exactly, as float32)
  std::int64_t kv_page_floats() const noexcept { return kv_layers * 2 * kv_dim * page_size; }
};

class BackendInterface {
 public:
  virtual ~BackendInterface() = default;

  virtual const char* name() const noexcept = 0;
  virtual const StateLayout& layout() const noexcept = 0;

  // Runs one pass: every row of the plan through the layers, updating the GDN state of each
  // segment's slot and writing its keys and values into its pages; then the outputs. Segments
  // marked `record` keep what rollback() needs. Throws gdn::Error; whether the backend is still
  // usable afterwards is usable()'s answer.
  virtual void forward(const PassPlan& plan, const PassOutputs& out) = 0;

  // State primitives, by slot and page id.
  virtual void clear_slot(int slot) = 0;                         // a fresh sequence's GDN state
  virtual void copy_slot(int from, int to) = 0;                  // GDN state
  virtual void copy_kv_page(std::int32_t from, std::int32_t to) = 0;
  // Puts the slot where it stood after the first `keep` tokens of its last recorded segment
  // (the engine checks that there is one and that keep < its tokens).
  virtual void rollback(int slot, std::int64_t keep) = 0;
  virtual std::unique_ptr<StateCopy> save_slot(int slot) = 0;
  virtual void restore_slot(int slot, const StateCopy& copy) = 0;

  // Host copies in the backend-neutral form of state files: conv float32 [gdn layer][conv_floats],
  // recurrent in the state dtype [gdn layer][recurrent_elements]; KV pages as kv_page_floats().
  virtual void read_slot(int slot, float* conv, std::byte* recurrent) = 0;
  virtual void write_slot(int slot, const float* conv, const std::byte* recurrent) = 0;
  virtual void read_kv_page(std::int32_t page, float* out) = 0;
  virtual void write_kv_page(std::int32_t page, const float* in) = 0;

  // Memory the backend keeps for rollback, per sequence (0 when rollback is off).
  virtual std::int64_t rollback_bytes_per_sequence() const noexcept = 0;
  // Bytes of device or host memory one cached position costs in the KV store.
  virtual std::int64_t kv_bytes_per_token() const noexcept = 0;

  // False after a failure that may have left state half-written (a device fault); the engine
  // then refuses every further call on the context with the message of that failure.
  virtual bool usable() const noexcept { return true; }
};

std::unique_ptr<BackendInterface> make_cpu_backend(std::shared_ptr<const Model> model, const BackendParams& params);
// Throws Error(backend_unavailable) naming the reason when libgdn has no CUDA backend, or the
// machine no usable device.
std::unique_ptr<BackendInterface> make_cuda_backend(std::shared_ptr<const Model> model, const BackendParams& params);
// Uploads the model's weights to the device now (Model::load with ModelParams::backend = cuda)
// rather than when the first CUDA context is created. Same errors as make_cuda_backend.
void prepare_cuda_weights(const Model& model, int device, const std::function<void(std::size_t, std::size_t)>& progress);

// Throws Error(backend_unavailable) with the reason when the CUDA backend cannot run on `device`.
void require_cuda_device(int device);

// For the benchmark (gdn bench --backend cuda): the device's copy bandwidth in bytes/s (read +
// write of a device-to-device copy of `bytes`, the median of a few), and the model's device weight
// matrices overwritten with random bf16 (so a sparse, all-zero checkpoint of a real model's shape
// can be timed with realistic data). Same errors as make_cuda_backend.
double measure_cuda_copy_bandwidth(int device, std::size_t bytes);
void randomize_cuda_weights(const Model& model, int device, std::uint64_t seed);

}  // namespace gdn
