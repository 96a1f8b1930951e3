#include "gdn/model/model.hpp"

#include <algorithm>

#include "gdn/io/safetensors.hpp"

namespace gdn {

Model::~Model() = default;

void Model::prefetch(const std::function<void(std::size_t, std::size_t)>& progress) const {
  std::size_t total = 0, done = 0;
  for (std::size_t i = 0; i < checkpoint_->shard_count(); ++i) total += checkpoint_->shard_bytes(i).size();
  constexpr std::size_t chunk = 64u << 20, page = 4096;
  volatile unsigned char sink = 0;
  if (weights_.packed.size() > 0) {
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
  if (params.pack_weights) pack_weights_for_cpu(weights, *checkpoint, params.progress);
  std::shared_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->config_ = std::move(config);
  m->checkpoint_ = std::move(checkpoint);
  m->weights_ = std::move(weights);
  return m;
}

}  // namespace gdn
