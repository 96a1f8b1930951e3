#include "gdn/model/model.hpp"

#include "gdn/io/safetensors.hpp"

namespace gdn {

Model::~Model() = default;

std::shared_ptr<const Model> Model::load(const std::string& dir, const ModelParams& params) {
  // Config first: an unsupported architecture is refused before any file is mapped.
  ModelConfig config = load_model_config(dir);
  auto checkpoint = std::make_unique<io::Checkpoint>(dir);
  ModelWeights weights = bind_weights(*checkpoint, config, params.load_mtp);
  std::shared_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->config_ = std::move(config);
  m->checkpoint_ = std::move(checkpoint);
  m->weights_ = std::move(weights);
  return m;
}

}  // namespace gdn
