#include "serve_api.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/text/chat_template.hpp"

namespace gdn::serve {
namespace {

[[noreturn]] void bad(const std::string& message, const std::string& param = {}) { throw ApiError(400, message, param); }

// Fields a request may carry without changing what is computed (accepted and ignored).
const std::set<std::string> kIgnored = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
                                        "safety_identifier"};

void check_fields(const ojson& body, const std::set<std::string>& known) {
  for (const auto& [key, value] : body.items())
    if (!known.count(key) && !kIgnored.count(key))
      bad(fmt::format("unknown field '{}' (this server does not know it, so it would be ignored)", key), key);
}

double number(const ojson& body, const char* key, double lo, double hi, double def) {
  if (!body.contains(key) || body[key].is_null()) return def;
  const ojson& v = body[key];
  if (!v.is_number()) bad(fmt::format("'{}' must be a number, got {}", key, v.type_name()), key);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), key);
  return x;
}

std::optional<std::int64_t> integer(const ojson& body, const char* key, std::int64_t lo, std::int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const ojson& v = body[key];
  if (!v.is_number_integer()) bad(fmt::format("'{}' must be an integer, got {}", key, v.is_number() ? "a fraction" : v.type_name()), key);
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    bad(fmt::format("'{}' must be in [{}, {}]", key, lo, hi), key);
  const std::int64_t x = v.is_number_unsigned() ? static_cast<std::int64_t>(v.get<std::uint64_t>()) : v.get<std::int64_t>();
  if (x < lo || x > hi) bad(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), key);
  return x;
}

bool boolean(const ojson& body, const char* key, bool def) {
  if (!body.contains(key) || body[key].is_null()) return def;
  if (!body[key].is_boolean()) bad(fmt::format("'{}' must be true or false, got {}", key, body[key].type_name()), key);
  return body[key].get<bool>();
}

void check_model(const ojson& body, const ServeInfo& info) {
  if (!body.contains("model") || body["model"].is_null()) return;
  if (!body["model"].is_string()) bad("'model' must be a string", "model");
  const std::string m = body["model"].get<std::string>();
  if (m != info.model_name)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", m, info.model_name), "model",
                   "invalid_request_error", "model_not_found");
}

// What every generation request shares: sampling, length, stops, streaming, the unsupported.
void common(const ojson& body, const ServeInfo& info, ApiRequest& out) {
  Request& r = *out.req;
  SamplingParams& s = r.sampling;
  s = info.defaults;
  s.temperature = static_cast<float>(number(body, "temperature", 0.0, 2.0, s.temperature));
  s.top_p = static_cast<float>(number(body, "top_p", 0.0, 1.0, s.top_p));
  if (s.top_p <= 0.0f) bad("'top_p' must be in (0, 1]", "top_p");
  if (const auto k = integer(body, "top_k", -1, 1 << 30)) s.top_k = *k < 0 ? 0 : static_cast<int>(*k);
  s.min_p = static_cast<float>(number(body, "min_p", 0.0, 1.0, s.min_p));
  s.presence_penalty = static_cast<float>(number(body, "presence_penalty", -2.0, 2.0, s.presence_penalty));
  s.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty));
  s.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 0.01, 10.0, s.repetition_penalty));
  if (const auto seed = integer(body, "seed", std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()))
    s.seed = static_cast<std::uint64_t>(*seed);
  else
    s.seed = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (const auto n = integer(body, "n", 1, 1 << 20); n && *n != 1) bad("'n' must be 1: one choice per request", "n");
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() && !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    bad("'logit_bias' is not supported", "logit_bias");

  out.stream = boolean(body, "stream", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const ojson& so = body["stream_options"];
    if (!so.is_object()) bad("'stream_options' must be an object", "stream_options");
    for (const auto& [k, v] : so.items())
      if (k != "include_usage" && k != "continuous_usage_stats") bad(fmt::format("unknown field 'stream_options.{}'", k), "stream_options");
    out.include_usage = boolean(so, "include_usage", false);
    out.continuous_usage = boolean(so, "continuous_usage_stats", false);
  }

  // Stops: the model's eos ids (and <|im_end|> for chat) unless ignore_eos, extra ids, strings.
  const bool ignore_eos = boolean(body, "ignore_eos", false);
  if (!ignore_eos) {
    r.stop_tokens = info.eos;
    if (out.chat && info.im_end) r.stop_tokens.push_back(*info.im_end);
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    const ojson& ids = body["stop_token_ids"];
    if (!ids.is_array()) bad("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    for (const ojson& id : ids) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= info.vocab)
        bad(fmt::format("'stop_token_ids' holds {}, not a token id in [0, {})", id.dump(), info.vocab), "stop_token_ids");
      r.stop_tokens.push_back(id.get<Token>());
    }
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const ojson& st = body["stop"];
    if (st.is_string()) {
      r.stop_strings.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      if (st.size() > 16) bad("'stop' holds more than 16 strings", "stop");
      for (const ojson& x : st) {
        if (!x.is_string()) bad("'stop' must be a string or an array of strings", "stop");
        r.stop_strings.push_back(x.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or an array of strings", "stop");
    }
    for (const auto& x : r.stop_strings)
      if (x.empty()) bad("'stop' strings must not be empty", "stop");
  }
  if (boolean(body, "skip_special_tokens", true) == false) bad("'skip_special_tokens': false is not supported", "skip_special_tokens");
  r.use_cache = boolean(body, "cache_prompt", true);
}

// max_tokens after the prompt is known: the rest of the context by default.
void lengths(const ojson& body, const ServeInfo& info, ApiRequest& out) {
  Request& r = *out.req;
  const auto P = static_cast<std::int64_t>(r.prompt.size());
  if (P == 0) bad("the prompt is empty", out.chat ? "messages" : "prompt");
  std::optional<std::int64_t> mt = integer(body, "max_completion_tokens", 1, 1 << 30);
  if (!mt) mt = integer(body, "max_tokens", 1, 1 << 30);
  const std::int64_t room = info.max_context - P;
  if (room < 1 || (mt && *mt > room))
    bad(fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the {}, {} "
                    "for the completion). Please reduce the length of the {} or the completion.",
                    info.max_context, P + (mt ? *mt : 1), P, out.chat ? "messages" : "prompt", mt ? *mt : 1,
                    out.chat ? "messages" : "prompt"),
        out.chat ? "messages" : "prompt");
  r.max_tokens = static_cast<int>(mt ? *mt : room);
}

}  // namespace

std::string error_body(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  ojson e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return ojson{{"error", e}}.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

SamplingParams generation_defaults(const std::string& model_dir) {
  SamplingParams s;
  s.temperature = 1.0f;  // OpenAI's default when the checkpoint says nothing
  std::ifstream in(std::filesystem::path(model_dir) / "generation_config.json");
  if (!in) return s;
  const ojson g = ojson::parse(in, nullptr, false);
  if (!g.is_object()) return s;
  if (g.contains("temperature") && g["temperature"].is_number()) s.temperature = g["temperature"].get<float>();
  if (g.contains("top_p") && g["top_p"].is_number()) s.top_p = g["top_p"].get<float>();
  if (g.contains("top_k") && g["top_k"].is_number_integer()) s.top_k = std::max(0, g["top_k"].get<int>());
  if (g.contains("min_p") && g["min_p"].is_number()) s.min_p = g["min_p"].get<float>();
  if (g.contains("repetition_penalty") && g["repetition_penalty"].is_number()) s.repetition_penalty = g["repetition_penalty"].get<float>();
  if (g.contains("do_sample") && g["do_sample"].is_boolean() && !g["do_sample"].get<bool>()) s.temperature = 0.0f;
  return s;
}

ApiRequest parse_chat_request(const ojson& body, const ServeInfo& info) {
  if (!body.is_object()) bad("the request body must be a JSON object");
  check_fields(body, {"model", "messages", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens",
                      "stop", "stream", "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "n",
                      "tools", "tool_choice", "logprobs", "top_logprobs", "logit_bias", "response_format",
                      "chat_template_kwargs", "ignore_eos", "stop_token_ids", "skip_special_tokens", "add_generation_prompt",
                      "cache_prompt", "functions", "function_call", "modalities", "audio", "prediction", "reasoning_effort"});
  check_model(body, info);
  ApiRequest out;
  out.chat = true;
  out.req = std::make_shared<Request>();
  if (boolean(body, "logprobs", false)) bad("'logprobs' is not supported", "logprobs");
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) bad("'top_logprobs' is not supported", "top_logprobs");
  for (const char* k : {"functions", "function_call", "audio", "prediction"})
    if (body.contains(k) && !body[k].is_null()) bad(fmt::format("'{}' is not supported (use 'tools')", k), k);
  if (body.contains("modalities") && !body["modalities"].is_null() && body["modalities"] != ojson::array({"text"}))
    bad("only the 'text' modality is supported", "modalities");
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    const ojson& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || rf["type"] != "text")
      bad("'response_format' other than {\"type\": \"text\"} is not supported (no constrained decoding)", "response_format");
  }
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null() && !body["reasoning_effort"].is_string())
    bad("'reasoning_effort' must be a string", "reasoning_effort");
  if (!body.contains("messages")) bad("'messages' is required", "messages");
  const ojson& messages = body["messages"];
  if (!messages.is_array() || messages.empty()) bad("'messages' must be a non-empty array", "messages");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) bad(fmt::format("messages[{}] must be an object", i), "messages");
    if (!m.contains("role") || !m["role"].is_string()) bad(fmt::format("messages[{}].role must be a string", i), "messages");
    for (const auto& [k, v] : m.items())
      if (k != "role" && k != "content" && k != "name" && k != "tool_calls" && k != "tool_call_id" && k != "reasoning_content" &&
          k != "reasoning" && k != "refusal" && k != "annotations" && k != "audio" && k != "function_call")
        bad(fmt::format("messages[{}] has an unknown field '{}'", i, k), "messages");
    if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() && !m["content"].is_array())
      bad(fmt::format("messages[{}].content must be a string, an array of parts or null", i), "messages");
  }

  // Tools: rendered into the prompt and parsed out of the answer, unless tool_choice is "none".
  std::string tools_json;
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) bad("'tools' must be an array", "tools");
    for (std::size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string())
        bad(fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., ...}}}}", i), "tools");
    }
    if (!tools.empty()) tools_json = tools.dump();
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& tc = body["tool_choice"];
    if (tc == "none") tools_json.clear();
    else if (tc == "auto") {
    } else if (tc == "required" || tc.is_object())
      bad("'tool_choice' \"required\" or a named function is not supported (no constrained decoding); use \"auto\"", "tool_choice");
    else
      bad("'tool_choice' must be \"none\", \"auto\", \"required\" or an object", "tool_choice");
  }

  ChatOptions opt;
  opt.add_generation_prompt = boolean(body, "add_generation_prompt", true);
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    const ojson& kw = body["chat_template_kwargs"];
    if (!kw.is_object()) bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const auto& [k, v] : kw.items())
      if (k != "enable_thinking" && k != "preserve_thinking")
        bad(fmt::format("'chat_template_kwargs.{}' is not a variable of this chat template", k), "chat_template_kwargs");
    opt.enable_thinking = boolean(kw, "enable_thinking", true);
    opt.preserve_thinking = boolean(kw, "preserve_thinking", false);
  }
  std::string text;
  try {
    text = render_chat_json(messages.dump(), tools_json, opt);
  } catch (const Error& e) {
    bad(e.what(), "messages");
  }
  out.thinking = opt.add_generation_prompt && text.ends_with("<think>\n");
  out.tools_json = tools_json;
  out.req->prompt = info.tokenizer->encode(text);
  for (const Token t : out.req->prompt)
    if (t >= info.vocab) bad(fmt::format("the tokenizer produced id {}, outside the model's vocabulary of {}", t, info.vocab), "messages");
  // Where turns start: other conversations share the system turn, this one's next request everything
  // before its last turn.
  if (info.im_start) {
    const auto& p = out.req->prompt;
    for (std::size_t i = 1; i < p.size(); ++i)
      if (p[i] == *info.im_start) out.req->boundaries.push_back(static_cast<std::int64_t>(i));
  }
  common(body, info, out);
  lengths(body, info, out);
  return out;
}

ApiRequest parse_completion_request(const ojson& body, const ServeInfo& info) {
  if (!body.is_object()) bad("the request body must be a JSON object");
  check_fields(body, {"model", "prompt", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "stop", "stream",
                      "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "n", "echo", "logprobs",
                      "suffix", "best_of", "logit_bias", "ignore_eos", "stop_token_ids", "skip_special_tokens", "cache_prompt"});
  check_model(body, info);
  ApiRequest out;
  out.req = std::make_shared<Request>();
  if (boolean(body, "echo", false)) bad("'echo' is not supported", "echo");
  if (body.contains("logprobs") && !body["logprobs"].is_null()) bad("'logprobs' is not supported", "logprobs");
  if (body.contains("suffix") && !body["suffix"].is_null()) bad("'suffix' is not supported", "suffix");
  if (const auto b = integer(body, "best_of", 1, 1 << 20); b && *b != 1) bad("'best_of' must be 1", "best_of");
  if (!body.contains("prompt")) bad("'prompt' is required", "prompt");
  ojson prompt = body["prompt"];
  // One prompt: a string, a list of token ids, or a one-element list of either.
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = ojson(prompt[0]);
  if (prompt.is_string()) {
    out.req->prompt = info.tokenizer->encode(prompt.get<std::string>());
  } else if (prompt.is_array()) {
    for (const ojson& id : prompt) {
      if (id.is_string() || id.is_array()) bad("only one prompt per request is supported", "prompt");
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= info.vocab)
        bad(fmt::format("'prompt' holds {}, not a token id in [0, {})", id.dump(), info.vocab), "prompt");
      out.req->prompt.push_back(id.get<Token>());
    }
  } else {
    bad("'prompt' must be a string or an array of token ids", "prompt");
  }
  for (const Token t : out.req->prompt)
    if (t >= info.vocab) bad(fmt::format("the tokenizer produced id {}, outside the model's vocabulary of {}", t, info.vocab), "prompt");
  common(body, info, out);
  lengths(body, info, out);
  return out;
}

std::size_t invalid_utf8_at(std::string_view s) {
  std::size_t i = 0;
  const auto byte = [&](std::size_t j) { return static_cast<unsigned char>(s[j]); };
  while (i < s.size()) {
    const unsigned char c = byte(i);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return i;
    }
    for (std::size_t j = 1; j <= n; ++j) {
      if (i + j >= s.size() || (byte(i + j) & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (byte(i + j) & 0x3F);
    }
    // Overlong forms, surrogates, beyond U+10FFFF.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n + 1;
  }
  return std::string_view::npos;
}

}  // namespace gdn::serve
