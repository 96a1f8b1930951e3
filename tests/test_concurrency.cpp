// Thread safety (the rules are in docs/reliability.md): one Model shared by 8 threads, each with its
// own Context, gives bit-identical results to the same work run one after another; a Context's own
// thread pool gives the same bits at 1, 2, 3 and 4 threads; the C ABI and a shared Tokenizer behave
// the same way. Threads that share one C ABI context (against the rule) get GDN_STATUS_BUSY for the
// calls that overlap, never a torn context. scripts/sanitize.sh runs this file under
// ThreadSanitizer (ctest label concurrency), so a data race anywhere on these paths fails it even
// when the numbers happen to agree.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
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
#include "gdn/runtime/generator.hpp"
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

TEST_CASE("long-context decode spread over more threads than kv heads gives the same bits", "[concurrency]") {
  // qwen35_cond_mtp has one kv head: with 2 or 3 threads a decode past attention_chunk positions is
  // split by chunk over the threads and merged; with 1 it is not. Rows of a verification (3) and a
  // short sequence beside it (never split) in the same passes; a rollback between steps.
  const auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  REQUIRE(model->config().num_key_value_heads == 1);
  const auto run = [&](int threads) {
    ContextParams p;
    p.max_sequences = 2;
    p.max_context = 4608;
    p.threads = threads;
    p.max_batch_tokens = 512;
    p.max_rollback_tokens = 3;
    Context ctx(model, p);
    const SeqId a = ctx.create_sequence(), b = ctx.create_sequence();
    Batch batch;
    batch.add(a, prompt(5, 4400), LogitsFor::last);
    ctx.step(batch);
    std::vector<float> out;
    Token t = argmax(ctx.logits(0));
    for (int step = 0; step < 3; ++step) {
      batch.clear();
      const std::vector<Token> verify{t, 11, 12};
      batch.add(a, verify, LogitsFor::all, /*hidden_all=*/false, /*rollback=*/true);
      batch.add(b, prompt(6 + step, 5), LogitsFor::last);
      ctx.step(batch);
      for (std::int64_t r = 0; r < ctx.output_rows(); ++r) {
        const auto row = ctx.logits(r);
        out.insert(out.end(), row.begin(), row.end());
      }
      t = argmax(ctx.logits(1));
      ctx.rollback(a, 2);
    }
    return out;
  };
  const auto one = run(1);
  for (const int threads : {2, 3}) {
    INFO(threads << " threads");
    CHECK(same_bits(run(threads), one));
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

namespace {

// The C ABI statuses of calls that may overlap another thread's: OK or BUSY, and BUSY only with the
// message that names the handle and the rule.
struct StatusLog {
  std::atomic<long> ok{0}, busy{0};
  std::vector<std::string> unexpected;  // one per thread
  void record(int thread, gdn_status s, const char* call) {
    if (s == GDN_STATUS_OK) {
      ok.fetch_add(1, std::memory_order_relaxed);
    } else if (s == GDN_STATUS_BUSY && std::string(gdn_last_error()).find("is in use by another thread") != std::string::npos) {
      busy.fetch_add(1, std::memory_order_relaxed);
    } else {
      auto& u = unexpected[static_cast<std::size_t>(thread)];
      if (u.empty()) u = std::string(call) + ": " + gdn_status_string(s) + ": " + gdn_last_error();
    }
  }
};

std::vector<std::vector<Token>> feed_plan(int i) {
  std::vector<std::vector<Token>> chunks = {prompt(i, 9 + 5 * i)};
  for (int t = 0; t < 5; ++t) chunks.push_back({static_cast<Token>((i * 17 + t * 29) % 256)});
  return chunks;
}

}  // namespace

TEST_CASE("the C ABI: threads sharing one gdn_context get OK or BUSY, and the context stays consistent",
          "[concurrency][capi]") {
  // Against the rule (one thread at a time per context), as a careless host does: every thread
  // advances its own sequence of one shared context and reads its lengths and outputs. The calls
  // that overlap must be refused whole; afterwards each sequence must be exactly where the calls
  // that succeeded put it.
  constexpr int n = 4;
  gdn_model* m = nullptr;
  REQUIRE(gdn_model_load(test::fixture_model("qwen35_tied").c_str(), nullptr, &m) == GDN_STATUS_OK);
  gdn_context_params p = gdn_context_default_params();
  p.max_sequences = n;
  p.max_context = 128;
  p.threads = 1;
  p.max_batch_tokens = 32;
  gdn_context* c = nullptr;
  REQUIRE(gdn_context_create(m, &p, &c) == GDN_STATUS_OK);
  std::vector<gdn_seq_id> seqs(n);
  for (auto& s : seqs) REQUIRE(gdn_seq_create(c, &s) == GDN_STATUS_OK);

  StatusLog log;
  log.unexpected.resize(n);
  std::vector<std::int64_t> fed(n, 0);
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      const gdn_seq_id s = seqs[static_cast<std::size_t>(i)];
      gdn_batch* b = nullptr;
      const gdn_status made = gdn_batch_init(1, 64, &b);
      std::int64_t mine = 0;  // tokens this thread's successful steps gave its sequence
      start.arrive_and_wait();
      if (made != GDN_STATUS_OK) return log.record(i, made, "gdn_batch_init");
      for (const auto& chunk : feed_plan(i)) {
        for (;;) {
          gdn_batch_clear(b);  // this thread's own batch: never busy
          if (gdn_batch_add(b, s, chunk.data(), static_cast<std::int64_t>(chunk.size()), GDN_LOGITS_LAST, 0, nullptr) !=
              GDN_STATUS_OK) {
            log.record(i, GDN_STATUS_INTERNAL, "gdn_batch_add");
            break;
          }
          const gdn_status st = gdn_context_step(c, b);
          log.record(i, st, "gdn_context_step");
          // Readers in between: BUSY while another thread steps; when they answer, the answer is
          // what this thread's own steps did to its sequence.
          std::int64_t len = -1, rows = -1;
          const gdn_status sl = gdn_seq_length(c, s, &len);
          log.record(i, sl, "gdn_seq_length");
          if (sl == GDN_STATUS_OK && len != mine + (st == GDN_STATUS_OK ? static_cast<std::int64_t>(chunk.size()) : 0))
            log.record(i, GDN_STATUS_INTERNAL, "gdn_seq_length (a wrong length)");
          log.record(i, gdn_context_n_outputs(c, &rows), "gdn_context_n_outputs");
          gdn_context_memory mem;
          mem.size = sizeof mem;
          log.record(i, gdn_context_get_memory(c, &mem), "gdn_context_get_memory");
          if (!gdn_seq_is_valid(c, s)) log.record(i, GDN_STATUS_BUSY, "gdn_seq_is_valid");
          if (st == GDN_STATUS_OK) {
            mine += static_cast<std::int64_t>(chunk.size());
            break;
          }
          if (st != GDN_STATUS_BUSY) break;
          std::this_thread::yield();
        }
      }
      fed[static_cast<std::size_t>(i)] = mine;
      gdn_batch_free(b);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    INFO("thread " << i);
    CHECK(log.unexpected[static_cast<std::size_t>(i)] == "");
  }
  WARN(log.ok.load() << " calls OK, " << log.busy.load() << " BUSY");

  // Each sequence continues exactly like one in a fresh context that was fed the same tokens.
  const auto cpp_model = Model::load(test::fixture_model("qwen35_tied"));
  ContextParams cp = params(1);
  cp.max_sequences = n;
  gdn_batch* b = nullptr;
  REQUIRE(gdn_batch_init(1, 64, &b) == GDN_STATUS_OK);
  for (int i = 0; i < n; ++i) {
    INFO("thread " << i);
    std::int64_t len = 0;
    REQUIRE(gdn_seq_length(c, seqs[static_cast<std::size_t>(i)], &len) == GDN_STATUS_OK);
    CHECK(len == fed[static_cast<std::size_t>(i)]);
    const Token next = 7;
    std::int64_t row = -1;
    const float* got = nullptr;
    REQUIRE(gdn_batch_clear(b) == GDN_STATUS_OK);
    REQUIRE(gdn_batch_add(b, seqs[static_cast<std::size_t>(i)], &next, 1, GDN_LOGITS_LAST, 0, &row) == GDN_STATUS_OK);
    REQUIRE(gdn_context_step(c, b) == GDN_STATUS_OK);
    REQUIRE(gdn_context_get_logits(c, row, &got) == GDN_STATUS_OK);

    Context fresh(cpp_model, cp);
    const SeqId s = fresh.create_sequence();
    Batch fb;
    for (const auto& chunk : feed_plan(i)) {
      fb.clear();
      fb.add(s, chunk, LogitsFor::last);
      fresh.step(fb);
    }
    fb.clear();
    fb.add(s, next, LogitsFor::last);
    fresh.step(fb);
    const auto want = fresh.logits(0);
    CHECK(std::memcmp(got, want.data(), want.size_bytes()) == 0);
  }
  gdn_batch_free(b);
  gdn_context_free(c);
  gdn_model_free(m);
}

namespace {

const std::string tiny_dir = std::string(GDN_SOURCE_DIR) + "/models/gdn-tiny";

// What a text callback of gdn_generate sees when it, and another thread, call into the context the
// generation holds.
struct Intruder {
  gdn_context* ctx = nullptr;
  gdn_speculative* spec = nullptr;
  int calls = 0;
  std::vector<std::string> own;    // "status: message" of the callback's own calls into the context
  std::vector<std::string> other;  // the same from another thread, meanwhile
  static int cb(void* user, int32_t, const char*, size_t) {
    auto* self = static_cast<Intruder*>(user);
    if (self->calls++ > 0) return 1;
    const auto said = [](gdn_status s) { return std::string(gdn_status_string(s)) + ": " + gdn_last_error(); };
    gdn_seq_id seq = 0;
    self->own.push_back(said(gdn_seq_create(self->ctx, &seq)));
    std::thread([self, &said] {
      gdn_batch* b = nullptr;
      gdn_batch_init(1, 1, &b);
      std::int64_t len = 0;
      self->other.push_back(said(gdn_context_step(self->ctx, b)));
      self->other.push_back(said(gdn_seq_length(self->ctx, 1, &len)));
      self->other.push_back(gdn_seq_is_valid(self->ctx, 1) ? "true" : std::string("false: ") + gdn_last_error());
      const gdn_seq_id seqs[1] = {1};
      gdn_token out[8];
      gdn_token* outs[1] = {out};
      std::int64_t counts[1] = {0};
      self->other.push_back(said(gdn_speculative_advance(self->spec, seqs, 1, outs, 8, counts)));
      gdn_batch_free(b);
    }).join();
    return 1;
  }
};

}  // namespace

TEST_CASE("the C ABI: a context in use is refused with BUSY, naming the handle and the rule", "[concurrency][capi]") {
  gdn_model* m = nullptr;
  gdn_tokenizer* tok = nullptr;
  REQUIRE(gdn_model_load(tiny_dir.c_str(), nullptr, &m) == GDN_STATUS_OK);
  REQUIRE(gdn_tokenizer_load_model_dir(tiny_dir.c_str(), &tok) == GDN_STATUS_OK);
  gdn_context_params p = gdn_context_default_params();
  p.max_sequences = 2;
  p.max_context = 64;
  p.threads = 1;
  p.max_rollback_tokens = 4;
  gdn_context* c = nullptr;
  REQUIRE(gdn_context_create(m, &p, &c) == GDN_STATUS_OK);
  gdn_speculative* spec = nullptr;
  REQUIRE(gdn_speculative_create(c, nullptr, &spec) == GDN_STATUS_OK);
  const std::string text = "reverse 12478 =";
  gdn_token ids[64];
  std::int64_t n_ids = 0;
  REQUIRE(gdn_tokenizer_encode(tok, text.data(), text.size(), 0, ids, 64, &n_ids) == GDN_STATUS_OK);

  Intruder in;
  in.ctx = c;
  in.spec = spec;
  gdn_generation_params gp = gdn_generation_default_params();
  gp.max_tokens = 8;
  gdn_generation_result* r = nullptr;
  REQUIRE(gdn_generate(c, tok, ids, n_ids, &gp, &Intruder::cb, &in, &r) == GDN_STATUS_OK);
  const char* out = nullptr;
  std::size_t len = 0;
  REQUIRE(gdn_generation_result_text(r, 0, &out, &len) == GDN_STATUS_OK);
  CHECK(std::string(out, len) == "87421");  // the refused calls changed nothing
  gdn_generation_result_free(r);

  REQUIRE(in.own.size() == 1);
  CHECK(in.own[0] ==
        "busy: gdn_seq_create: the context is in use by the call whose callback is running on this thread (a callback "
        "must not use it); a gdn_context is used by one thread at a time (its gdn_generate and gdn_speculative calls included)");
  REQUIRE(in.other.size() == 4);
  CHECK(in.other[0] ==
        "busy: gdn_context_step: the context is in use by another thread; a gdn_context is used by one thread at a time "
        "(its gdn_generate and gdn_speculative calls included)");
  CHECK_THAT(in.other[1], Catch::StartsWith("busy: gdn_seq_length: the context is in use by another thread"));
  CHECK_THAT(in.other[2], Catch::StartsWith("false: gdn_seq_is_valid: the context is in use by another thread"));
  CHECK_THAT(in.other[3], Catch::StartsWith("busy: gdn_speculative_advance: its context is in use by another thread"));

  // Released on every path: the context and the decoder answer again.
  gdn_seq_id s = 0;
  CHECK(gdn_seq_create(c, &s) == GDN_STATUS_OK);
  CHECK(gdn_seq_is_valid(c, s));
  gdn_speculative_stats st;
  st.size = sizeof st;
  CHECK(gdn_speculative_get_stats(spec, &st) == GDN_STATUS_OK);
  gdn_speculative_free(spec);
  gdn_context_free(c);
  gdn_tokenizer_free(tok);
  gdn_model_free(m);
}

TEST_CASE("the C ABI: gdn_generate from threads sharing a context: each result OK or BUSY, OK ones as alone",
          "[concurrency][capi][generate]") {
  gdn_model* m = nullptr;
  gdn_tokenizer* tok = nullptr;
  REQUIRE(gdn_model_load(tiny_dir.c_str(), nullptr, &m) == GDN_STATUS_OK);
  REQUIRE(gdn_tokenizer_load_model_dir(tiny_dir.c_str(), &tok) == GDN_STATUS_OK);
  gdn_context_params p = gdn_context_default_params();
  p.max_sequences = 1;  // a generation that got past BUSY always finds its slot
  p.max_context = 64;
  p.threads = 1;
  gdn_context* c = nullptr;
  REQUIRE(gdn_context_create(m, &p, &c) == GDN_STATUS_OK);
  const std::vector<std::string> prompts = {"reverse 12478 =", "copy 6275 =", "add 31+13=", "reverse 23 ="};
  const auto generate = [&](const std::string& text, gdn_status* status) {
    gdn_token ids[64];
    std::int64_t n_ids = 0;
    gdn_generation_params gp = gdn_generation_default_params();
    gp.max_tokens = 8;
    gdn_generation_result* r = nullptr;
    std::string got;
    if (gdn_tokenizer_encode(tok, text.data(), text.size(), 0, ids, 64, &n_ids) != GDN_STATUS_OK) return got;
    *status = gdn_generate(c, tok, ids, n_ids, &gp, nullptr, nullptr, &r);
    if (*status == GDN_STATUS_OK) {
      const char* out = nullptr;
      std::size_t len = 0;
      gdn_generation_result_text(r, 0, &out, &len);
      got.assign(out, len);
      gdn_generation_result_free(r);
    }
    return got;
  };
  std::vector<std::string> alone;
  for (const auto& t : prompts) {
    gdn_status st = GDN_STATUS_INTERNAL;
    alone.push_back(generate(t, &st));
    REQUIRE(st == GDN_STATUS_OK);
  }

  const int n = static_cast<int>(prompts.size());
  StatusLog log;
  log.unexpected.resize(static_cast<std::size_t>(n));
  std::vector<std::vector<std::string>> got(static_cast<std::size_t>(n));
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      for (int done = 0; done < 2;) {
        gdn_status st = GDN_STATUS_INTERNAL;
        std::string text = generate(prompts[static_cast<std::size_t>(i)], &st);
        log.record(i, st, "gdn_generate");
        if (st == GDN_STATUS_OK) {
          got[static_cast<std::size_t>(i)].push_back(std::move(text));
          ++done;
        } else if (st == GDN_STATUS_BUSY) {
          std::this_thread::yield();
        } else {
          break;
        }
      }
    });
  for (auto& t : threads) t.join();
  WARN(log.ok.load() << " generations OK, " << log.busy.load() << " BUSY");
  for (int i = 0; i < n; ++i) {
    INFO("thread " << i);
    CHECK(log.unexpected[static_cast<std::size_t>(i)] == "");
    CHECK(got[static_cast<std::size_t>(i)] == std::vector<std::string>(2, alone[static_cast<std::size_t>(i)]));
  }
  gdn_context_free(c);
  gdn_tokenizer_free(tok);
  gdn_model_free(m);
}
