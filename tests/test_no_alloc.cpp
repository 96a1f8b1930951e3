// A decode step must not touch the heap once the context exists: this binary links the counting
// replacement of the global operator new and delete (tools/gdn/alloc_count.cpp, every form of
// them) and counts every allocation made while steps run.

#include <catch2/catch.hpp>

#include "alloc_count.hpp"
#include "test_util.hpp"

using namespace gdn;

TEST_CASE("decode steps allocate nothing, for one sequence and for a batch, with either matmul input", "[alloc]") {
  for (const char* name : {"qwen35_tied", "qwen3next_dense"})
  for (const MatmulInput input : {MatmulInput::float32, MatmulInput::bf16}) {
    auto model = Model::load(test::fixture_model(name));
    ContextParams p;
    p.max_sequences = 4;
    p.max_context = 256;
    p.threads = 2;
    p.matmul_input = input;
    Context ctx(model, p);
    std::vector<SeqId> seqs;
    Batch batch;
    batch.reserve(4, 64);
    const std::vector<Token> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    for (int i = 0; i < 4; ++i) {
      seqs.push_back(ctx.create_sequence());
      batch.add(seqs.back(), std::span(prompt).first(static_cast<std::size_t>(5 + 5 * i)));
    }
    ctx.step(batch);  // prefill (may allocate: Eigen-free, but first-touch buffers are fine)
    alloc_count::begin();
    for (int step = 0; step < 40; ++step) {
      batch.clear();
      for (std::size_t i = 0; i < seqs.size(); ++i) batch.add(seqs[i], static_cast<Token>((step * 7 + static_cast<int>(i)) % 200));
      ctx.step(batch);
      volatile float sink = ctx.logits(0)[0];
      (void)sink;
    }
    // One sequence alone, too.
    for (int step = 0; step < 10; ++step) {
      batch.clear();
      batch.add(seqs[0], static_cast<Token>(step));
      ctx.step(batch);
    }
    const long allocations = alloc_count::end();
    INFO(name << (input == MatmulInput::bf16 ? " (bf16 inputs)" : "") << ": heap allocations during 50 decode steps: "
              << allocations);
    CHECK(allocations == 0);
  }
}
