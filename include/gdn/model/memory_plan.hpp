#pragma once
// What a model is and what running it will cost, before any weight is loaded: inspect_model()
// reads config.json and the safetensors headers only (no weight is mapped or read), and
// plan_memory() computes, for given context and load parameters, the memory of every part:
// the weights (packed, mapped from an image, or read in place), per sequence the GDN recurrent
// and conv state, the KV cache per token, the rollback log, the work buffers and the outputs.
// `gdn info` prints both; C: gdn_memory_plan_compute(); Python: gdn.memory_plan().
//
// The CPU figures are what a Context allocates (test_memory_plan compares them with the context's
// own accounting and with the allocation measured when one is created). The CUDA figures are
// computed from the sizes the CUDA backend keeps: bf16 weights, bf16 KV cache, float32 GDN state,
// bf16 conv history, and max_rollback_tokens + 1 state snapshots per slot when rollback is on; its
// work buffers are an estimate.

#include <cstdint>
#include <string>
#include <vector>

#include "gdn/core/dtype.hpp"
#include "gdn/core/system_memory.hpp"
#include "gdn/model/config.hpp"
#include "gdn/model/model.hpp"
#include "gdn/model/weights.hpp"
#include "gdn/runtime/context.hpp"

namespace gdn {

struct DTypeCount {
  DType dtype = DType::bf16;
  std::int64_t tensors = 0, parameters = 0, bytes = 0;
};

struct CheckpointSummary {
  std::string dir;
  std::vector<std::string> files;       // the safetensors files, sorted
  std::int64_t file_bytes = 0;          // their sizes together
  std::int64_t tensors = 0, parameters = 0, bytes = 0;
  std::vector<DTypeCount> by_dtype;     // every tensor of the checkpoint, by dtype (in DType order)
  // The tensors the model reads (language model and, when loaded, the MTP head), and the rest
  // (a vision tower, an MTP head that is not loaded): never read.
  std::int64_t model_tensors = 0, model_parameters = 0, model_bytes = 0;
  std::int64_t other_tensors = 0, other_parameters = 0, other_bytes = 0;
  std::string prefix;                   // of the language-model tensors ("model.language_model.", ...)
  bool has_mtp = false;                 // the checkpoint has an MTP head the config asks for
};

// A tensor the model reads, as the checkpoint stores it.
struct ModelTensor {
  TensorSpec spec;
  DType dtype = DType::bf16;
  std::int64_t bytes = 0;
};

struct ModelInfo {
  ModelConfig config;
  CheckpointSummary checkpoint;
  std::vector<ModelTensor> tensors;  // in binding order (model_tensor_specs)
};

// config.json and every shard's safetensors header, validated as Model::load validates them (the
// same errors for a bad config, a missing or misshapen tensor); the data is neither mapped nor read.
ModelInfo inspect_model(const std::string& dir, bool load_mtp = true);

struct MemoryPlan {
  Backend backend = Backend::cpu;
  int max_sequences = 0;
  int max_context = 0;
  DType state_dtype = DType::f32;
  DType kv_dtype = DType::f32;             // the KV cache's element type
  std::int64_t threads = 0;

  // Weights. `weights` is what loading would choose now (never automatic), with the reason when it
  // is not the fastest form.
  WeightPlacement weights = WeightPlacement::in_place;
  std::string weights_reason;
  std::string packed_image;                // the image loading would map (weights == image)
  std::string kernel;                      // the CPU projection kernel ("avx512bf16", ...)
  std::int64_t weight_bytes = 0;           // the checkpoint tensors the model reads
  std::int64_t packed_bytes = 0;           // their projections in the kernel's order (0: it reads none)
  std::int64_t weights_anonymous_bytes = 0;// anonymous memory for weights: a packed copy, float copies of vectors
  std::int64_t weights_mapped_bytes = 0;   // file pages decode reads through mappings (page cache, shared)
  std::int64_t device_weight_bytes = 0;    // CUDA: bf16 weights on the device

  // Per sequence, and the context's totals.
  std::int64_t gdn_recurrent_bytes_per_sequence = 0;
  std::int64_t gdn_conv_bytes_per_sequence = 0;
  std::int64_t kv_bytes_per_token = 0;
  std::int64_t kv_pages = 0, kv_page_size = 0;
  std::int64_t kv_bytes = 0;               // the page pool
  std::int64_t rollback_bytes_per_sequence = 0;
  std::int64_t scratch_bytes = 0;          // a pass's work buffers, per-thread scratch
  std::int64_t output_bytes = 0;           // logits and hidden rows the context keeps
  std::int64_t context_bytes = 0;          // sequences × (state + rollback) + KV + scratch + outputs (+ bookkeeping)

  // Where it lives. CPU: host = weights (anonymous + mapped) + context. CUDA: device = weights +
  // context; host = the outputs and the checkpoint's mapping while uploading.
  std::int64_t host_bytes = 0;
  std::int64_t device_bytes = 0;
  SystemMemory memory;                     // what this machine has now
  bool fits = true;                        // host_bytes within memory.available (CPU): full speed
  bool context_fits = true;                // the anonymous part (context, packed copy) within it: creating a
                                           // context succeeds (weights that do not fit are paged from disk)

  std::string to_text() const;             // the `gdn info` table
  std::string to_json(int indent = 2) const;
};

// The plan for contexts made with `context` from a model loaded with `load`
// (load.weights = automatic is decided as Model::load would decide it now).
MemoryPlan plan_memory(const ModelInfo& info, const ContextParams& context = {}, const ModelParams& load = {});
MemoryPlan plan_memory(const std::string& dir, const ContextParams& context = {}, const ModelParams& load = {});

}  // namespace gdn
