#pragma once
// Checkpoints with the exact tensor shapes of real models, in the Hugging Face on-disk layout
// (config.json + model.safetensors), for the benchmarks and the real-size tests: random bf16
// weights, or sparse (every tensor present at its full size, no data written: the file takes
// almost no disk, and reads back as zeros).

#include <filesystem>
#include <string>
#include <string_view>

namespace gdn::cli {

struct Shape {
  std::string name;
  int layers, hidden, q_heads, kv_heads, head_dim, ffn, lin_k_heads, lin_v_heads, lin_dim, vocab;
  bool tied;
};

// 0.8b, 2b (Qwen3.5), 27b (Qwen3.6-27B), tiny (smoke tests). Throws Error(invalid_argument).
Shape shape_for(std::string_view name);

// Writes DIR/config.json and DIR/model.safetensors (atomically: the weights under a temporary
// name, renamed when complete).
void make_checkpoint(const Shape& s, const std::filesystem::path& dir, bool sparse = false);

}  // namespace gdn::cli
