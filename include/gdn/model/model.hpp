#pragma once
// An immutable model: configuration plus weights, the weights used in place from the mapped
// checkpoint. A Model is safe to share between threads; all mutable state lives in Contexts.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "gdn/model/config.hpp"
#include "gdn/model/weights.hpp"

namespace gdn {

namespace io { class Checkpoint; }

enum class Backend : int { cpu = 0, cuda = 1 };

struct ModelParams {
  bool load_mtp = true;  // bind the mtp.* head when the checkpoint has one
  // When this process's projection kernel reads an image (AMX, AVX-512): copy the bf16 projections
  // into the kernel's order at load (pack_weights_for_cpu), so decode streams weights sequentially. Costs the
  // weights' size in anonymous memory (the checkpoint's pages of them are let go) and one pass
  // over the file at load. Off: weights are read in place from the mapping.
  bool pack_weights = true;
  // Called as loading reads the weights (packing them): progress(done_bytes, total_bytes).
  std::function<void(std::size_t, std::size_t)> progress;
};

class Model {
 public:
  // Loads DIR (config.json + model.safetensors or sharded index). Every tensor the config implies
  // is checked for presence, dtype and shape before this returns. Throws gdn::Error.
  static std::shared_ptr<const Model> load(const std::string& dir, const ModelParams& params = {});

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const noexcept { return config_; }
  const ModelWeights& weights() const noexcept { return weights_; }
  bool has_mtp() const noexcept { return weights_.mtp.has_value(); }
  // Bytes of projection weights packed into the kernel's order at load (0: used in place).
  std::size_t packed_bytes() const noexcept { return weights_.packed.size(); }
  const std::string& dir() const noexcept { return dir_; }

  // Reads the mapped checkpoint through once, so the first steps do not pay for page faults on a
  // large model; progress(done_bytes, total_bytes) is called as it goes. Optional; does nothing
  // (beyond reporting completion) when the load packed the weights, which read them already.
  void prefetch(const std::function<void(std::size_t, std::size_t)>& progress = {}) const;

 private:
  Model() = default;
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<io::Checkpoint> checkpoint_;  // keeps the mappings alive
  ModelWeights weights_;
};

}  // namespace gdn
