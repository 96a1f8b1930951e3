// Writes the logits of every position of a fixed prompt as a float32 .npy, through the installed
// C++ API: run.cmake compares the file byte for byte with the in-tree `gdn logits --out`.
#include <cstdio>
#include <vector>

#include <gdn/gdn.hpp>
#include <gdn/io/npy.hpp>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer_logits MODEL_DIR OUT.npy\n");
    return 2;
  }
  auto model = gdn::Model::load(argv[1]);
  const std::vector<gdn::Token> tokens = {1, 2, 3, 40, 41, 42, 100, 7, 9, 11};
  gdn::ContextParams p;
  p.max_sequences = 1;
  p.max_context = static_cast<int>(tokens.size());
  p.max_logits_rows = static_cast<int>(tokens.size());
  gdn::Context ctx(model, p);
  gdn::Batch b;
  b.add(ctx.create_sequence(), tokens, gdn::LogitsFor::all);
  ctx.step(b);
  std::vector<float> all;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const auto row = ctx.logits(static_cast<std::int64_t>(t));
    all.insert(all.end(), row.begin(), row.end());
  }
  gdn::io::write_npy(argv[2], all, {static_cast<std::int64_t>(tokens.size()), model->config().vocab_size});
  return 0;
}
