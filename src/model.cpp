#include "gdn/model/model.hpp"

#include <algorithm>
#include <map>
#include <mutex>

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

std::size_t Model::packed_bytes() const noexcept {
  const auto cpu = detail::ModelInternals::find_prepared(*this, cpu::prepared_weights_key);
  return cpu ? static_cast<const cpu::PreparedWeights*>(cpu.get())->packed.size() : 0;
}

void Model::prefetch(const std::function<void(std::size_t, std::size_t)>& progress) const {
  std::size_t total = 0, done = 0;
  for (std::size_t i = 0; i < checkpoint_->shard_count(); ++i) total += checkpoint_->shard_bytes(i).size();
  constexpr std::size_t chunk = 64u << 20, page = 4096;
  volatile unsigned char sink = 0;
  if (packed_bytes() > 0) {
    if (progress) progress(total, total);
    return;
  }
  if (progress) progress(0, total);
  for (std::size_t i = 0; i < checkpoint_->shard_count(); ++i) {
    const auto bytes = checkpoint_->shard_bytes(i);
    for (std::size_t off = 0; off < bytes.size(); off += chunk) {
      const std::size_t end = std::min(bytes.size(), off + chunk);
      for (std::size_t p = off; p < end; p += page) sink = sink + static_cast<unsigned char>(bytes[p]);
      done += end - off;
      if (progress) progress(done, total);
    }
  }
  (void)sink;
}

std::shared_ptr<const Model> Model::load(const std::string& dir, const ModelParams& params) {
  // Config first: an unsupported architecture is refused before any file is mapped.
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
