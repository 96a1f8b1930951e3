#pragma once
// gdn serve's text pipeline, after the tokens:
//   StopText    stream-decodes a request's tokens (special tokens skipped, as the Generator does), holds
//               back what might be the start of a stop string, and cuts at the first stop string, even
//               across token boundaries: nothing after a stop is ever emitted.
//   ChatOutput  splits a chat completion into reasoning (before </think>, when the prompt opened a
//               <think> block), content, and tool calls in the chat template's XML form
//               (<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>),
//               incrementally, for streaming. Tool calls are handed out only once complete; text that
//               looks like a tool call but does not parse is returned as content, never dropped.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/batch.hpp"

namespace gdn::serve {

class StopText {
 public:
  StopText(const Tokenizer& tok, std::vector<std::string> stops);
  // A token's text; returns true when a stop string completed. `out` gets the newly final text. A token the
  // tokenizer does not have (a checkpoint's vocab_size is often padded past the tokenizer's ids, and a
  // model may sample a padding id) has no text, as transformers decodes it, instead of failing the request.
  bool push(Token t, std::string& out);
  // The end: everything still held becomes final.
  void finish(std::string& out);

 private:
  bool feed(const std::string& piece, std::string& out, bool final);
  StreamDecoder decoder_;
  std::vector<std::string> stops_;
  std::size_t longest_ = 0;
  std::string all_;
  std::size_t emitted_ = 0;
};

struct ParsedToolCall {
  std::string id;         // call_...
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ChatDelta {
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutput {
 public:
  // thinking: the prompt ended inside an open <think> block. tools_json: the request's tools (a JSON
  // array, empty for none); their parameter schemas decide which values stay strings.
  ChatOutput(bool thinking, const std::string& tools_json);
  ChatDelta push(std::string_view text);
  ChatDelta finish();

  const std::string& reasoning() const noexcept { return reasoning_; }
  const std::string& content() const noexcept { return content_; }
  const std::vector<ParsedToolCall>& tool_calls() const noexcept { return calls_; }

 private:
  void run(ChatDelta& d, bool final);
  void emit_content(ChatDelta& d, std::string_view s);
  std::optional<ParsedToolCall> parse_call(std::string_view body) const;

  enum class Phase { reasoning, content };
  Phase phase_;
  bool tools_ = false;
  bool after_think_ = false;      // strip the newlines that follow </think>
  bool reasoning_started_ = false;
  std::string buf_;               // text not yet classified
  std::string held_ws_;           // content whitespace held back (dropped before a tool call)
  std::string reasoning_held_;    // reasoning newlines held back (dropped before </think>)
  std::string reasoning_, content_;
  std::vector<ParsedToolCall> calls_;
  // Parameter name -> JSON schema "type" (a string, or several), per function.
  std::map<std::string, std::map<std::string, std::vector<std::string>>> schema_;
  std::uint64_t call_salt_ = 0;
};

}  // namespace gdn::serve
