// Generation: stop tokens, stop strings across token boundaries (nothing after them is emitted),
// token limits, finish reasons, streaming that concatenates to the final text, batched and MTP
// generation equal to single plain generation. Uses a fixture model with a byte-level tokenizer
// built here (256 byte tokens, the fixture's vocabulary size).

#include <catch2/catch.hpp>

#include "gdn/runtime/generator.hpp"
#include "test_util.hpp"

using namespace gdn;

namespace {

// tokenizer.json for a byte-level BPE with no merges: id b is byte b (GPT-2's byte-to-char map).
std::string byte_tokenizer_json() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  const auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  std::string vocab;
  for (std::size_t i = 0; i < bs.size(); ++i) {
    std::string key = utf8(cs[i]);
    if (key == "\"" || key == "\\") key = "\\" + key;
    // Appended piece by piece: GCC 12's -Wrestrict misfires on the chained operator+ here.
    if (i) vocab += ',';
    vocab += '"';
    vocab += key;
    vocab += "\":";
    vocab += std::to_string(bs[i]);
  }
  return std::string(R"({"version":"1.0","added_tokens":[],"normalizer":null,)"
                     R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false},)"
                     R"("post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},)"
                     R"("model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,)"
                     R"("fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{)") +
         vocab + R"(},"merges":[]}})";
}

ContextParams params(int seqs) {
  ContextParams p;
  p.max_sequences = seqs;
  p.max_context = 200;
  p.threads = 2;
  p.max_rollback_tokens = 4;
  return p;
}

struct Setup {
  std::shared_ptr<const Model> model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  Tokenizer tok = Tokenizer::from_json(byte_tokenizer_json(), "byte tokenizer");
  std::vector<Token> prompt = tok.encode("The quick brown fox");
};

}  // namespace

TEST_CASE("the byte tokenizer round-trips", "[generate]") {
  Setup s;
  CHECK(s.tok.vocab_size() == 256);
  CHECK(s.prompt.size() == 19);
  CHECK(s.tok.decode(s.prompt) == "The quick brown fox");
}

TEST_CASE("generation: length limit, streaming, stop token, stop string", "[generate]") {
  Setup s;
  Context ctx(s.model, params(2));
  Generator gen(ctx, s.tok, {});
  GenerationParams gp;
  gp.max_tokens = 40;
  std::string streamed;
  const auto full = gen.generate(s.prompt, gp, [&](std::size_t, std::string_view t) {
    streamed += t;
    return true;
  });
  CHECK(full.finish == FinishReason::length);
  REQUIRE(full.tokens.size() == 40);
  CHECK(full.text == s.tok.decode(full.tokens));
  CHECK(streamed == full.text);
  CHECK(ctx.live_sequences() == 0);  // the generator frees what it created

  // A stop token: generation ends at its first occurrence; its text is not emitted.
  GenerationParams stop_tok = gp;
  const Token stop = full.tokens[7];
  stop_tok.stop_tokens = {stop};
  const auto st = gen.generate(s.prompt, stop_tok);
  const auto first = static_cast<std::size_t>(std::find(full.tokens.begin(), full.tokens.end(), stop) - full.tokens.begin());
  CHECK(st.finish == FinishReason::stop_token);
  CHECK(st.tokens == std::vector<Token>(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(first + 1)));
  CHECK(st.text == s.tok.decode(std::span(full.tokens).first(first)));

  // A stop string spanning several tokens: the text stops right before it, nothing after it is
  // emitted (not even in the streamed pieces).
  const std::string stop_str = full.text.substr(12, 5);
  const std::size_t at = full.text.find(stop_str);
  GenerationParams stop_s = gp;
  stop_s.stop_strings = {"never-appears", stop_str};
  std::string streamed2;
  const auto ss = gen.generate(s.prompt, stop_s, [&](std::size_t, std::string_view t) {
    streamed2 += t;
    return true;
  });
  CHECK(ss.finish == FinishReason::stop_string);
  CHECK(ss.text == full.text.substr(0, at));
  CHECK(streamed2 == ss.text);
  CHECK(ss.tokens.size() < full.tokens.size());
  CHECK(std::equal(ss.tokens.begin(), ss.tokens.end(), full.tokens.begin()));

  // The callback can cancel.
  int calls = 0;
  const auto cancelled = gen.generate(s.prompt, gp, [&](std::size_t, std::string_view) { return ++calls < 3; });
  CHECK(cancelled.finish == FinishReason::cancelled);
  CHECK(cancelled.tokens.size() < full.tokens.size());
}

TEST_CASE("batched, seeded and MTP generation agree with single plain generation", "[generate]") {
  Setup s;
  Context ctx(s.model, params(3));
  Generator gen(ctx, s.tok, {});
  GenerationParams greedy;
  greedy.max_tokens = 30;
  const auto a = gen.generate(s.prompt, greedy);
  const std::vector<Token> other = s.tok.encode("Hello, world");
  const auto b = gen.generate(other, greedy);
  const std::vector<std::vector<Token>> prompts = {s.prompt, other};
  const std::vector<GenerationParams> ps = {greedy, greedy};
  const auto both = gen.generate(prompts, ps);
  CHECK(both[0].tokens == a.tokens);
  CHECK(both[1].tokens == b.tokens);
  // MTP speculative decoding: identical greedy output.
  GenerationParams mtp = greedy;
  mtp.mtp_draft = 3;
  const auto m = gen.generate(s.prompt, mtp);
  CHECK(m.tokens == a.tokens);
  CHECK(m.text == a.text);
  CHECK(m.speculative.rounds > 0);
  // Same seed, same text; another seed, other text.
  GenerationParams hot = greedy;
  hot.sampling.temperature = 1.0f;
  hot.sampling.seed = 11;
  const auto h1 = gen.generate(s.prompt, hot);
  const auto h2 = gen.generate(s.prompt, hot);
  hot.sampling.seed = 12;
  const auto h3 = gen.generate(s.prompt, hot);
  CHECK(h1.tokens == h2.tokens);
  CHECK(h1.tokens != h3.tokens);
}

TEST_CASE("eos ids are read from config.json and generation_config.json", "[generate]") {
  const auto eos = load_eos_token_ids(test::fixture_model("qwen35_cond_mtp"));
  INFO("eos ids found: " << eos.size());
  for (const Token t : eos) CHECK(t >= 0);
}
