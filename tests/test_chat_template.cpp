// gdn::render_chat against transformers' apply_chat_template with the Qwen3.6 chat template: every case of
// tests/tokenizer/chat_cases.json (written by tests/tokenizer/make_chat_cases.py) must render byte for byte
// the same, tokenize to the same ids, or fail with the template's own error message.

#include <zlib.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gdn/core/error.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/text/chat_template.hpp"

using json = nlohmann::json;

namespace {

const std::string kSource = GDN_SOURCE_DIR;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  gzclose(f);
  REQUIRE(n == 0);
  return out;
}

std::vector<gdn::ChatMessage> messages_of(const json& list) {
  std::vector<gdn::ChatMessage> out;
  for (const json& m : list) {
    gdn::ChatMessage msg;
    msg.role = m.at("role").get<std::string>();
    if (m.contains("content") && m["content"].is_string()) msg.content = m["content"].get<std::string>();
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    out.push_back(std::move(msg));
  }
  return out;
}

gdn::ChatOptions options_of(const json& kwargs) {
  gdn::ChatOptions o;
  o.add_generation_prompt = kwargs.value("add_generation_prompt", false);
  o.enable_thinking = kwargs.value("enable_thinking", true);
  o.preserve_thinking = kwargs.value("preserve_thinking", false);
  return o;
}

}  // namespace

TEST_CASE("render_chat matches transformers' apply_chat_template", "[chat_template]") {
  const json doc = json::parse(read_file(kSource + "/tests/tokenizer/chat_cases.json"));
  const gdn::Tokenizer tok =
      gdn::Tokenizer::from_json(read_gz(kSource + "/tests/assets/qwen35_tokenizer/tokenizer.json.gz"), "qwen35");
  std::size_t rendered = 0, errors = 0;
  for (const json& c : doc.at("cases")) {
    INFO("case: " << c.at("name").get<std::string>());
    const auto messages = messages_of(c.at("messages"));
    const auto options = options_of(c.at("kwargs"));
    if (c.contains("error")) {
      try {
        gdn::render_chat(messages, options);
        FAIL("expected an error");
      } catch (const gdn::Error& e) {
        CHECK(e.status() == gdn::Status::invalid_argument);
        // transformers refuses an empty conversation itself; the template's message is ours then.
        if (!c.contains("error_from"))
          CHECK(std::string(e.what()) == c["error"].get<std::string>());
        else
          CHECK(std::string(e.what()) == "No messages provided.");
      }
      ++errors;
      continue;
    }
    const std::string text = gdn::render_chat(messages, options);
    CHECK(json(text).dump() == json(c.at("text").get<std::string>()).dump());
    CHECK(tok.encode(text) == c.at("ids").get<std::vector<std::int32_t>>());
    ++rendered;
  }
  CHECK(rendered >= 30);
  CHECK(errors >= 4);
}

TEST_CASE("render_chat basics", "[chat_template]") {
  using gdn::ChatMessage;
  const std::vector<ChatMessage> conv{{"system", "sys", std::nullopt}, {"user", "hi", std::nullopt}};
  gdn::ChatOptions o;
  CHECK(gdn::render_chat(conv, o) == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
  o.add_generation_prompt = true;
  CHECK(gdn::render_chat(conv, o).ends_with("<|im_start|>assistant\n<think>\n"));
  o.enable_thinking = false;
  CHECK(gdn::render_chat(conv, o).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  const std::vector<ChatMessage> none;
  CHECK_THROWS_AS(gdn::render_chat(none, o), gdn::Error);
}
