// Thread safety (the rules are in docs/reliability.md): one Model shared by 8 threads, each with its
// own Context, gives bit-identical results to the same work run one after another; a Context's own
// thread pool gives the same bits at 1, 2, 3 and 4 threads; the C ABI and a shared Tokenizer behave
// the same way. scripts/sanitize.sh runs this file under ThreadSanitizer (ctest label concurrency),
// so a data race anywhere on these paths fails it even when the numbers happen to agree.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gdn.h"
#include "gdn/io/tokenizer.hpp"
#include "test_util.hpp"

using namespace gdn;

namespace {

constexpr int n_threads = 8;

std::vector<Token> prompt(int seed, int n) {
  std::vector<Token> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<Token>((seed * 131 + i * 37 + (i * i) % 11) % 256));
  return t;
}

Token argmax(std::span<const float> row) {
  return static_cast<Token>(std::max_element(row.begin(), row.end()) - row.begin());
}

ContextParams params(int threads) {
  ContextParams p;
  p.max_sequences = 2;
  p.max_context = 128;
  p.threads = threads;
  p.max_batch_tokens = 32;  // prompts above it are split into several passes
  return p;
}

// One thread's work: a prefill (chunked GDN above 16 tokens; several passes above 32), then greedy
// decoding that feeds each argmax back, so any divergence compounds. Returns every logits row seen.
std::vector<float> work(const std::shared_ptr<const Model>& model, int i, int threads) {
  Context ctx(model, params(threads));
  const SeqId s = ctx.create_sequence();
  std::vector<float> out;
  Batch b;
  b.add(s, prompt(i, 9 + 5 * i), LogitsFor::last);
  for (int step = 0; step < 6; ++step) {
    ctx.step(b);
    const auto row = ctx.logits(0);
    out.insert(out.end(), row.begin(), row.end());
    b.clear();
    b.add(s, argmax(row), LogitsFor::last);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("one Model, 8 threads with a Context each: bit-identical to running them in turn", "[concurrency]") {
  for (const char* name : {"qwen35_cond_mtp", "qwen3next_dense"}) {
    INFO(name);
    const auto model = Model::load(test::fixture_model(name));
    std::vector<std::vector<float>> sequential(n_threads), concurrent(n_threads);
    for (int i = 0; i < n_threads; ++i) sequential[static_cast<std::size_t>(i)] = work(model, i, 1);

    std::latch start(n_threads);
    std::vector<std::thread> pool;
    for (int i = 0; i < n_threads; ++i)
      pool.emplace_back([&, i] {
        start.arrive_and_wait();  // all contexts run at once
        concurrent[static_cast<std::size_t>(i)] = work(model, i, 1);
      });
    for (auto& t : pool) t.join();
    for (int i = 0; i < n_threads; ++i) {
      INFO("thread " << i);
      CHECK(same_bits(concurrent[static_cast<std::size_t>(i)], sequential[static_cast<std::size_t>(i)]));
    }
  }
}

TEST_CASE("a Context's thread pool gives the same bits at any thread count", "[concurrency]") {
  const auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  // Mixed batches: a long prefill next to a decode, then both decoding.
  const auto mixed = [&](int threads) {
    Context ctx(model, params(threads));
    const SeqId a = ctx.create_sequence(), b = ctx.create_sequence();
    std::vector<float> out;
    Batch batch;
    batch.add(a, prompt(20, 3), LogitsFor::last);
    ctx.step(batch);
    batch.clear();
    batch.add(a, Token{7}, LogitsFor::last);
    batch.add(b, prompt(21, 70), LogitsFor::all);
    for (int step = 0; step < 4; ++step) {
      ctx.step(batch);
      for (std::int64_t r = 0; r < ctx.output_rows(); ++r) {
        const auto row = ctx.logits(r);
        out.insert(out.end(), row.begin(), row.end());
      }
      const Token ta = argmax(ctx.logits(0)), tb = argmax(ctx.logits(ctx.output_rows() - 1));
      batch.clear();
      batch.add(a, ta, LogitsFor::last);
      batch.add(b, tb, LogitsFor::last);
    }
    return out;
  };
  const auto one = mixed(1);
  for (const int threads : {2, 3, 4}) {
    INFO(threads << " threads");
    CHECK(same_bits(mixed(threads), one));
    CHECK(same_bits(work(model, 3, threads), work(model, 3, 1)));
  }
}

TEST_CASE("the C ABI: one gdn_model, a gdn_context per thread, the same bits as the C++ API", "[concurrency][capi]") {
  gdn_model* m = nullptr;
  REQUIRE(gdn_model_load(test::fixture_model("qwen35_tied").c_str(), nullptr, &m) == GDN_STATUS_OK);
  const auto cpp_model = Model::load(test::fixture_model("qwen35_tied"));
  constexpr int n = 4;
  std::vector<std::vector<float>> got(n);
  std::vector<std::string> errors(n);
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      gdn_context_params p = gdn_context_default_params();
      p.max_sequences = 2;
      p.max_context = 128;
      p.threads = 1;
      p.max_batch_tokens = 32;
      gdn_context* c = nullptr;
      gdn_batch* b = nullptr;
      gdn_seq_id s = 0;
      start.arrive_and_wait();
      if (gdn_context_create(m, &p, &c) != GDN_STATUS_OK || gdn_batch_init(1, 64, &b) != GDN_STATUS_OK ||
          gdn_seq_create(c, &s) != GDN_STATUS_OK) {
        errors[static_cast<std::size_t>(i)] = gdn_last_error();
        return;
      }
      std::vector<gdn_token> tokens = prompt(i, 9 + 5 * i);
      for (int step = 0; step < 6; ++step) {
        const float* row = nullptr;
        std::int64_t r = -1;
        gdn_batch_clear(b);
        if (gdn_batch_add(b, s, tokens.data(), static_cast<std::int64_t>(tokens.size()), GDN_LOGITS_LAST, 0, &r) !=
                GDN_STATUS_OK ||
            gdn_context_step(c, b) != GDN_STATUS_OK || gdn_context_get_logits(c, r, &row) != GDN_STATUS_OK) {
          errors[static_cast<std::size_t>(i)] = gdn_last_error();
          break;
        }
        auto& out = got[static_cast<std::size_t>(i)];
        out.insert(out.end(), row, row + 256);
        tokens = {argmax(std::span<const float>(row, 256))};
      }
      gdn_batch_free(b);
      gdn_context_free(c);
    });
  for (auto& t : threads) t.join();
  gdn_model_free(m);
  for (int i = 0; i < n; ++i) {
    INFO("thread " << i << ": " << errors[static_cast<std::size_t>(i)]);
    CHECK(errors[static_cast<std::size_t>(i)].empty());
    CHECK(same_bits(got[static_cast<std::size_t>(i)], work(cpp_model, i, 1)));
  }
}

TEST_CASE("one Tokenizer shared by 8 threads encodes and decodes as it does alone", "[concurrency][tokenizer]") {
  std::ifstream in(std::string(GDN_SOURCE_DIR) + "/tests/tokenizer/tokenizer_features.json");
  REQUIRE(in);
  const auto features = nlohmann::json::parse(in);
  const std::string json = features["base"].dump();
  std::vector<std::string> texts;
  for (int i = 0; i < 40; ++i)
    texts.push_back("Hello, world " + std::to_string(i * 7919) + "! <|user|> caf\xc3\xa9 " + std::string(static_cast<std::size_t>(i % 5), 'a') +
                    "b  \t tabs and spaces [MASK] " + std::to_string(i));
  const auto run = [&](const Tokenizer& tok) {
    std::vector<std::int32_t> all;
    std::string text;
    for (const auto& t : texts) {
      const auto ids = tok.encode(t);
      all.insert(all.end(), ids.begin(), ids.end());
      text += tok.decode(ids);
    }
    return std::make_pair(all, text);
  };
  const auto want = run(Tokenizer::from_json(json, "base"));
  const Tokenizer shared = Tokenizer::from_json(json, "base");  // its caches start cold, filled by all threads at once
  std::vector<std::pair<std::vector<std::int32_t>, std::string>> got(n_threads);
  std::latch start(n_threads);
  std::vector<std::thread> threads;
  for (int i = 0; i < n_threads; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      got[static_cast<std::size_t>(i)] = run(shared);
    });
  for (auto& t : threads) t.join();
  for (const auto& g : got) CHECK(g == want);
}
