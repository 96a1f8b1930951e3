// A decode step must not touch the heap once the context exists: this binary replaces the global
// operator new and counts every allocation made while steps run.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

#include "test_util.hpp"

namespace {
std::atomic<long> allocations{0};
std::atomic<bool> counting{false};
}  // namespace

void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// The nothrow forms too (Catch uses them): each allocation must be freed by the same allocator
// that made it (ASan checks new/free pairs).
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

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
    allocations = 0;
    counting = true;
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
    counting = false;
    INFO(name << (input == MatmulInput::bf16 ? " (bf16 inputs)" : "") << ": heap allocations during 50 decode steps: "
              << allocations.load());
    CHECK(allocations.load() == 0);
  }
}
