// The Qwen3.5/3.6 chat template, statement by statement (see chat_template.hpp). The comments quote the
// Jinja they implement. Tools and tool-call arguments are JSON; the template writes them with
// transformers' tojson filter, i.e. Python's json.dumps(x, ensure_ascii=False), reproduced here.

#include "gdn/text/chat_template.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
[[noreturn]] void refuse(const std::string& message) { throw Error(Status::invalid_argument, message); }

// JSON with the keys in the order given, as Python dicts keep them.
using ojson = nlohmann::ordered_json;

ojson parse_json(std::string_view text, std::string_view what) {
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    refuse(fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

// repr(float): the shortest digits that round-trip, in fixed notation when -4 < decpt <= 16, else as
// d.ddde±XX (CPython's float_repr_style 'short').
void python_float(double x, std::string& out) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view s(buf, static_cast<std::size_t>(r.ptr - buf));
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const std::size_t e = s.find('e');
  const int exp = std::atoi(std::string(s.substr(e + 1)).c_str());
  std::string digits;
  for (const char c : s.substr(0, e))
    if (c != '.') digits += c;
  const int decpt = exp + 1, n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    const auto d = static_cast<std::size_t>(std::max(decpt, 0));
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<std::size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(d - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, d);
      out += '.';
      out.append(digits, d);
    }
  } else {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out.append(digits, 1);
    }
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
}

// json.dumps' string escaping with ensure_ascii=False: only '"', '\\' and control characters.
void python_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
        else out += ch;
    }
  }
  out += '"';
}

void python_dumps(const ojson& v, std::string& out) {
  switch (v.type()) {
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += ", ";
        first = false;
        python_string(k, out);
        out += ": ";
        python_dumps(x, out);
      }
      out += '}';
      break;
    }
    case ojson::value_t::array: {
      out += '[';
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        python_dumps(v[i], out);
      }
      out += ']';
      break;
    }
    case ojson::value_t::string: python_string(v.get_ref<const std::string&>(), out); break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<std::int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<std::uint64_t>()); break;
    case ojson::value_t::number_float: python_float(v.get<double>(), out); break;
    default: out += "null"; break;
  }
}

// A tool call's arguments as the object the template iterates: an object's JSON text, or a JSON string
// holding one (OpenAI's form), parsed again.
ojson tool_arguments(const ToolCall& tc) {
  if (tc.arguments.empty()) return ojson::object();
  ojson a = parse_json(tc.arguments, fmt::format("the arguments of tool call '{}'", tc.name));
  if (a.is_string()) a = parse_json(a.get_ref<const std::string&>(), fmt::format("the arguments string of tool call '{}'", tc.name));
  if (a.is_null()) return ojson::object();
  if (!a.is_object()) refuse(fmt::format("the arguments of tool call '{}' must be a JSON object, got {}", tc.name, a.type_name()));
  return a;
}

constexpr std::string_view kToolsIntro = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsOutro =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

}  // namespace

std::string python_json_dumps(std::string_view json) {
  std::string out;
  python_dumps(parse_json(json, "the value"), out);
  return out;
}

std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
  if (messages.empty()) raise("No messages provided.");
  std::string out;

  // {%- if tools and tools is iterable and tools is not mapping %} '<|im_start|>system\n# Tools...' +
  // tool|tojson per tool + the instructions + ('\n\n' + system content, when there is any) + '<|im_end|>\n'
  if (!options.tools.empty()) {
    out += "<|im_start|>system\n";
    out += kToolsIntro;
    for (const std::string& tool : options.tools) {
      out += '\n';
      python_dumps(parse_json(tool, "a tool"), out);
    }
    out += kToolsOutro;
    if (messages[0].role == "system") {
      const std::string_view content = content_of(messages[0]);
      if (!content.empty()) {
        out += "\n\n";
        out += content;
      }
    }
    out += "<|im_end|>\n";
  } else if (messages[0].role == "system") {
    // {%- if messages[0].role == 'system' %} ... '<|im_start|>system\n' + content + '<|im_end|>\n'
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
      // Each call: '<tool_call>\n<function=' + name + '>\n' ('\n\n' before the first when content|trim is not
      // empty, '\n' before later ones), '<parameter=' + key + '>\n' + value + '\n</parameter>\n' per argument
      // (strings as they are, anything else |tojson), then '</function>\n</tool_call>'.
      for (std::size_t j = 0; j < m.tool_calls.size(); ++j) {
        const ToolCall& tc = m.tool_calls[j];
        if (j > 0) out += "\n<tool_call>\n<function=";
        else out += trim(content).empty() ? "<tool_call>\n<function=" : "\n\n<tool_call>\n<function=";
        out += tc.name;
        out += ">\n";
        const ojson args = tool_arguments(tc);
        for (const auto& [key, value] : args.items()) {
          out += "<parameter=";
          out += key;
          out += ">\n";
          if (value.is_string()) out += value.get_ref<const std::string&>();
          else python_dumps(value, out);
          out += "\n</parameter>\n";
        }
        out += "</function>\n</tool_call>";
      }
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

namespace {

// render_content(content): a string, None, or a list of parts whose texts are joined. Vision parts are
// refused: the template would put placeholders for pixels this text-only model never sees.
std::optional<std::string> content_from_json(const ojson& c, const std::string& where) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) raise("Unexpected content type.");
  std::string text;
  for (std::size_t j = 0; j < c.size(); ++j) {
    const ojson& item = c[j];
    if (!item.is_object()) raise("Unexpected item type in content.");
    const std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "";
    if (item.contains("image") || item.contains("image_url") || type == "image" || type == "image_url" || type == "input_image")
      refuse(fmt::format("{}.content[{}] is an image: this model takes text only (libgdn runs its language model)", where, j));
    if (item.contains("video") || type == "video" || type == "video_url")
      refuse(fmt::format("{}.content[{}] is a video: this model takes text only (libgdn runs its language model)", where, j));
    if (!item.contains("text")) raise("Unexpected item type in content.");
    if (!item["text"].is_string()) refuse(fmt::format("{}.content[{}].text must be a string", where, j));
    text += item["text"].get<std::string>();
  }
  return text;
}

ToolCall tool_call_from_json(const ojson& tc, const std::string& where) {
  if (!tc.is_object()) refuse(where + " must be an object");
  // {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}
  const ojson& f = tc.contains("function") ? tc["function"] : tc;
  if (!f.is_object()) refuse(where + ".function must be an object");
  if (!f.contains("name") || !f["name"].is_string() || f["name"].get_ref<const std::string&>().empty())
    refuse(where + " has no function name");
  ToolCall out;
  out.name = f["name"].get<std::string>();
  if (f.contains("arguments") && !f["arguments"].is_null()) {
    const ojson& a = f["arguments"];
    if (!a.is_object() && !a.is_string()) refuse(where + ".arguments must be an object or a JSON string");
    out.arguments = a.dump();
    tool_arguments(out);  // refuses a string that does not hold an object, with its own message
  }
  return out;
}

}  // namespace

std::vector<ChatMessage> chat_messages_from_json(std::string_view messages_json) {
  const ojson list = parse_json(messages_json, "messages");
  if (!list.is_array()) refuse("messages must be a JSON array");
  std::vector<ChatMessage> out;
  out.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const ojson& m = list[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) refuse(where + " must be an object");
    ChatMessage msg;
    if (m.contains("role")) {
      if (!m["role"].is_string()) refuse(where + ".role must be a string");
      msg.role = m["role"].get<std::string>();
    }
    if (m.contains("content")) msg.content = content_from_json(m["content"], where);
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    // {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const ojson& calls = m["tool_calls"];
      if (!calls.is_array()) refuse(where + ".tool_calls must be an array");
      for (std::size_t j = 0; j < calls.size(); ++j)
        msg.tool_calls.push_back(tool_call_from_json(calls[j], fmt::format("{}.tool_calls[{}]", where, j)));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::string render_chat_json(std::string_view messages_json, std::string_view tools_json, const ChatOptions& options) {
  ChatOptions o = options;
  o.tools.clear();
  if (!tools_json.empty()) {
    const ojson tools = parse_json(tools_json, "tools");
    if (!tools.is_null() && !tools.is_array()) refuse("tools must be a JSON array");
    if (tools.is_array())
      for (const ojson& t : tools) o.tools.push_back(t.dump());
  }
  return render_chat(chat_messages_from_json(messages_json), o);
}

}  // namespace gdn
