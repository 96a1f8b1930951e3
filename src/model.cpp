#include "gdn/model/model.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/io/safetensors.hpp"

#include "backend/backend.hpp"
#include "backend/cpu/prepared_weights.hpp"
#include "model_internals.hpp"

namespace gdn {

// Backends' forms of the weights, by key. Guarded: contexts on several threads may ask at once.
struct Model::Prepared {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const void>> by_key;
};

Model::Model() : prepared_(std::make_unique<Prepared>()) {}
Model::~Model() = default;

const char* weight_placement_name(WeightPlacement p) noexcept {
  switch (p) {
    case WeightPlacement::automatic: return "automatic";
    case WeightPlacement::packed: return "packed";
    case WeightPlacement::in_place: return "in place";
    case WeightPlacement::image: return "image";
  }
  return "?";
}

const char* weight_quant_name(WeightQuant q) noexcept {
  switch (q) {
    case WeightQuant::none: return "none";
    case WeightQuant::q8_0: return "q8_0";
    case WeightQuant::q4_0: return "q4_0";
    case WeightQuant::q4_k: return "q4_k";
    case WeightQuant::q4_k_m: return "q4_k_m";
  }
  return "?";
}

WeightQuant parse_weight_quant(std::string_view name) {
  if (name == "none" || name == "bf16") return WeightQuant::none;
  if (name == "q8_0" || name == "q8") return WeightQuant::q8_0;
  if (name == "q4_0" || name == "q4") return WeightQuant::q4_0;
  if (name == "q4_k") return WeightQuant::q4_k;
  if (name == "q4_k_m") return WeightQuant::q4_k_m;
  throw Error(Status::invalid_argument,
              fmt::format("quantisation '{}' is not one of none, q8_0 (q8), q4_0 (q4), q4_k, q4_k_m", name.substr(0, 64)));
}

bool quant_more_bits_layer(int layer, int layers) noexcept {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

const char* lm_head_quant_name(LmHeadQuant q) noexcept {
  switch (q) {
    case LmHeadQuant::automatic: return "auto";
    case LmHeadQuant::q8_0: return "q8_0";
    case LmHeadQuant::q4_0: return "q4_0";
    case LmHeadQuant::q4_k: return "q4_k";
  }
  return "?";
}

LmHeadQuant parse_lm_head_quant(std::string_view name) {
  if (name == "auto") return LmHeadQuant::automatic;
  if (name == "q8_0" || name == "q8") return LmHeadQuant::q8_0;
  if (name == "q4_0" || name == "q4") return LmHeadQuant::q4_0;
  if (name == "q4_k") return LmHeadQuant::q4_k;
  throw Error(Status::invalid_argument,
              fmt::format("lm_head_quant '{}' is not one of auto, q8_0 (q8), q4_0 (q4), q4_k", name.substr(0, 64)));
}

WeightQuant lm_head_weight_quant(WeightQuant quant, LmHeadQuant lm_head) {
  if (lm_head != LmHeadQuant::automatic && lm_head != LmHeadQuant::q8_0 && lm_head != LmHeadQuant::q4_0 &&
      lm_head != LmHeadQuant::q4_k)
    throw Error(Status::invalid_argument, fmt::format("lm_head_quant {} is not an LmHeadQuant", static_cast<int>(lm_head)));
  if (quant == WeightQuant::none) {
    if (lm_head != LmHeadQuant::automatic)
      throw Error(Status::invalid_argument,
                  fmt::format("lm_head_quant {} needs a quant (q8_0, q4_0, q4_k or q4_k_m): without one every projection, the lm_head "
                              "included, is read as the checkpoint stores it",
                              lm_head_quant_name(lm_head)));
    return WeightQuant::none;
  }
  if (lm_head == LmHeadQuant::q8_0) return WeightQuant::q8_0;
  if (lm_head == LmHeadQuant::q4_0) return WeightQuant::q4_0;
  if (lm_head == LmHeadQuant::q4_k) return WeightQuant::q4_k;
  // automatic: the 4-bit lm_head is most of q4_0's logit error (docs/quantization.md), so it stays
  // at 8 bits, as in llama.cpp's Q4_0 and Q4_K_M (Q6_K there); likewise under q4_k and q4_k_m.
  return quant == WeightQuant::q8_0 ? quant : WeightQuant::q8_0;
}

namespace {
const cpu::PreparedWeights* cpu_weights(const Model& m) {
  const auto cpu = detail::ModelInternals::find_prepared(m, cpu::prepared_weights_key);
  return static_cast<const cpu::PreparedWeights*>(cpu.get());  // the Model keeps it alive
}
}  // namespace

std::size_t Model::packed_bytes() const noexcept {
  const auto* w = cpu_weights(*this);
  return w ? w->image_bytes : 0;
}

WeightPlacement Model::weight_placement() const noexcept {
  const auto* w = cpu_weights(*this);
  return w ? w->placement : WeightPlacement::in_place;
}

std::string Model::weight_notice() const {
  const auto* w = cpu_weights(*this);
  return w ? w->notice : std::string();
}

std::string Model::packed_image_path() const {
  const auto* w = cpu_weights(*this);
  return w && w->image ? w->image->path() : std::string();
}

void Model::prefetch(const std::function<void(std::size_t, std::size_t)>& progress) const {
  // What decode reads: the mapped image, or the checkpoint (weights read in place; the embedding).
  std::vector<std::span<const std::byte>> ranges;
  const auto* w = cpu_weights(*this);
  if (w != nullptr && w->image) ranges.push_back(w->image->bytes());
  std::size_t total = 0, done = 0;
  if (w == nullptr || w->placement == WeightPlacement::in_place)
    for (std::size_t i = 0; i < checkpoint_->shard_count(); ++i) ranges.push_back(checkpoint_->shard_bytes(i));
  for (const auto& r : ranges) total += r.size();
  constexpr std::size_t chunk = 64u << 20, page = 4096;
  volatile unsigned char sink = 0;
  if (progress) progress(0, total);
  for (const auto& bytes : ranges) {
    for (std::size_t off = 0; off < bytes.size(); off += chunk) {
      const std::size_t end = std::min(bytes.size(), off + chunk);
      for (std::size_t p = off; p < end; p += page) sink = sink + static_cast<unsigned char>(bytes[p]);
      done += end - off;
      if (progress) progress(done, total);
    }
  }
  if (progress && total == 0) progress(0, 0);
  (void)sink;
}

std::shared_ptr<const Model> Model::load(const std::string& dir, const ModelParams& params) {
  // Config first: an unsupported architecture is refused before any file is mapped.
  (void)lm_head_weight_quant(params.quant, params.lm_head_quant);  // a bad combination, before any file is read
  ModelConfig config = load_model_config(dir);
  auto checkpoint = std::make_unique<io::Checkpoint>(dir);
  ModelWeights weights = bind_weights(*checkpoint, config, params.load_mtp);
  std::shared_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->config_ = std::move(config);
  m->params_ = params;
  m->params_.progress = nullptr;  // used during load only
  m->checkpoint_ = std::move(checkpoint);
  m->weights_ = std::move(weights);
  if (params.backend == Backend::cpu) cpu::prepare_weights(*m, params.progress);
  else prepare_cuda_weights(*m, params.device, params.progress);
  return m;
}

namespace detail {

std::shared_ptr<const void> ModelInternals::prepared(const Model& m, const std::string& key,
                                                     const std::function<std::shared_ptr<const void>()>& make) {
  std::lock_guard lock(m.prepared_->mutex);
  auto& slot = m.prepared_->by_key[key];
  if (!slot) {
    try {
      slot = make();
    } catch (...) {
      m.prepared_->by_key.erase(key);
      throw;
    }
  }
  return slot;
}

std::shared_ptr<const void> ModelInternals::find_prepared(const Model& m, const std::string& key) {
  std::lock_guard lock(m.prepared_->mutex);
  const auto it = m.prepared_->by_key.find(key);
  return it == m.prepared_->by_key.end() ? nullptr : it->second;
}

}  // namespace detail
}  // namespace gdn
