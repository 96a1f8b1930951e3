#pragma once
// An immutable model: configuration plus weights, the weights used in place from the mapped
// checkpoint. A Model is safe to share between threads; all mutable state lives in Contexts.
// A backend's own form of the weights (the CPU's packed images, a device copy) is made once per
// model (and device) and shared by every context that runs on it.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "gdn/model/config.hpp"
#include "gdn/model/weights.hpp"

namespace gdn {

namespace io { class Checkpoint; }
namespace detail { struct ModelInternals; }

// Where a Context runs. cuda: an NVIDIA GPU (libgdn built with nvcc), device 0 unless
// ContextParams::device says otherwise.
enum class Backend : int { cpu = 0, cuda = 1 };

struct ModelParams {
  bool load_mtp = true;  // bind the mtp.* head when the checkpoint has one
  // The backend whose form of the weights is made at load: the CPU's packed images (below), or the
  // CUDA backend's device copy (on device 0). Any other backend makes its form when its first
  // context is created.
  Backend backend = Backend::cpu;
  int device = 0;  // the CUDA device the load uploads to (backend cuda)
  // When this process's projection kernel reads an image (AMX, AVX-512): copy the bf16 projections
  // into the kernel's order (once, for the CPU backend), so decode streams weights sequentially.
  // Costs the weights' size in anonymous memory (the checkpoint's pages of them are let go) and one
  // pass over the file. Off: the CPU backend reads the weights in place from the mapping.
  bool pack_weights = true;
  // Called as loading reads the weights (packing or uploading them): progress(done_bytes, total_bytes).
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
  const ModelParams& params() const noexcept { return params_; }
  bool has_mtp() const noexcept { return weights_.mtp.has_value(); }
  // Bytes of projection weights the CPU backend packed into its kernel's order (0: read in place,
  // or no CPU context has needed them yet).
  std::size_t packed_bytes() const noexcept;
  const std::string& dir() const noexcept { return dir_; }

  // Reads the mapped checkpoint through once, so the first steps do not pay for page faults on a
  // large model; progress(done_bytes, total_bytes) is called as it goes. Optional; does nothing
  // (beyond reporting completion) when the load packed the weights, which read them already.
  void prefetch(const std::function<void(std::size_t, std::size_t)>& progress = {}) const;

 private:
  friend struct detail::ModelInternals;
  struct Prepared;
  Model();
  std::string dir_;
  ModelConfig config_;
  ModelParams params_;
  std::unique_ptr<io::Checkpoint> checkpoint_;  // keeps the mappings alive
  ModelWeights weights_;
  std::unique_ptr<Prepared> prepared_;          // backends' forms of the weights
};

}  // namespace gdn
