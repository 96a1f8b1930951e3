#pragma once
// Checkpoints with the exact tensor shapes of real models, written in the Hugging Face layout
// (config.json + model.safetensors, or shards and model.safetensors.index.json), for benchmarks
// and for tests of sizes this machine could not otherwise try:
//   gdn make-checkpoint --shape 0.8b|2b|27b|tiny [--sparse] [--shards N] DIR
//   gdn bench --shape ... (writes one into its cache first)
// Weights are random bf16 (a fixed seed), or with --sparse all zero and never written: the files
// have their full sizes but are holes, so a 54.6 GB Qwen3.6-27B-shaped checkpoint takes almost no
// disk and seconds to write. Zero weights give zero (finite) logits: enough to exercise loading,
// memory plans and the kernels at full size, not to check numerics.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace gdn::cli {

struct Shape {
  std::string name;
  int layers, hidden, q_heads, kv_heads, head_dim, ffn, lin_k_heads, lin_v_heads, lin_dim, vocab;
  bool tied;
  bool mtp = false;           // an MTP head (mtp_num_hidden_layers 1)
  bool multimodal = false;    // Qwen3_5ForConditionalGeneration: text_config, model.language_model.*
  double rope_theta = 1e7;
};

// 0.8b, 2b (Qwen3.5), 27b (Qwen3.6-27B: 64 layers, every 4th full attention, hidden 5120, 24/4
// heads of 256, FFN 17408, 16/48 linear heads of 128, vocabulary 248320, untied, an MTP head; 866
// bf16 tensors, 54.6 GB), tiny (smoke tests). Throws gdn::Error(invalid_argument) otherwise.
Shape shape_for(std::string_view name);

struct CheckpointOptions {
  bool sparse = false;   // all-zero weights, written as holes
  int shards = 1;        // > 1: model-0000i-of-0000N.safetensors and an index, split by size
  std::uint64_t seed = 1234;
};

// Writes the checkpoint into `dir` (created; files written under temporary names, then renamed).
void make_checkpoint(const Shape& s, const std::filesystem::path& dir, const CheckpointOptions& options = {});

// `gdn make-checkpoint`.
int make_checkpoint_command(int argc, char** argv);

}  // namespace gdn::cli
