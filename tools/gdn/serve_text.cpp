#include "serve_text.hpp"

#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gdn::serve {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `s` that is a proper prefix of `tag` (text that may still become it).
std::size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (std::size_t n = std::min(tag.size() - 1, s.size()); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 256) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return !is_ws(c) && c != '<' && c != '>' && c != '"'; });
}

std::optional<ojson> parse_json(std::string_view s) {
  ojson v = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return std::nullopt;
  return v;
}

}  // namespace

// --- StopText ---------------------------------------------------------------------------------------

StopText::StopText(const Tokenizer& tok, std::vector<std::string> stops)
    : decoder_(tok, true, /*skip_unknown=*/true), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) longest_ = std::max(longest_, s.size());
}

bool StopText::push(Token t, std::string& out) { return feed(decoder_.push(t), out, false); }

void StopText::finish(std::string& out) { feed(decoder_.flush(), out, true); }

bool StopText::feed(const std::string& piece, std::string& out, bool final) {
  all_ += piece;
  out.clear();
  if (!stops_.empty()) {
    const std::size_t from = emitted_ > longest_ ? emitted_ - longest_ : 0;
    std::size_t hit = std::string::npos;
    for (const auto& s : stops_) {
      const std::size_t p = all_.find(s, from);
      if (p != std::string::npos && p + s.size() > emitted_) hit = std::min(hit, p);
    }
    if (hit != std::string::npos) {
      if (hit > emitted_) out = all_.substr(emitted_, hit - emitted_);
      emitted_ = all_.size();
      return true;
    }
  }
  std::size_t end = all_.size();
  if (!final)
    for (const auto& s : stops_) end = std::min(end, all_.size() - partial_suffix(all_, s));
  if (end > emitted_) {
    out = all_.substr(emitted_, end - emitted_);
    emitted_ = end;
  }
  return false;
}

// --- ChatOutput -------------------------------------------------------------------------------------

ChatOutput::ChatOutput(bool thinking, const std::string& tools_json) : phase_(thinking ? Phase::reasoning : Phase::content) {
  std::random_device rd;
  call_salt_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  if (tools_json.empty()) return;
  const auto tools = parse_json(tools_json);
  if (!tools || !tools->is_array()) return;
  tools_ = !tools->empty();
  for (const ojson& t : *tools) {
    const ojson& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    auto& params = schema_[f["name"].get<std::string>()];
    if (!f.contains("parameters") || !f["parameters"].is_object()) continue;
    const ojson& p = f["parameters"];
    if (!p.contains("properties") || !p["properties"].is_object()) continue;
    for (const auto& [key, prop] : p["properties"].items()) {
      auto& types = params[key];
      if (!prop.is_object() || !prop.contains("type")) continue;
      if (prop["type"].is_string()) types.push_back(prop["type"].get<std::string>());
      else if (prop["type"].is_array())
        for (const ojson& ty : prop["type"])
          if (ty.is_string()) types.push_back(ty.get<std::string>());
    }
  }
}

ChatDelta ChatOutput::push(std::string_view text) {
  ChatDelta d;
  buf_ += text;
  run(d, false);
  return d;
}

ChatDelta ChatOutput::finish() {
  ChatDelta d;
  run(d, true);
  // Trailing whitespace is content unless tool calls ended the message (the template puts none there).
  if (calls_.empty() && !held_ws_.empty()) {
    d.content += held_ws_;
    content_ += held_ws_;
  }
  held_ws_.clear();
  return d;
}

void ChatOutput::emit_content(ChatDelta& d, std::string_view s) {
  std::size_t e = s.size();
  while (e > 0 && is_ws(s[e - 1])) --e;
  if (e == 0) {
    held_ws_ += s;
    return;
  }
  std::string out = held_ws_;
  out += s.substr(0, e);
  held_ws_.assign(s.substr(e));
  d.content += out;
  content_ += out;
}

void ChatOutput::run(ChatDelta& d, bool final) {
  if (phase_ == Phase::reasoning) {
    const std::size_t close = buf_.find(kThinkClose);
    const std::size_t end = close != std::string::npos ? close : final ? buf_.size() : buf_.size() - partial_suffix(buf_, kThinkClose);
    std::string_view r(buf_.data(), end);
    if (!reasoning_started_) {
      while (!r.empty() && r.front() == '\n') r.remove_prefix(1);
      reasoning_started_ = !r.empty();
    }
    if (!r.empty()) {
      // Newlines at the end are held: the template drops those before </think>.
      std::size_t e = r.size();
      while (e > 0 && r[e - 1] == '\n') --e;
      if (e > 0) {
        std::string out = reasoning_held_;
        out += r.substr(0, e);
        reasoning_held_.assign(r.substr(e));
        d.reasoning += out;
        reasoning_ += out;
      } else {
        reasoning_held_ += r;
      }
    }
    if (close == std::string::npos) {
      buf_.erase(0, end);
      return;
    }
    reasoning_held_.clear();
    buf_.erase(0, close + kThinkClose.size());
    phase_ = Phase::content;
    after_think_ = true;
  }
  if (after_think_) {
    std::size_t n = 0;
    while (n < buf_.size() && buf_[n] == '\n') ++n;
    buf_.erase(0, n);
    if (buf_.empty()) return;
    after_think_ = false;
  }
  if (!tools_) {
    if (!buf_.empty()) {
      d.content += buf_;
      content_ += buf_;
      buf_.clear();
    }
    return;
  }
  for (;;) {
    const std::size_t open = buf_.find(kCallOpen);
    if (open == std::string::npos) {
      const std::size_t keep = final ? 0 : partial_suffix(buf_, kCallOpen);
      emit_content(d, std::string_view(buf_).substr(0, buf_.size() - keep));
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    emit_content(d, std::string_view(buf_).substr(0, open));
    buf_.erase(0, open);
    const std::size_t close = buf_.find(kCallClose, kCallOpen.size());
    if (close == std::string::npos) {
      if (!final) return;  // wait for the rest of the call
      // Unterminated at the end: not a call; the text is the answer.
      std::string raw = held_ws_ + buf_;
      held_ws_.clear();
      d.content += raw;
      content_ += raw;
      buf_.clear();
      return;
    }
    const std::string_view body = std::string_view(buf_).substr(kCallOpen.size(), close - kCallOpen.size());
    if (auto call = parse_call(body)) {
      held_ws_.clear();  // the whitespace before a call belongs to the template, not the answer
      calls_.push_back(*call);
      d.tool_calls.push_back(std::move(*call));
    } else {
      std::string raw = held_ws_;
      raw += buf_.substr(0, close + kCallClose.size());
      held_ws_.clear();
      d.content += raw;
      content_ += raw;
    }
    buf_.erase(0, close + kCallClose.size());
  }
}

std::optional<ParsedToolCall> ChatOutput::parse_call(std::string_view body) const {
  body = trim_ws(body);
  ParsedToolCall call;
  call.id = fmt::format("call_{:016x}{:08x}", call_salt_ ^ (0x9e3779b97f4a7c15ULL * (calls_.size() + 1)),
                        static_cast<std::uint32_t>(calls_.size() + 1));
  // The older JSON form some checkpoints still emit: {"name": ..., "arguments": {...}}.
  if (!body.empty() && body.front() == '{') {
    const auto j = parse_json(body);
    if (!j || !j->is_object() || !j->contains("name") || !(*j)["name"].is_string()) return std::nullopt;
    call.name = (*j)["name"].get<std::string>();
    if (!valid_name(call.name)) return std::nullopt;
    ojson args = j->contains("arguments") ? (*j)["arguments"] : ojson::object();
    if (args.is_string()) {
      const auto parsed = parse_json(args.get<std::string>());
      if (!parsed) return std::nullopt;
      args = *parsed;
    }
    if (args.is_null()) args = ojson::object();
    if (!args.is_object()) return std::nullopt;
    call.arguments = args.dump();
    return call;
  }
  constexpr std::string_view kFn = "<function=", kFnClose = "</function>", kParam = "<parameter=", kParamClose = "</parameter>";
  if (!body.starts_with(kFn)) return std::nullopt;
  const std::size_t gt = body.find('>');
  if (gt == std::string_view::npos) return std::nullopt;
  call.name = std::string(trim_ws(body.substr(kFn.size(), gt - kFn.size())));
  if (!valid_name(call.name)) return std::nullopt;
  const std::size_t fn_end = body.rfind(kFnClose);
  if (fn_end == std::string_view::npos || fn_end < gt || !trim_ws(body.substr(fn_end + kFnClose.size())).empty()) return std::nullopt;
  std::string_view rest = body.substr(gt + 1, fn_end - gt - 1);
  const auto fn_schema = schema_.find(call.name);
  ojson args = ojson::object();
  for (;;) {
    rest = trim_ws(rest);
    if (rest.empty()) break;
    if (!rest.starts_with(kParam)) return std::nullopt;
    const std::size_t pgt = rest.find('>');
    if (pgt == std::string_view::npos) return std::nullopt;
    const std::string key(trim_ws(rest.substr(kParam.size(), pgt - kParam.size())));
    if (key.empty()) return std::nullopt;
    const std::size_t pend = rest.find(kParamClose, pgt + 1);
    if (pend == std::string_view::npos) return std::nullopt;
    std::string_view value = rest.substr(pgt + 1, pend - pgt - 1);
    // The template writes '>\n' + value + '\n</parameter>'.
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    std::vector<std::string> types;
    if (fn_schema != schema_.end())
      if (const auto t = fn_schema->second.find(key); t != fn_schema->second.end()) types = t->second;
    const bool has = [&](std::string_view ty) { return std::find(types.begin(), types.end(), ty) != types.end(); }("string");
    const bool only_string = has && std::all_of(types.begin(), types.end(), [](const std::string& ty) { return ty == "string" || ty == "null"; });
    ojson v;
    if (only_string && !(value == "null" && types.size() > 1)) {
      v = std::string(value);
    } else if (auto parsed = parse_json(value); parsed && !(has && parsed->is_string())) {
      v = *parsed;
    } else if (!has && (value == "True" || value == "False")) {
      v = value == "True";
    } else if (!has && value == "None") {
      v = nullptr;
    } else {
      v = std::string(value);
    }
    args[key] = std::move(v);
    rest = rest.substr(pend + kParamClose.size());
  }
  call.arguments = args.dump();
  return call;
}

}  // namespace gdn::serve
