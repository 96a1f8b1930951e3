#pragma once
// The Qwen3.5 / Qwen3.6 chat template (ChatML with <think> blocks and XML tool calls), written out in C++
// instead of run by a Jinja engine. render_chat() returns byte for byte what transformers'
// apply_chat_template(messages, tools=..., tokenize=False, add_generation_prompt=..., enable_thinking=...,
// preserve_thinking=...) returns with the chat_template.jinja of Qwen3.6-27B (tests/assets/qwen35_tokenizer/),
// for text conversations with or without tools. For text, Qwen3.5's template is the same one without
// preserve_thinking (leave it false).
//
// What the template does, and so what this does:
//   * with tools, the system turn opens with "# Tools" and every tool as Python's json.dumps writes it
//     (", " and ": " separators, non-ASCII kept, keys in the order given), then the call-format
//     instructions, then the system message's content (if any) after a blank line;
//   * without tools, a system message may only come first: "<|im_start|>system\n{content}<|im_end|>\n";
//   * user turns: "<|im_start|>user\n{content}<|im_end|>\n";
//   * assistant turns after the last real user query (one that is not a wrapped <tool_response>) carry their
//     reasoning: "<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}"; earlier assistant turns
//     drop it ("<|im_start|>assistant\n{content}") unless preserve_thinking; reasoning is reasoning_content
//     when given, else what <think>...</think> in the content holds; then each tool call as
//     "<tool_call>\n<function={name}>\n<parameter={key}>\n{value}\n</parameter>\n...</function>\n</tool_call>"
//     (string values as they are, others as JSON; a blank line before the first call when there is content,
//     a newline between calls), then "<|im_end|>\n";
//   * consecutive tool messages are gathered into one user turn of <tool_response> blocks;
//   * the generation prompt is "<|im_start|>assistant\n<think>\n", or with enable_thinking=false
//     "<|im_start|>assistant\n<think>\n\n</think>\n\n".
// Every content and reasoning string is trimmed of Python whitespace (Jinja's |trim).
//
// Tool call arguments are a JSON object, or (as OpenAI's API sends them) a JSON string holding one, which is
// parsed first — the template itself only takes objects (transformers raises TypeError for a string), so
// this is what a server does before templating.
//
// Refused, with Status::invalid_argument: image and video content parts (this is the text-only model; the
// template would insert vision placeholders the model cannot see), roles the official template rejects
// (e.g. "developer", which only third-party template variants accept), and malformed tools or tool calls.
// add_vision_id and vision counting do not apply.
//
// The template's own errors throw gdn::Error(Status::invalid_argument) with the template's message: "No
// messages provided.", "No user query found in messages.", "System message must be at the beginning.",
// "Unexpected message role.", "Unexpected item type in content.", "Unexpected content type.".

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gdn {

struct ToolCall {
  std::string name;
  // JSON text: an object ({"city": "Paris"}), rendered one <parameter> per key in order; or a JSON string
  // whose content is such an object ("{\"city\": \"Paris\"}", OpenAI's form). Empty: no parameters.
  std::string arguments;
};

struct ChatMessage {
  std::string role;                              // "system", "user", "assistant" or "tool"
  std::optional<std::string> content;            // nullopt renders like None: empty
  std::optional<std::string> reasoning_content = std::nullopt;  // assistant only; nullopt: look for <think> in content
  std::vector<ToolCall> tool_calls = {};         // assistant only
};

struct ChatOptions {
  bool add_generation_prompt = false;
  bool enable_thinking = true;     // false pre-fills an empty <think></think> block in the generation prompt
  bool preserve_thinking = false;  // Qwen3.6: keep the reasoning of every assistant turn
  // JSON text of each tool, as given to transformers (usually {"type": "function", "function": {...}}).
  std::vector<std::string> tools = {};
};

std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& options = {});

// Messages in the JSON form OpenAI's API and transformers take: an array of objects with "role", "content"
// (a string, null, or a list of {"type": "text", "text": ...} parts, joined without separator),
// "reasoning_content", and for the assistant "tool_calls" ([{"type": "function", "function": {"name": ...,
// "arguments": object or string}}], or the {"name", "arguments"} objects directly). Other keys
// ("tool_call_id", "name", ...) are not rendered by the template and are ignored. Throws
// Error(invalid_argument) naming what is wrong (messages[2].content[0]: image parts ...).
std::vector<ChatMessage> chat_messages_from_json(std::string_view messages_json);

// The whole conversation from JSON: `tools_json` is a JSON array of tools, or empty / "null" for none.
// options.tools is ignored (the JSON's tools are used).
std::string render_chat_json(std::string_view messages_json, std::string_view tools_json, const ChatOptions& options = {});

// Python's json.dumps(value, ensure_ascii=False) of a JSON text (what the template's tojson filter
// writes): ", " and ": " separators, keys in the given order, floats as Python's repr. Throws
// Error(invalid_argument) for text that is not JSON.
std::string python_json_dumps(std::string_view json);

}  // namespace gdn
