// gdn serve's engine without HTTP (tools/gdn/serve_*.hpp): every request of a concurrent, continuously
// batched run equals an offline gdn::Generator run with the same parameters and ContextParams, token for
// token — greedy, seeded sampling and penalties; with prefills chunked under a small step budget beside
// running decodes; cold and from prefix-cache snapshots at any token; with MTP speculative decoding on
// and off. Plus the prefix cache's accounting and eviction, cancellation, backpressure, stop strings,
// and the chat output parser (reasoning, tool calls, malformed tool calls).

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/gdn.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/generator.hpp"
#include "serve_cache.hpp"
#include "serve_engine.hpp"
#include "serve_text.hpp"
#include "test_util.hpp"

using namespace gdn;
using namespace gdn::serve;

namespace {

const std::string kTiny = std::string(GDN_SOURCE_DIR) + "/models/gdn-tiny";

struct Tiny {
  std::shared_ptr<const Model> model = Model::load(kTiny);
  Tokenizer tok = Tokenizer::load(kTiny + "/tokenizer.json");
  std::vector<Token> eos = load_eos_token_ids(kTiny);
};

Tiny& tiny() {
  static Tiny t;
  return t;
}

std::vector<std::string> heldout_prompts(std::size_t n) {
  std::ifstream in(kTiny + "/eval/heldout.jsonl");
  std::vector<std::string> out;
  for (std::string line; out.size() < n && std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("prompt"));
  return out;
}

struct Case {
  std::vector<Token> prompt;
  GenerationParams gp;
};

// A mix: greedy, seeded sampling, penalties, stop strings; short and long prompts (longer than a step).
std::vector<Case> cases(std::size_t n) {
  Tiny& t = tiny();
  std::vector<Case> out;
  const auto prompts = heldout_prompts(n);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Case c;
    std::string text = prompts[i];
    if (i % 5 == 4)  // a long prompt: earlier tasks as a prefix, so that prefill spans several steps
      for (std::size_t j = 0; j < 12; ++j) text = prompts[(i + j) % prompts.size()] + " " + text;
    c.prompt = t.tok.encode(text);
    c.gp.max_tokens = 12 + static_cast<int>(i % 7);
    switch (i % 4) {
      case 0: break;  // greedy
      case 1:
        c.gp.sampling.temperature = 0.9f;
        c.gp.sampling.top_p = 0.95f;
        c.gp.sampling.seed = 1000 + i;
        break;
      case 2:
        c.gp.sampling.temperature = 0.7f;
        c.gp.sampling.top_k = 20;
        c.gp.sampling.min_p = 0.02f;
        c.gp.sampling.repetition_penalty = 1.2f;
        c.gp.sampling.presence_penalty = 0.3f;
        c.gp.sampling.frequency_penalty = 0.2f;
        c.gp.sampling.seed = 77 + i;
        break;
      case 3:
        c.gp.sampling.temperature = 1.3f;
        c.gp.sampling.seed = 5 + i;
        c.gp.stop_strings = {"3", "<|im"};
        break;
    }
    out.push_back(std::move(c));
  }
  return out;
}

EngineConfig config(int mtp, std::int64_t cache_bytes) {
  EngineConfig c;
  c.max_sequences = 6;
  c.max_context = 512;
  c.max_queue = 256;
  c.cache_bytes = cache_bytes;
  c.cache_interval = 16;
  c.mtp = mtp;
  c.step_tokens = 48;  // long prompts take several steps, beside running decodes
  c.threads = 2;
  return c;
}

std::shared_ptr<Request> request_for(const Case& c) {
  auto r = std::make_shared<Request>();
  r->prompt = c.prompt;
  r->sampling = c.gp.sampling;
  r->max_tokens = c.gp.max_tokens;
  r->stop_tokens = tiny().eos;
  r->stop_strings = c.gp.stop_strings;
  return r;
}

void wait(Request& r) {
  std::unique_lock lk(r.m);
  r.cv.wait(lk, [&] { return r.done; });
}

struct Answer {
  std::vector<Token> tokens;
  std::string text;
  Finish finish;
  std::int64_t cached;
};

std::vector<Answer> run_engine(Engine& e, const std::vector<Case>& cs) {
  std::vector<std::shared_ptr<Request>> rs;
  for (const auto& c : cs) {
    rs.push_back(request_for(c));
    REQUIRE(e.submit(rs.back()) == Engine::Submit::ok);
  }
  std::vector<Answer> out;
  for (auto& r : rs) {
    wait(*r);
    out.push_back({r->tokens, r->text, r->finish, r->cached_tokens});
  }
  return out;
}

Finish finish_of(FinishReason f) {
  return f == FinishReason::length ? Finish::length : f == FinishReason::cancelled ? Finish::cancelled : Finish::stop;
}

}  // namespace

TEST_CASE("serve engine: every request equals offline generation, cold and cached, MTP on and off", "[serve]") {
  Tiny& t = tiny();
  const auto cs = cases(30);
  // The offline reference: a Generator, one request at a time, on a context with gdn serve's parameters.
  EngineConfig ref_cfg = config(0, 0);
  ref_cfg.max_sequences = 1;
  Context ref_ctx(t.model, serve_context_params(t.model, ref_cfg));
  Generator gen(ref_ctx, t.tok, t.eos);
  std::vector<GenerationResult> want;
  for (const auto& c : cs) want.push_back(gen.generate(c.prompt, c.gp));

  // MTP off, adaptive (k chosen from timing: it may stop drafting) and fixed (every round drafts 2, so
  // verification is exercised on every step whatever the machine's timing).
  for (const auto& [mtp, adaptive] : {std::pair{0, true}, std::pair{2, true}, std::pair{2, false}}) {
    EngineConfig ec = config(mtp, std::int64_t{64} << 20);
    ec.mtp_adaptive = adaptive;
    Engine e(t.model, t.tok, ec);
    for (const char* round : {"cold", "cached"}) {
      const auto got = run_engine(e, cs);
      std::int64_t cached = 0;
      for (std::size_t i = 0; i < cs.size(); ++i) {
        INFO(fmt::format("mtp {} {} request {}: prompt {} tokens, temperature {}", mtp, round, i, cs[i].prompt.size(),
                         cs[i].gp.sampling.temperature));
        CHECK(got[i].tokens == want[i].tokens);
        CHECK(got[i].text == want[i].text);
        CHECK(got[i].finish == finish_of(want[i].finish));
        cached += got[i].cached;
      }
      // The second round starts every request from a snapshot of its own prompt (all but its last token).
      if (std::string(round) == "cached") {
        std::int64_t most = 0;
        for (const auto& c : cs) most += static_cast<std::int64_t>(c.prompt.size()) - 1;
        CHECK(cached == most);
      }
    }
    for (int i = 0; i < 200 && e.metrics().running != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const EngineMetrics m = e.metrics();
    CHECK(m.finished == 2 * static_cast<std::int64_t>(cs.size()));
    CHECK(m.running == 0);
    if (mtp > 0 && !adaptive) {
      CHECK(m.drafted > 0);
      CHECK(m.accepted > 0);
    }
  }
}

TEST_CASE("serve engine: a prompt extending a cached one starts from its snapshot and matches a cold run", "[serve]") {
  Tiny& t = tiny();
  EngineConfig ref_cfg = config(0, 0);
  ref_cfg.max_sequences = 1;
  Context ref_ctx(t.model, serve_context_params(t.model, ref_cfg));
  Generator gen(ref_ctx, t.tok, t.eos);
  Engine e(t.model, t.tok, config(2, std::int64_t{64} << 20));
  Case a, b;
  a.prompt = t.tok.encode("copy 4821 = 4821 reverse 12478 =");
  a.gp.max_tokens = 8;
  b = a;
  const auto tail = t.tok.encode(" 87421 add 31+13=");
  b.prompt.insert(b.prompt.end(), tail.begin(), tail.end());  // shares all of a's prompt
  const auto first = run_engine(e, {a});
  const auto second = run_engine(e, {b});
  CHECK(second[0].cached == static_cast<std::int64_t>(a.prompt.size()) - 1);  // a's snapshot at its last token
  CHECK(second[0].tokens == gen.generate(b.prompt, b.gp).tokens);
  CHECK(first[0].tokens == gen.generate(a.prompt, a.gp).tokens);
  // A follow-up that continues a's answer hits the snapshot taken at the end of a's generation.
  Case c = a;
  std::vector<Token> answer = first[0].tokens;
  if (!answer.empty()) answer.pop_back();  // the stop token was never fed
  c.prompt.insert(c.prompt.end(), answer.begin(), answer.end());
  const auto more = t.tok.encode(" copy 55 =");
  c.prompt.insert(c.prompt.end(), more.begin(), more.end());
  const auto third = run_engine(e, {c});
  CHECK(third[0].cached >= static_cast<std::int64_t>(a.prompt.size() + answer.size()) - 1);
  CHECK(third[0].tokens == gen.generate(c.prompt, c.gp).tokens);
}

TEST_CASE("serve engine: cancellation frees the slot; a full queue refuses", "[serve]") {
  Tiny& t = tiny();
  EngineConfig cfg = config(0, 0);
  cfg.max_sequences = 1;
  cfg.max_queue = 2;
  Engine e(t.model, t.tok, cfg);
  const auto long_request = [&] {
    Case c;
    c.prompt = t.tok.encode("copy 123 =");
    c.gp.max_tokens = 400;
    auto r = request_for(c);
    r->stop_tokens.clear();  // never stops by itself
    return r;
  };
  auto running = long_request();
  REQUIRE(e.submit(running) == Engine::Submit::ok);
  for (int i = 0; i < 200 && e.metrics().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto q1 = long_request(), q2 = long_request(), q3 = long_request();
  CHECK(e.submit(q1) == Engine::Submit::ok);
  CHECK(e.submit(q2) == Engine::Submit::ok);
  CHECK(e.submit(q3) == Engine::Submit::queue_full);
  CHECK(e.metrics().rejected == 1);
  const auto t0 = std::chrono::steady_clock::now();
  running->cancelled = true;
  q1->cancelled = true;
  q2->cancelled = true;
  wait(*running);
  wait(*q1);
  wait(*q2);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  CHECK(running->finish == Finish::cancelled);
  CHECK(running->completion_tokens < 400);
  CHECK(q2->finish == Finish::cancelled);
  for (int i = 0; i < 200 && e.metrics().running != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(e.metrics().running == 0);
  // Still serving.
  Case c;
  c.prompt = t.tok.encode("reverse 12478 =");
  const auto again = run_engine(e, {c});
  CHECK(again[0].text == "87421");
  // Shutdown with a request in flight: it is finished or cancelled, never left hanging.
  auto last = long_request();
  REQUIRE(e.submit(last) == Engine::Submit::ok);
  e.shutdown(std::chrono::milliseconds(50));
  wait(*last);
  CHECK((last->finish == Finish::cancelled || last->finish == Finish::length));
  CHECK(e.submit(long_request()) == Engine::Submit::shutting_down);
}

TEST_CASE("prefix cache: longest prefix, token granularity, budget, LRU leaves, lineage charges", "[serve][cache]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  ContextParams p;
  p.max_sequences = 2;
  p.max_context = 256;
  p.kv_page_size = 16;  // the charges below count 16-position pages
  p.kv_pages = 64;
  p.threads = 1;
  p.gdn_chunk_min_tokens = 1 << 30;  // as gdn serve runs: split-invariant numbers
  Context ctx(model, p);
  std::vector<Token> tokens;
  for (int i = 0; i < 200; ++i) tokens.push_back(static_cast<Token>((i * 37 + 11) % 200));
  const SeqId s = ctx.create_sequence();
  PrefixCache cache(ctx, std::int64_t{1} << 40);
  Batch b;
  std::uint64_t lineage = 0;
  std::int64_t pos = 0;
  for (const std::int64_t at : {37, 64, 101, 150}) {  // points that are not page multiples too
    b.clear();
    b.add(s, std::span(tokens).subspan(static_cast<std::size_t>(pos), static_cast<std::size_t>(at - pos)), LogitsFor::none);
    ctx.step(b);
    pos = at;
    lineage = cache.insert(std::span(tokens).first(static_cast<std::size_t>(at)), ctx.snapshot(s), {}, false, lineage);
    REQUIRE(lineage != 0);
  }
  const CacheStats st = cache.stats();
  CHECK(st.snapshots == 4);
  // Lineage: each node is charged its state plus only the pages the previous snapshot does not share.
  const std::int64_t page = ctx.kv_bytes_per_token() * p.kv_page_size;
  CHECK(st.bytes == 4 * ctx.snapshot_bytes() + page * (3 + (4 - 2) + (7 - 4) + (10 - 6)));
  CHECK(cache.lookup(tokens, 199).length == 150);
  CHECK(cache.lookup(tokens, 120).length == 101);
  CHECK(cache.lookup(std::span(tokens).first(64), 63).length == 37);
  std::vector<Token> other = tokens;
  other[50] = (other[50] + 1) % 200;
  CHECK(cache.lookup(other, 199).length == 37);  // diverges at 50: only the snapshot at 37 applies
  // A hit restores exactly: continuing from the snapshot at 101 equals continuing the original.
  const CacheHit hit = cache.lookup(tokens, 120);
  REQUIRE(hit.length == 101);
  const SeqId r = ctx.create_sequence_from(hit.snapshot);
  b.clear();
  b.add(r, std::span(tokens).subspan(101, 50));  // to 151, in one step from the snapshot
  ctx.step(b);
  const std::vector<float> from_cache(ctx.logits(0).begin(), ctx.logits(0).end());
  b.clear();
  b.add(s, std::span(tokens).subspan(150, 1));  // s consumed 150 in four chunks; one more
  ctx.step(b);
  const std::vector<float> original(ctx.logits(0).begin(), ctx.logits(0).end());
  CHECK(from_cache == original);
  ctx.free_sequence(r);
  ctx.free_sequence(s);
  // Eviction: a budget for two snapshots keeps the most recently used leaves; ancestors go last.
  // Room for the snapshots at 20 (2 pages) and 40 (3 pages, charged alone), not for a third.
  PrefixCache small(ctx, 2 * ctx.snapshot_bytes() + 6 * page);
  const SeqId q = ctx.create_sequence();
  pos = 0;
  lineage = 0;
  for (const std::int64_t at : {20, 40, 60}) {
    b.clear();
    b.add(q, std::span(tokens).subspan(static_cast<std::size_t>(pos), static_cast<std::size_t>(at - pos)), LogitsFor::none);
    ctx.step(b);
    pos = at;
    small.insert(std::span(tokens).first(static_cast<std::size_t>(at)), ctx.snapshot(q), {}, false, lineage);
  }
  CHECK(small.stats().snapshots == 2);
  CHECK(small.stats().evicted == 1);
  CHECK(small.stats().bytes <= small.stats().budget);
  CHECK(small.lookup(tokens, 199).length == 60);  // the newest, deepest snapshot made room for itself
  CHECK(small.lookup(tokens, 59).length == 20);   // the one between went
  ctx.free_sequence(q);
  cache.clear();
  small.clear();
  CHECK(ctx.kv_free_pages() == 64);  // every page the snapshots held came back
}

TEST_CASE("stop strings across token boundaries; nothing after a stop", "[serve][text]") {
  Tiny& t = tiny();
  StopText st(t.tok, {"4 5", "xyz"});
  std::string all, piece;
  bool stopped = false;
  for (const Token id : t.tok.encode("1 2 3 4 5 6 7")) {
    stopped = st.push(id, piece);
    all += piece;
    if (stopped) break;
  }
  CHECK(stopped);
  CHECK(all == "1 2 3 ");
  StopText none(t.tok, {"xyz"});
  all.clear();
  for (const Token id : t.tok.encode("abc xy")) {
    none.push(id, piece);
    all += piece;
  }
  CHECK(all == "abc ");  // "xy" might begin "xyz": held back
  none.finish(piece);
  CHECK(all + piece == "abc xy");
  // gdn-tiny's vocab_size (512) is padded past its tokenizer's ids (483), as Qwen's checkpoints are: a padding
  // id a model samples has no text (transformers decodes it to nothing) and the request goes on.
  REQUIRE(t.tok.vocab_size() < t.model->config().vocab_size);
  StopText padded(t.tok, {});
  all.clear();
  for (const Token id : {t.tok.encode("ab")[0], static_cast<Token>(t.model->config().vocab_size - 1), t.tok.encode("cd")[0]}) {
    CHECK_FALSE(padded.push(id, piece));
    all += piece;
  }
  padded.finish(piece);
  CHECK(all + piece == t.tok.decode(std::vector<Token>{t.tok.encode("ab")[0], t.tok.encode("cd")[0]}));
}

TEST_CASE("chat output: reasoning, content, tool calls; streamed == whole; malformed calls stay content", "[serve][text]") {
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}, "opts": {"type": "object"}}}}}])";
  const std::string text =
      "Let me think.\nTwo calls.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n<parameter=opts>\n{\"a\": [1, true]}\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
  ChatOutput whole(true, tools);
  whole.push(text);
  whole.finish();
  CHECK(whole.reasoning() == "Let me think.\nTwo calls.");
  CHECK(whole.content() == "Checking.");
  REQUIRE(whole.tool_calls().size() == 2);
  CHECK(whole.tool_calls()[0].name == "get_weather");
  CHECK(whole.tool_calls()[0].arguments == R"({"city":"Paris","days":3,"zip":"75001","opts":{"a":[1,true]}})");
  CHECK(whole.tool_calls()[1].arguments == R"({"city":"Rome"})");
  CHECK(whole.tool_calls()[0].id != whole.tool_calls()[1].id);
  // Byte by byte, as a stream delivers it: the same parts.
  ChatOutput streamed(true, tools);
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
  const auto add = [&](ChatDelta d) {
    reasoning += d.reasoning;
    content += d.content;
    for (auto& c : d.tool_calls) calls.push_back(c);
  };
  for (const char ch : text) add(streamed.push(std::string_view(&ch, 1)));
  add(streamed.finish());
  CHECK(reasoning == whole.reasoning());
  CHECK(content == whole.content());
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].arguments == whole.tool_calls()[0].arguments);
  // Malformed tool-call text is the answer, not an error and not lost.
  for (const std::string bad : {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>",
                                "Sure. <tool_call>\nnot xml at all\n</tool_call> done",
                                "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"}) {
    ChatOutput o(false, tools);
    std::string got;
    for (const char ch : bad) got += o.push(std::string_view(&ch, 1)).content;
    got += o.finish().content;
    CHECK(o.tool_calls().empty());
    CHECK(got == bad);
    CHECK(o.content() == bad);
  }
  // Without tools, and without thinking, the text is passed through untouched.
  ChatOutput plain(false, "");
  plain.push("a <tool_call>b</tool_call> \n");
  plain.finish();
  CHECK(plain.content() == "a <tool_call>b</tool_call> \n");
  // Thinking cut short by the token limit: everything is reasoning.
  ChatOutput cut(true, "");
  cut.push("\nstill thinking...");
  cut.finish();
  CHECK(cut.reasoning() == "still thinking...");
  CHECK(cut.content().empty());
}
