#pragma once
// An immutable model: configuration plus weights, the weights used in place from the mapped
// checkpoint. A Model is safe to share between threads; all mutable state lives in Contexts.
// A backend's own form of the weights (the CPU's packed images, a device copy) is made once per
// model (and device) and shared by every context that runs on it.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "gdn/model/config.hpp"
#include "gdn/model/weights.hpp"

namespace gdn {

namespace io { class Checkpoint; }
namespace detail { struct ModelInternals; }

// Where a Context runs. cuda: an NVIDIA GPU (libgdn built with nvcc), device 0 unless
// ContextParams::device says otherwise.
enum class Backend : int { cpu = 0, cuda = 1 };

// Where the CPU backend reads the bf16 projections from (docs/performance.md says what each costs).
//   packed    an anonymous copy in the order this process's projection kernel reads (AMX tiles or
//             AVX-512 panels), made at load: decode streams it sequentially (~94% of the memory
//             roofline on AVX-512), but every process pays the weights' size in memory and a pass
//             over the checkpoint on every load.
//   image     the same order read from a packed image file written once by `gdn pack`
//             (gdn/model/packed_image.hpp), memory-mapped: no copy, no anonymous memory, the page
//             cache shared by every process that maps it.
//   in_place  the mapped checkpoint as it is (the AVX-512 kernel transposes each block on the way:
//             about 53% of the roofline); the only form on CPUs whose kernel reads no image (AVX2,
//             scalar) and for f16 / f32 weights.
// As a request: automatic (the default) takes a valid image when there is one, else packs when the
// packed copy fits the memory this process can get (system_memory(), with a margin), else reads in
// place; whenever it takes something other than the fastest form, and whenever it refuses an
// image (stale, foreign, truncated, corrupt), it says so in one line (ModelParams::notice). packed
// packs at load (an image is not looked for) and refuses (out_of_capacity) a copy that does not
// fit; image requires a valid image (invalid_file / io_error naming why); in_place never packs nor
// maps one.
enum class WeightPlacement : int { automatic = 0, packed = 1, in_place = 2, image = 3 };
const char* weight_placement_name(WeightPlacement p) noexcept;  // "automatic", "packed", "in place", "image"

// Block-quantised projections (docs/quantization.md states the formats, the rounding and which
// tensors): every bf16 projection (the layers', the lm_head — at q8_0 under q4_0 and q4_k unless
// LmHeadQuant says otherwise — the MTP head's) in blocks of 32 input columns; embeddings, norms,
// A_log, dt_bias, conv weights stay as stored and the GDN recurrent state float32.
//   q8_0  int8 values and a half scale per block, 8.5 bits per weight
//   q4_0  4-bit values and a half scale per block, 4.5 bits per weight
//   q4_k  4-bit values with a fitted scale and offset per block (8-bit, of half super-block scales
//         per 256 columns; K-quant-like), 4.625 bits per weight: the more accurate 4-bit format
//   q4_k_m q4_k, but the projections llama.cpp's Q4_K_M gives more bits at q8_0: in the layers
//         quant_more_bits_layer names, the attention v_proj, the GDN in_proj_qkv (in_proj_qkvz)
//         and the MLP down_proj; and q5_0 (5-bit values and a half scale per block, 5.5 bits) for
//         the others where a row is not whole super-blocks of 256 columns, as llama.cpp's Q4_K_M
//         falls back to Q5_0 there (no such rows in the Qwen3.5 / 3.6 and Qwen3-Next checkpoints)
// The CPU backend reads them from a quantised image: packed at load, or mapped from the file
// `gdn pack --quant` writes (DIR/gdn-packed.<quant>.gdnimg, looked for first; another lm_head
// format than the automatic one has its own name, see default_packed_image_path). A quantised model
// cannot be read in place (WeightPlacement::in_place is refused) and its logits are not the
// checkpoint's (docs/quantization.md states what is measured so far).
enum class WeightQuant : int { none = 0, q8_0 = 1, q4_0 = 2, q4_k = 3, q4_k_m = 4 };
const char* weight_quant_name(WeightQuant q) noexcept;  // "none", "q8_0", "q4_0", "q4_k", "q4_k_m"
// "none" / "bf16", "q8_0" / "q8", "q4_0" / "q4", "q4_k", "q4_k_m"; throws gdn::Error(invalid_argument)
// naming the rest.
WeightQuant parse_weight_quant(std::string_view name);
// Whether q4_k_m gives decoder layer `layer` (of `layers`) more bits: llama.cpp's Q4_K_M rule, the
// first and last eighth of the layers and every third one between (the MTP head's layer: no).
bool quant_more_bits_layer(int layer, int layers) noexcept;

// The lm_head's format under a quantisation (ModelParams::lm_head_quant). The lm_head is the
// output projection: lm_head.weight, or for tied embeddings the quantised copy of the embedding
// that the logits are computed with (the embedding lookup itself stays as stored); the MTP head's
// logits use it too. automatic: q8_0 under the 4-bit quants, as llama.cpp keeps its output tensor at
// 6 bits or more (on gdn-tiny it halves q4_0's logit error; docs/quantization.md), else the
// projections' format. q8_0 / q4_0 / q4_k: that format (a 4-bit one under a 4-bit quant: every
// projection at 4 bits, the smallest image). Only meaningful with a quant: an explicit format
// without one is invalid_argument.
enum class LmHeadQuant : int { automatic = 0, q8_0 = 1, q4_0 = 2, q4_k = 3 };
const char* lm_head_quant_name(LmHeadQuant q) noexcept;  // "auto", "q8_0", "q4_0", "q4_k"
// "auto", "q8_0" / "q8", "q4_0" / "q4", "q4_k"; throws gdn::Error(invalid_argument) naming the field and the value.
LmHeadQuant parse_lm_head_quant(std::string_view name);
// The lm_head's format for a load with `quant` and `lm_head` (none when quant is none). Throws
// gdn::Error(invalid_argument) for an explicit lm_head format without a quant.
WeightQuant lm_head_weight_quant(WeightQuant quant, LmHeadQuant lm_head);

struct ModelParams {
  bool load_mtp = true;  // bind the mtp.* head when the checkpoint has one
  // The backend whose form of the weights is made at load: the CPU's packed images (below), or the
  // CUDA backend's device copy (on device 0). Any other backend makes its form when its first
  // context is created.
  Backend backend = Backend::cpu;
  int device = 0;  // the CUDA device the load uploads to (backend cuda)
  // Where the CPU backend reads the projections from (see WeightPlacement).
  WeightPlacement weights = WeightPlacement::automatic;
  // The packed image to look for (automatic, image): empty means
  // default_packed_image_path(dir) (DIR/gdn-packed.<layout>.gdnimg, what `gdn pack DIR` writes).
  std::string packed_image;
  // Quantised projections for the CPU backend (see WeightQuant); none: the checkpoint's bf16 values.
  WeightQuant quant = WeightQuant::none;
  // The lm_head's format under a quant (see LmHeadQuant): automatic is q8_0 under the 4-bit quants.
  LmHeadQuant lm_head_quant = LmHeadQuant::automatic;
  // Called as loading reads the weights (packing or uploading them): progress(done_bytes, total_bytes).
  std::function<void(std::size_t, std::size_t)> progress;
  // One line when loading chooses a slower form than asked for or refuses an image (and why);
  // empty: the line goes to stderr.
  std::function<void(const std::string&)> notice;
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
  // Bytes of projection weights the CPU backend reads in its kernel's order, packed at load or mapped
  // from an image (0: read in place, or no CPU context has needed them yet).
  std::size_t packed_bytes() const noexcept;
  // What loading chose for the CPU backend: packed, image or in_place (in_place too when no CPU
  // context has needed the weights yet), and the line it gave as notice (empty when none).
  WeightPlacement weight_placement() const noexcept;
  std::string weight_notice() const;
  // The image mapped (weight_placement() == image), else empty.
  std::string packed_image_path() const;
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
