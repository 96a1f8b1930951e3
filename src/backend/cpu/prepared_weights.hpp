#pragma once
// The CPU backend's form of a model's weights, made once per model and shared by its contexts:
// each projection with its image in the projection kernel's order (when the kernel reads one and
// the model's WeightPlacement gives one: packed at load, or mapped from a packed image file), the
// conv taps tap-major in float32, and pointers to the neutral float vectors of ModelWeights (which
// the Model keeps alive).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gdn/core/anonymous_memory.hpp"
#include "gdn/io/mapped_file.hpp"
#include "gdn/model/model.hpp"
#include "gdn/model/weights.hpp"

#include "linear.hpp"

namespace gdn::cpu {

// A projection as the CPU kernels see it.
struct Linear {
  const TensorView* w = nullptr;
  const std::uint16_t* image = nullptr;  // w in `layout` order, when packed
  WeightImage layout = WeightImage::none;
  bool empty() const noexcept { return w == nullptr || w->empty(); }
  std::int64_t out() const noexcept { return w->dim(0); }
  std::int64_t in() const noexcept { return w->dim(1); }
};

struct GdnWeights {
  Linear in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // separate layout
  Linear in_proj_qkvz, in_proj_ba;                      // fused layout (Qwen3-Next)
  Linear out_proj;
  std::vector<float> conv;            // [kernel][conv_dim] tap-major, so a tap reads channels contiguously
  const float* neg_exp_A = nullptr;   // [Hv]
  const float* dt_bias = nullptr;     // [Hv]
  const float* norm = nullptr;        // [dv]
};

struct AttentionWeights {
  Linear q_proj, k_proj, v_proj, o_proj;
  const float* q_norm_scale = nullptr;
  const float* k_norm_scale = nullptr;
};

struct MlpWeights {
  Linear gate_proj, up_proj, down_proj;
};

struct LayerWeights {
  LayerKind kind = LayerKind::linear_attention;
  const float* input_norm_scale = nullptr;
  const float* post_attention_norm_scale = nullptr;
  GdnWeights gdn;
  AttentionWeights attn;
  MlpWeights mlp;
};

struct MtpWeights {
  Linear fc;
  const float* pre_fc_norm_embedding_scale = nullptr;
  const float* pre_fc_norm_hidden_scale = nullptr;
  const float* norm_scale = nullptr;
  LayerWeights layer;
};

struct PreparedWeights {
  const TensorView* embed_tokens = nullptr;
  std::vector<LayerWeights> layers;
  const float* final_norm_scale = nullptr;
  Linear lm_head;
  std::optional<MtpWeights> mtp;
  AnonymousMemory packed;                  // the images packed at load, one huge-page-backed block
  std::unique_ptr<io::MappedFile> image;   // or the packed image file they are read from
  WeightPlacement placement = WeightPlacement::in_place;
  std::size_t image_bytes = 0;             // bytes of projection images in use (packed or mapped)
  std::string notice;                      // the line loading gave about its choice (empty: none)

  std::vector<const Linear*> projections() const;
};

// The image layouts a load reads: the projections', the lm_head's (they differ only under a quant
// whose lm_head format is another, ModelParams::lm_head_quant) and, under q4_k_m, the format of the
// projections it gives more bits (none: no such projections) and the one that stands in for q4_k
// where a projection's rows are not whole super-blocks (q5_0, as llama.cpp's Q4_K_M falls back to
// Q5_0 there: a padded super-block would fit fewer weights with the same scales; none: q4_k pads).
struct ImageLayouts {
  WeightImage projections = WeightImage::none;
  WeightImage lm_head = WeightImage::none;
  WeightImage more_bits = WeightImage::none;
  WeightImage partial_super_blocks = WeightImage::none;
};
// Columns of a q4_k super-block (quant.hpp).
inline constexpr std::int64_t q4k_super_columns = 256;
// The layout a projection of `in` columns takes where `chosen` is its policy's format.
inline WeightImage fitted_layout(WeightImage chosen, std::int64_t in, const ImageLayouts& layouts) noexcept {
  if (chosen == WeightImage::q4_k && layouts.partial_super_blocks != WeightImage::none && in % q4k_super_columns != 0)
    return layouts.partial_super_blocks;
  return chosen;
}

// Bytes of the packed images of a model's bf16 projections in `layouts` (what packing allocates and
// an image file holds).
std::size_t packed_bytes(const PreparedWeights& w, const ImageLayouts& layouts);
// Whether p is one of the projections q4_k_m gives more bits (TensorSpec::more_bits names the
// same ones): in a layer quant_more_bits_layer names, the attention v_proj, the GDN in_proj_qkv /
// in_proj_qkvz or the MLP down_proj.
bool more_bits_projection(const PreparedWeights& w, const Linear* p) noexcept;
// The layout of projection p (one of w.projections()).
inline WeightImage layout_of(const PreparedWeights& w, const Linear* p, const ImageLayouts& layouts) noexcept {
  const WeightImage chosen = p == &w.lm_head                                                          ? layouts.lm_head
                             : layouts.more_bits != WeightImage::none && more_bits_projection(w, p) ? layouts.more_bits
                                                                                                    : layouts.projections;
  return fitted_layout(chosen, p->in(), layouts);
}
// The checkpoint name of each projection's weight (lm_head of a tied model: the embedding's), in
// projections() order; empty for one the checkpoint does not name (a realigned copy).
std::vector<std::string> projection_names(const PreparedWeights& w, const io::Checkpoint& ckpt);
const char* weight_image_name(WeightImage layout) noexcept;  // "panels", "amx_tiles", "q8_0", "q4_0", "q4_k", "none"
// The image layout of projections in `quant`: the quantisation's (every kernel reads it), else this
// process's projection kernel's (none: it reads the weights in place).
inline WeightImage load_layout(WeightQuant quant) noexcept {
  if (quant == WeightQuant::q8_0) return WeightImage::q8_0;
  if (quant == WeightQuant::q4_0) return WeightImage::q4_0;
  if (quant == WeightQuant::q4_k || quant == WeightQuant::q4_k_m) return WeightImage::q4_k;
  return weight_image_layout(linear_kernel());
}
// The image layout a load with these params reads for its projections.
inline WeightImage load_layout(const ModelParams& mp) noexcept { return load_layout(mp.quant); }
// The same for the projections and the lm_head (lm_head_weight_quant); throws gdn::Error
// (invalid_argument) for an lm_head format without a quant.
inline ImageLayouts load_layouts(const ModelParams& mp) {
  const bool k_m = mp.quant == WeightQuant::q4_k_m;
  return ImageLayouts{load_layout(mp.quant), load_layout(lm_head_weight_quant(mp.quant, mp.lm_head_quant)),
                      k_m ? WeightImage::q8_0 : WeightImage::none, k_m ? WeightImage::q5_0 : WeightImage::none};
}
// The layout of a projection the plan names (memory_plan.cpp): the same choice as layout_of.
inline WeightImage layout_of(const TensorSpec& s, const ImageLayouts& layouts) noexcept {
  const WeightImage chosen = s.lm_head                                                  ? layouts.lm_head
                             : layouts.more_bits != WeightImage::none && s.more_bits ? layouts.more_bits
                                                                                     : layouts.projections;
  return fitted_layout(chosen, s.shape[1], layouts);
}
// The memory packing leaves free beyond the packed copy (for contexts and the rest of the
// process): an eighth of the copy, at least 512 MiB.
inline std::int64_t packing_margin(std::int64_t packed) noexcept {
  return packed / 8 > (std::int64_t{512} << 20) ? packed / 8 : std::int64_t{512} << 20;
}


inline constexpr const char* prepared_weights_key = "cpu";

// The model's CPU weights, made on first use (packing the images when the model's params ask for
// it and this process's projection kernel reads them), then shared. progress(done, total) reports
// the packing.
std::shared_ptr<const PreparedWeights> prepare_weights(const Model& model,
                                                       const std::function<void(std::size_t, std::size_t)>& progress = {});

}  // namespace gdn::cpu
