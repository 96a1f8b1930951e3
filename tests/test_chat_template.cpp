// gdn::render_chat against transformers' apply_chat_template with the Qwen3.6 chat template: every case of
// tests/tokenizer/chat_cases.json (written by tests/tokenizer/make_chat_cases.py; tools and tool calls among
// them) must render byte for byte the same, tokenize to the same ids, or fail with the template's own error
// message — through the JSON entry point and through ChatMessage structs.

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

// Ordered: the order of a tool's keys is part of what the template writes.
using json = nlohmann::ordered_json;

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

gdn::ChatOptions options_of(const json& kwargs) {
  gdn::ChatOptions o;
  o.add_generation_prompt = kwargs.value("add_generation_prompt", false);
  o.enable_thinking = kwargs.value("enable_thinking", true);
  o.preserve_thinking = kwargs.value("preserve_thinking", false);
  if (kwargs.contains("tools"))
    for (const json& t : kwargs["tools"]) o.tools.push_back(t.dump());
  return o;
}

std::string tools_of(const json& kwargs) { return kwargs.contains("tools") ? kwargs["tools"].dump() : ""; }

// Both entry points: the JSON one, and structs (ChatMessage, ToolCall) built from the same JSON.
std::string render_both(const json& c) {
  const auto options = options_of(c.at("kwargs"));
  const std::string via_json = gdn::render_chat_json(c.at("messages").dump(), tools_of(c.at("kwargs")), options);
  const auto messages = gdn::chat_messages_from_json(c.at("messages").dump());
  CHECK(gdn::render_chat(messages, options) == via_json);
  return via_json;
}

}  // namespace

TEST_CASE("render_chat matches transformers' apply_chat_template", "[chat_template]") {
  const json doc = json::parse(read_file(kSource + "/tests/tokenizer/chat_cases.json"));
  const gdn::Tokenizer tok =
      gdn::Tokenizer::from_json(read_gz(kSource + "/tests/assets/qwen35_tokenizer/tokenizer.json.gz"), "qwen35");
  std::size_t rendered = 0, errors = 0, with_tools = 0;
  for (const json& c : doc.at("cases")) {
    INFO("case: " << c.at("name").get<std::string>());
    if (c.contains("error")) {
      try {
        render_both(c);
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
    const std::string text = render_both(c);
    CHECK(json(text).dump() == json(c.at("text").get<std::string>()).dump());
    CHECK(tok.encode(text) == c.at("ids").get<std::vector<std::int32_t>>());
    ++rendered;
    if (text.find("<tool_call>\n<function=") != std::string::npos || c.at("kwargs").contains("tools")) ++with_tools;
  }
  CHECK(rendered >= 60);
  CHECK(with_tools >= 20);
  CHECK(errors >= 6);
}

TEST_CASE("tool calls: OpenAI's string arguments, refusals", "[chat_template]") {
  using gdn::ChatMessage;
  using gdn::ToolCall;
  const ChatMessage user{"user", "weather?"};
  // Arguments as an object and as a JSON string holding it render the same.
  const std::vector<ChatMessage> as_object{user, {"assistant", "", std::nullopt, {ToolCall{"get_weather", R"({"city": "Paris", "n": 2})"}}}};
  const std::vector<ChatMessage> as_string{
      user, {"assistant", "", std::nullopt, {ToolCall{"get_weather", R"("{\"city\":\"Paris\",\"n\":2}")"}}}};
  const std::string text = gdn::render_chat(as_object);
  CHECK(text == gdn::render_chat(as_string));
  CHECK(text.ends_with("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=n>\n2\n"
                       "</parameter>\n</function>\n</tool_call><|im_end|>\n"));
  const auto status_of = [](auto&& f) {
    try {
      f();
    } catch (const gdn::Error& e) {
      return std::string(e.what());
    }
    return std::string("ok");
  };
  // Vision parts are refused, not dropped and not turned into placeholders the model cannot see.
  CHECK(status_of([] {
          gdn::render_chat_json(R"([{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                    {"type": "image_url", "image_url": {"url": "data:..."}}]}])",
                                "");
        }).find("messages[0].content[1] is an image: this model takes text only") == 0);
  CHECK(status_of([] { gdn::render_chat_json(R"([{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}])", ""); })
            .find("messages[0].content[0] is a video") == 0);
  // Malformed tool calls and tools say what is wrong.
  CHECK(status_of([] {
          gdn::render_chat_json(R"([{"role": "user", "content": "q"},
                                    {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}])", "");
        }) == "messages[1].tool_calls[0] has no function name");
  CHECK(status_of([] {
          gdn::render_chat_json(R"([{"role": "user", "content": "q"},
                                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]}])", "");
        }) == "the arguments of tool call 'f' must be a JSON object, got array");
  CHECK(status_of([] {
          gdn::render_chat_json(R"([{"role": "user", "content": "q"},
                                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])", "");
        }).find("the arguments string of tool call 'f' is not valid JSON") == 0);
  CHECK(status_of([] { gdn::render_chat_json(R"([{"role": "user", "content": "q"}])", R"({"type": "function"})"); }) ==
        "tools must be a JSON array");
  CHECK(status_of([] { gdn::render_chat_json(R"({"role": "user"})", ""); }) == "messages must be a JSON array");
  // Keys nothing renders are accepted (what clients send back from a response).
  CHECK(status_of([] {
          gdn::render_chat_json(R"([{"role": "user", "content": "q", "name": "bob"},
                                    {"role": "assistant", "content": null, "refusal": null, "tool_calls": [{"id": "c1",
                                     "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                                    {"role": "tool", "tool_call_id": "c1", "content": "r"}])", "null");
        }) == "ok");
}

TEST_CASE("python_json_dumps writes what Python's json.dumps writes", "[chat_template]") {
  CHECK(gdn::python_json_dumps(R"({"b":1,"a":[1.0,2.5,1e-5,1e16,1e15,0.0001,-0.0,1.5e300,true,null,"x\"\n\u0001é"]})") ==
        R"({"b": 1, "a": [1.0, 2.5, 1e-05, 1e+16, 1000000000000000.0, 0.0001, -0.0, 1.5e+300, true, null, "x\"\n\u0001é"]})");
  CHECK(gdn::python_json_dumps("123456789.0") == "123456789.0");
  CHECK(gdn::python_json_dumps("0.1") == "0.1");
  CHECK(gdn::python_json_dumps("{}") == "{}");
  CHECK_THROWS_AS(gdn::python_json_dumps("{"), gdn::Error);
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
