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
  const std::string& dir() const noexcept { return dir_; }

  // Reads the mapped checkpoint through once, so the first steps do not pay for page faults on a
  // large model; progress(done_bytes, total_bytes) is called as it goes. Optional.
  void prefetch(const std::function<void(std::size_t, std::size_t)>& progress = {}) const;

 private:
  Model() = default;
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<io::Checkpoint> checkpoint_;  // keeps the mappings alive
  ModelWeights weights_;
};

}  // namespace gdn
