// libgdn from C++, through the C++ API (include <gdn/gdn.hpp>, link gdn::gdn).
//
//   cpp_example MODEL_DIR
//
// Loads a checkpoint, runs three prompts of different lengths in one step, then decodes the three
// sequences together, greedily, one token each per step. Errors are gdn::Error exceptions that
// carry a gdn::Status and a message.

#include <algorithm>
#include <array>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <gdn/gdn.hpp>

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  auto model = gdn::Model::load(argv[1]);
  const gdn::ModelConfig& cfg = model->config();
  std::printf("model: %s, %d layers (%d gated deltanet, %d attention), vocab %d\n", cfg.architecture.c_str(),
              cfg.num_layers, cfg.count_layers(gdn::LayerKind::linear_attention),
              cfg.count_layers(gdn::LayerKind::full_attention), cfg.vocab_size);

  const std::vector<std::vector<gdn::Token>> prompts = {{1, 2, 3, 4, 5}, {42}, {7, 99, 13, 200, 31, 64, 5, 150, 18, 77, 3}};
  constexpr int n_decode = 8;
  gdn::ContextParams p;
  p.max_sequences = static_cast<int>(prompts.size());
  p.max_context = 256;
  p.threads = 2;
  gdn::Context ctx(model, p);

  auto argmax = [](std::span<const float> v) {
    return static_cast<gdn::Token>(std::max_element(v.begin(), v.end()) - v.begin());
  };

  // One step: every prompt at once, logits of each prompt's last token.
  std::vector<gdn::SeqId> seqs;
  std::vector<std::vector<gdn::Token>> out(prompts.size());
  gdn::Batch batch;
  for (const auto& prompt : prompts) {
    seqs.push_back(ctx.create_sequence());
    batch.add(seqs.back(), prompt, gdn::LogitsFor::last);
  }
  ctx.step(batch);
  for (std::size_t i = 0; i < seqs.size(); ++i) out[i].push_back(argmax(ctx.logits(batch.entries()[i].output_begin)));

  // Then all sequences decode together, one token each per step.
  for (int t = 1; t < n_decode; ++t) {
    batch.clear();
    for (std::size_t i = 0; i < seqs.size(); ++i) batch.add(seqs[i], out[i].back());
    ctx.step(batch);
    for (std::size_t i = 0; i < seqs.size(); ++i) out[i].push_back(argmax(ctx.logits(batch.entries()[i].output_begin)));
  }

  for (std::size_t i = 0; i < seqs.size(); ++i) {
    std::printf("seq %zu (%lld positions):", i, static_cast<long long>(ctx.sequence_length(seqs[i])));
    for (const gdn::Token t : out[i]) std::printf(" %d", t);
    std::printf("\n");
  }
  return 0;
} catch (const gdn::Error& e) {
  std::fprintf(stderr, "error (%s): %s\n", std::string(gdn::status_name(e.status())).c_str(), e.what());
  return 1;
}
