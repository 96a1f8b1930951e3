// The Qwen3.5/3.6 chat template, statement by statement (see chat_template.hpp). The comments quote the
// Jinja they implement.

#include "gdn/text/chat_template.hpp"

#include <utf8proc.h>

#include <string_view>

#include "gdn/core/error.hpp"

namespace gdn {
namespace {

// Python's str.isspace(): general category Zs, or bidirectional class WS, B or S.
bool is_python_space(char32_t c) {
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

// Decodes the code point starting at s[i] into `cp`; returns its length (1 for a stray byte).
std::size_t decode_at(std::string_view s, std::size_t i, char32_t& cp) {
  utf8proc_int32_t c = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &c);
  if (n <= 0) {
    cp = 0xFFFD;
    return 1;
  }
  cp = static_cast<char32_t>(c);
  return static_cast<std::size_t>(n);
}

// Jinja's |trim, i.e. Python's str.strip().
std::string_view trim(std::string_view s) {
  std::size_t b = 0;
  while (b < s.size()) {
    char32_t c = 0;
    const std::size_t n = decode_at(s, b, c);
    if (!is_python_space(c)) break;
    b += n;
  }
  std::size_t e = s.size();
  while (e > b) {
    std::size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    char32_t c = 0;
    decode_at(s, start, c);
    if (!is_python_space(c)) break;
    e = start;
  }
  return s.substr(b, e - b);
}

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// render_content(content, ...)|trim for string or None content.
std::string_view content_of(const ChatMessage& m) { return m.content ? trim(*m.content) : std::string_view{}; }

[[noreturn]] void raise(const char* message) { throw Error(Status::invalid_argument, message); }

}  // namespace

std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
  if (messages.empty()) raise("No messages provided.");
  std::string out;

  // {%- if messages[0].role == 'system' %} ... '<|im_start|>system\n' + content + '<|im_end|>\n'
  if (messages[0].role == "system") {
    out += "<|im_start|>system\n";
    out += content_of(messages[0]);
    out += "<|im_end|>\n";
  }

  // The last user message that is not a tool response wrapped by hand; it decides whose reasoning stays.
  std::ptrdiff_t last_query = -1;
  for (std::ptrdiff_t i = static_cast<std::ptrdiff_t>(messages.size()) - 1; i >= 0; --i) {
    const ChatMessage& m = messages[static_cast<std::size_t>(i)];
    if (m.role != "user") continue;
    const std::string_view c = content_of(m);
    if (!(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  if (last_query < 0) raise("No user query found in messages.");

  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string_view content = content_of(m);
    if (m.role == "system") {
      if (i != 0) raise("System message must be at the beginning.");
    } else if (m.role == "user") {
      out += "<|im_start|>user\n";
      out += content;
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      // reasoning_content when it is a string, else split '<think>...</think>' off the content.
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (const auto close = content.find(kThinkClose); close != std::string_view::npos) {
        std::string_view before = rstrip_newlines(content.substr(0, close));
        if (const auto open = before.rfind(kThinkOpen); open != std::string_view::npos)
          before = before.substr(open + kThinkOpen.size());
        reasoning = lstrip_newlines(before);
        content = lstrip_newlines(content.substr(content.rfind(kThinkClose) + kThinkClose.size()));
      }
      reasoning = trim(reasoning);
      out += "<|im_start|>assistant\n";
      if (options.preserve_thinking || static_cast<std::ptrdiff_t>(i) > last_query) {
        out += "<think>\n";
        out += reasoning;
        out += "\n</think>\n\n";
      }
      out += content;
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      // Tool results are gathered into one user turn until a non-tool message follows.
      if (i > 0 && messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += content;
      out += "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      raise("Unexpected message role.");
    }
  }

  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += options.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace gdn
