#pragma once
// The Qwen3.5 / Qwen3.6 chat template (ChatML with <think> blocks), written out in C++ instead of run by a
// Jinja engine. render_chat() returns byte for byte what transformers' apply_chat_template(messages,
// tokenize=False, add_generation_prompt=..., enable_thinking=..., preserve_thinking=...) returns with the
// chat_template.jinja of Qwen3.6-27B (tests/assets/qwen35_tokenizer/), for text-only conversations. For text,
// Qwen3.5's template is the same one without preserve_thinking (leave it false).
//
// What the template does, and so what this does:
//   * a system message may only come first: "<|im_start|>system\n{content}<|im_end|>\n";
//   * user turns: "<|im_start|>user\n{content}<|im_end|>\n";
//   * assistant turns after the last real user query (one that is not a wrapped <tool_response>) carry their
//     reasoning: "<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>\n"; earlier
//     assistant turns drop it ("<|im_start|>assistant\n{content}<|im_end|>\n") unless preserve_thinking;
//     reasoning is reasoning_content when given, else what <think>...</think> in the content holds;
//   * consecutive tool messages are gathered into one user turn of <tool_response> blocks;
//   * the generation prompt is "<|im_start|>assistant\n<think>\n", or with enable_thinking=false
//     "<|im_start|>assistant\n<think>\n\n</think>\n\n".
// Every content and reasoning string is trimmed of Python whitespace (Jinja's |trim).
//
// Not supported (text-only scope): `tools` (the "# Tools" system prompt), assistant tool_calls, image and
// video content parts (add_vision_id), content given as a list of parts, and roles the official template
// rejects (e.g. "developer", which only third-party template variants accept).
//
// The template's own errors throw gdn::Error(Status::invalid_argument) with the template's message: "No
// messages provided.", "No user query found in messages.", "System message must be at the beginning.",
// "Unexpected message role.".

#include <optional>
#include <span>
#include <string>

namespace gdn {

struct ChatMessage {
  std::string role;                              // "system", "user", "assistant" or "tool"
  std::optional<std::string> content;            // nullopt renders like None: empty
  std::optional<std::string> reasoning_content;  // assistant only; nullopt: look for <think> in content
};

struct ChatOptions {
  bool add_generation_prompt = false;
  bool enable_thinking = true;     // false pre-fills an empty <think></think> block in the generation prompt
  bool preserve_thinking = false;  // Qwen3.6: keep the reasoning of every assistant turn
};

std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& options = {});

}  // namespace gdn
