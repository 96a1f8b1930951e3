#pragma once
// --pack / --in-place / --image FILE: where the CPU backend reads the weights from, on every command
// that loads a model (gdn/model/model.hpp, WeightPlacement): --pack packs them at load (no image is
// looked for), --in-place reads the mapped checkpoint, --image FILE names the packed image to map.
// Without one, loading decides: a packed image when there is a valid one (MODEL_DIR/
// gdn-packed.<layout>.gdnimg, or the --image FILE), else packing when it fits the memory available,
// else in place; an image that is refused (stale, foreign, truncated, corrupt) is named in one line
// on stderr and the checkpoint is used instead. --quant q8_0|q4_0|q4_k|q4_k_m reads block-quantised projections
// (docs/quantization.md): the image `gdn pack MODEL_DIR --quant Q` wrote, else quantised at load;
// --lm-head-quant auto|q8_0|q4_0|q4_k the lm_head's format under it (auto: q8_0 under the 4-bit quants).

#include <string_view>

#include "gdn/model/model.hpp"

namespace gdn::cli {

inline constexpr const char* load_flags_usage =
    "[--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]";

// Consumes argv[i] (and its value) when it is one of the flags; false otherwise.
inline bool parse_load_flag(int argc, char** argv, int& i, ModelParams& mp) {
  const std::string_view a = argv[i];
  if (a == "--pack") mp.weights = WeightPlacement::packed;
  else if (a == "--in-place") mp.weights = WeightPlacement::in_place;
  else if (a == "--image" && i + 1 < argc) mp.packed_image = argv[++i];
  else if (a == "--quant" && i + 1 < argc) mp.quant = parse_weight_quant(argv[++i]);
  else if (a == "--lm-head-quant" && i + 1 < argc) mp.lm_head_quant = parse_lm_head_quant(argv[++i]);
  else return false;
  return true;
}

}  // namespace gdn::cli
