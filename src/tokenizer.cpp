// Byte-level BPE from tokenizer.json. Every step mirrors the Rust `tokenizers` crate (the reference for
// tokenizer.json), including its corner cases: leftmost-longest added-token matching, per-piece
// normalisation, Split behaviours, the heap-ordered BPE merge loop and lossy UTF-8 decoding.

#include "gdn/io/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "gdn/core/error.hpp"

namespace gdn {

using json = nlohmann::json;

namespace detail {

// ---------------------------------------------------------------------------------------------
// UTF-8

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the well-formed sequence starting at b[i] (0 when ill-formed), and in `got` how many of its
// bytes are present and well-formed so far (the maximal subpart when ill-formed or cut off).
int utf8_sequence(std::string_view b, std::size_t i, int& got) noexcept {
  // Unicode's table of well-formed UTF-8 (Table 3-7): lead byte range, continuation bytes, and the range of
  // the first continuation byte (which excludes overlong forms, surrogates and code points past U+10FFFF).
  struct Lead {
    unsigned char first, last;
    int need;
    unsigned char lo, hi;
  };
  static constexpr Lead kLeads[] = {{0xC2, 0xDF, 1, 0x80, 0xBF}, {0xE0, 0xE0, 2, 0xA0, 0xBF},
                                    {0xE1, 0xEC, 2, 0x80, 0xBF}, {0xED, 0xED, 2, 0x80, 0x9F},
                                    {0xEE, 0xEF, 2, 0x80, 0xBF}, {0xF0, 0xF0, 3, 0x90, 0xBF},
                                    {0xF1, 0xF3, 3, 0x80, 0xBF}, {0xF4, 0xF4, 3, 0x80, 0x8F}};
  const auto c = static_cast<unsigned char>(b[i]);
  got = 1;
  if (c < 0x80) return 1;
  const Lead* lead = nullptr;
  for (const Lead& l : kLeads)
    if (c >= l.first && c <= l.last) lead = &l;
  if (lead == nullptr) return 0;
  for (int k = 0; k < lead->need; ++k) {
    if (i + 1 + static_cast<std::size_t>(k) >= b.size()) return 0;
    const auto d = static_cast<unsigned char>(b[i + 1 + static_cast<std::size_t>(k)]);
    if (d < (k == 0 ? lead->lo : 0x80) || d > (k == 0 ? lead->hi : 0xBF)) return 0;
    ++got;
  }
  return lead->need + 1;
}

// Decodes the code point at s[i] (s is valid UTF-8) and advances i.
char32_t next_cp(std::string_view s, std::size_t& i) noexcept {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_cp(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Rust's White_Space, used by lstrip / rstrip (utf8proc knows categories, not that property; the property is
// exactly the three separator categories plus these controls).
bool is_white_space(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85) return true;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

// Rust regex's \w, used by single_word.
bool is_word_char(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return c == 0x200C || c == 0x200D;
  }
}

}  // namespace

std::size_t utf8_error_offset(std::string_view text) noexcept {
  std::size_t i = 0;
  while (i < text.size()) {
    int got = 0;
    const int n = utf8_sequence(text, i, got);
    if (n == 0) return i;
    i += static_cast<std::size_t>(n);
  }
  return std::string_view::npos;
}

std::size_t append_utf8_lossy(std::string& out, std::string_view bytes, bool final) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    int got = 0;
    const int n = utf8_sequence(bytes, i, got);
    if (n > 0) {
      out.append(bytes.substr(i, static_cast<std::size_t>(n)));
      i += static_cast<std::size_t>(n);
      continue;
    }
    // Cut off by the end of the input but well-formed so far: may still complete.
    if (!final && i + static_cast<std::size_t>(got) == bytes.size() && static_cast<unsigned char>(bytes[i]) >= 0xC2 &&
        static_cast<unsigned char>(bytes[i]) <= 0xF4)
      return i;
    out.append(kReplacement);
    i += static_cast<std::size_t>(got);
  }
  return i;
}

namespace {

// ---------------------------------------------------------------------------------------------
// GPT-2's byte <-> code point table: printable Latin-1 bytes stand for themselves, the other 68 bytes
// are moved to U+0100.. in byte order. Every code point of the table is below U+0144.

struct ByteTable {
  std::array<std::string, 256> encode;  // byte -> UTF-8 of its code point
  std::array<int, 0x144> decode;        // code point -> byte, or -1
  ByteTable() {
    decode.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      append_cp(encode[static_cast<std::size_t>(b)], cp);
      decode[cp] = b;
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

// ---------------------------------------------------------------------------------------------
// Regex. tokenizer.json patterns are Oniguruma patterns; PCRE2 (UTF + UCP) reads them the same way except
// for \s, which PCRE2 also lets match U+180E, so \s / \S become the White_Space property that Oniguruma
// uses. \d and \w get Oniguruma's Unicode meaning as well.

std::string oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  int depth = 0;  // inside a [...] class
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's')
        out += "\\p{White_Space}";
      else if (e == 'S')
        out += "\\P{White_Space}";
      else if (e == 'd')
        out += "\\p{Nd}";
      else if (e == 'w')
        out += depth ? "\\p{L}\\p{M}\\p{Nd}\\p{Pc}" : "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";
      else if (e == 'W' && !depth)
        out += "[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";
      else
        out.append({c, e});
      continue;
    }
    if (c == '[') {
      ++depth;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is literal
      continue;
    }
    if (c == ']' && depth) --depth;
    out += c;
  }
  return out;
}

struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() {
    if (data == nullptr || context == nullptr) throw Error(Status::internal, "pcre2: out of memory");
    if (stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

class Regex {
 public:
  Regex(std::string_view pattern, std::string_view what) : what_(what) {
    const std::string p = oniguruma_to_pcre2(pattern);
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(Status::invalid_file, fmt::format("{}: regex does not compile at offset {}: {}", what, at,
                                                    reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // the interpreter is the fallback when JIT is unavailable
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // f(begin, end) for each successive match, as Oniguruma's find_iter reports them (an empty match moves
  // the search on by one character). `s` must be valid UTF-8.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    thread_local MatchState st;
    // Oniguruma has no match limit, and Qwen's pattern backtracks once over a whitespace run (\s*[\r\n]+
    // gives way to \s+(?!\S)), so PCRE2's fixed default of ten million steps would refuse long runs. A
    // budget that grows with the text keeps that linear work legal but still stops a pathological pattern.
    pcre2_set_match_limit(st.context, static_cast<std::uint32_t>(std::min<std::size_t>(
                                          10'000'000 + 64 * s.size(), std::numeric_limits<std::uint32_t>::max())));
    std::size_t start = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        // The pattern came from the tokenizer file: a pattern that cannot finish is the file's fault.
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error(Status::invalid_file, fmt::format("{}: regex gave up on a {}-byte text: {}", what_, s.size(),
                                                      reinterpret_cast<const char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
      const std::size_t b = ov[0], e = ov[1];
      f(b, e);
      if (e > b) {
        start = e;
      } else {
        if (e >= s.size()) return;
        std::size_t next = e;
        next_cp(s, next);
        start = next;
      }
    }
  }

 private:
  std::string what_;
  pcre2_code* code_ = nullptr;
};

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kByteLevelRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// Pipeline pieces

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreStep {
  enum Kind { split, byte_level } kind = split;
  std::shared_ptr<const Regex> regex;  // split with a Regex pattern; byte_level with use_regex
  std::string literal;                 // split with a String pattern
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

struct MergeEntry {
  std::int32_t rank;
  std::int32_t new_id;
};

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

}  // namespace
}  // namespace detail

struct Tokenizer::Impl {
  std::string what;
  // Model
  detail::StringMap vocab;  // BPE vocabulary
  std::unordered_map<std::uint64_t, detail::MergeEntry> merges;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::optional<std::int32_t> unk_id;
  // Ids
  std::vector<std::string> id_token;  // id -> token string ("" for a hole)
  std::vector<std::string> id_bytes;  // id -> bytes it decodes to
  std::vector<std::uint8_t> id_kind;  // 0 hole, 1 vocabulary, 2 added, 3 added special
  std::vector<AddedToken> added;
  detail::StringMap added_by_content;
  // Added tokens by first byte, longest first (leftmost-longest matching).
  std::array<std::vector<std::size_t>, 256> raw_first, norm_first;
  bool any_normalized_added = false;
  // Normaliser: utf8proc option sets applied in order.
  std::vector<int> normalizers;
  std::vector<detail::PreStep> pre;
  bool decoder_byte_level = true;
  // Word cache (pre-token -> ids), bounded.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, detail::StringHash, std::equal_to<>> cache;

  void bpe(std::string_view word, std::vector<std::int32_t>& out) const;
  void model_tokenize(std::string_view word, std::vector<std::int32_t>& out) const;
  std::string normalize(std::string_view s) const;
  void pre_tokenize_and_model(std::string_view s, std::vector<std::int32_t>& out) const;
  void split_added(std::string_view s, bool normalized_pass, bool parse_special,
                   std::vector<std::pair<std::string_view, std::int32_t>>& out) const;
};

namespace detail {
namespace {

// ---------------------------------------------------------------------------------------------
// JSON access with messages that name the field.

[[noreturn]] void bad(std::string_view what, std::string_view field, std::string_view msg) {
  throw Error(Status::invalid_file, fmt::format("{}: {}: {}", what, field, msg));
}
[[noreturn]] void unsupported(std::string_view what, std::string_view field, std::string_view msg) {
  throw Error(Status::unsupported_model, fmt::format("{}: {}: {}", what, field, msg));
}

const json* member(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return (it == obj.end() || it->is_null()) ? nullptr : &*it;
}
bool get_bool(const json& obj, const char* key, bool dflt, std::string_view what, std::string_view field) {
  const json* v = member(obj, key);
  if (v == nullptr) return dflt;
  if (!v->is_boolean()) bad(what, fmt::format("{}.{}", field, key), "must be a boolean");
  return v->get<bool>();
}
std::string get_string(const json& obj, const char* key, std::string_view what, std::string_view field) {
  const json* v = member(obj, key);
  if (v == nullptr || !v->is_string()) bad(what, fmt::format("{}.{}", field, key), "must be a string");
  return v->get<std::string>();
}
std::string type_of(const json& obj, std::string_view what, std::string_view field) {
  if (!obj.is_object()) bad(what, field, "must be an object or null");
  return get_string(obj, "type", what, field);
}

std::int32_t get_id(const json& v, std::string_view what, std::string_view field) {
  if (!v.is_number_integer()) bad(what, field, "must be an integer id");
  const auto id = v.get<std::int64_t>();
  if (id < 0 || id > 0x7FFFFFFE) bad(what, field, fmt::format("id {} out of range", id));
  return static_cast<std::int32_t>(id);
}

constexpr int kMaxNesting = 16;  // Sequence inside Sequence; real files use one level

void parse_normalizer(const json& n, std::vector<int>& out, std::string_view what, std::string_view field,
                      int depth = 0) {
  if (depth > kMaxNesting) bad(what, field, "is nested too deeply");
  const std::string type = type_of(n, what, field);
  if (type == "NFC")
    out.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  else if (type == "NFD")
    out.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  else if (type == "NFKC")
    out.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  else if (type == "NFKD")
    out.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  else if (type == "Sequence") {
    const json* list = member(n, "normalizers");
    if (list == nullptr || !list->is_array()) bad(what, fmt::format("{}.normalizers", field), "must be an array");
    for (std::size_t i = 0; i < list->size(); ++i)
      parse_normalizer((*list)[i], out, what, fmt::format("{}.normalizers[{}]", field, i), depth + 1);
  } else {
    unsupported(what, field, fmt::format("normalizer type \"{}\" is not supported", type));
  }
}

void parse_pre_tokenizer(const json& p, std::vector<PreStep>& out, std::string_view what, std::string_view field,
                         int depth = 0) {
  if (depth > kMaxNesting) bad(what, field, "is nested too deeply");
  const std::string type = type_of(p, what, field);
  if (type == "Sequence") {
    const json* list = member(p, "pretokenizers");
    if (list == nullptr || !list->is_array()) bad(what, fmt::format("{}.pretokenizers", field), "must be an array");
    for (std::size_t i = 0; i < list->size(); ++i)
      parse_pre_tokenizer((*list)[i], out, what, fmt::format("{}.pretokenizers[{}]", field, i), depth + 1);
    return;
  }
  PreStep step;
  if (type == "ByteLevel") {
    step.kind = PreStep::byte_level;
    step.add_prefix_space = get_bool(p, "add_prefix_space", true, what, field);
    if (get_bool(p, "use_regex", true, what, field)) step.regex = std::make_shared<Regex>(kByteLevelRegex, what);
  } else if (type == "Split") {
    const json* pat = member(p, "pattern");
    if (pat == nullptr || !pat->is_object()) bad(what, fmt::format("{}.pattern", field), "must be an object");
    const std::string pfield = fmt::format("{}.pattern", field);
    if (const json* re = member(*pat, "Regex")) {
      if (!re->is_string()) bad(what, pfield + ".Regex", "must be a string");
      step.regex = std::make_shared<Regex>(re->get<std::string>(), fmt::format("{}: {}.Regex", what, pfield));
    } else if (const json* lit = member(*pat, "String")) {
      if (!lit->is_string() || lit->get<std::string>().empty())
        bad(what, pfield + ".String", "must be a non-empty string");
      step.literal = lit->get<std::string>();
    } else {
      bad(what, pfield, "needs \"Regex\" or \"String\"");
    }
    const std::string b = get_string(p, "behavior", what, field);
    if (b == "Removed")
      step.behavior = Behavior::removed;
    else if (b == "Isolated")
      step.behavior = Behavior::isolated;
    else if (b == "MergedWithPrevious")
      step.behavior = Behavior::merged_with_previous;
    else if (b == "MergedWithNext")
      step.behavior = Behavior::merged_with_next;
    else if (b == "Contiguous")
      step.behavior = Behavior::contiguous;
    else
      bad(what, fmt::format("{}.behavior", field), fmt::format("unknown behavior \"{}\"", b));
    step.invert = get_bool(p, "invert", false, what, field);
  } else {
    unsupported(what, field, fmt::format("pre-tokenizer type \"{}\" is not supported", type));
  }
  out.push_back(std::move(step));
}

// tokenizers' NormalizedString::split: the pattern's matches and the gaps between them, then the behaviour
// decides which are kept and what they are glued to.
void split_piece(const PreStep& step, std::string_view s, std::vector<std::string>& out) {
  if (s.empty()) return;
  std::vector<std::pair<std::pair<std::size_t, std::size_t>, bool>> m;  // (range, is_match)
  std::size_t prev = 0;
  auto add = [&](std::size_t b, std::size_t e) {
    if (prev != b) m.push_back({{prev, b}, false});
    m.push_back({{b, e}, true});
    prev = e;
  };
  if (step.regex) {
    step.regex->for_each_match(s, add);
  } else {
    for (std::size_t at = s.find(step.literal); at != std::string_view::npos; at = s.find(step.literal, prev))
      add(at, at + step.literal.size());
  }
  if (prev != s.size()) m.push_back({{prev, s.size()}, false});
  if (step.invert)
    for (auto& x : m) x.second = !x.second;

  std::vector<std::pair<std::pair<std::size_t, std::size_t>, bool>> keep;  // (range, remove)
  bool previous = false;
  switch (step.behavior) {
    case Behavior::isolated:
      for (auto& x : m) keep.push_back({x.first, false});
      break;
    case Behavior::removed:
      keep = m;
      break;
    case Behavior::contiguous:
      for (auto& x : m) {
        if (x.second == previous && !keep.empty())
          keep.back().first.second = x.first.second;
        else
          keep.push_back({x.first, false});
        previous = x.second;
      }
      break;
    case Behavior::merged_with_previous:
      for (auto& x : m) {
        if (x.second && !previous && !keep.empty())
          keep.back().first.second = x.first.second;
        else
          keep.push_back({x.first, false});
        previous = x.second;
      }
      break;
    case Behavior::merged_with_next:
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->second && !previous && !keep.empty())
          keep.back().first.first = it->first.first;
        else
          keep.push_back({it->first, false});
        previous = it->second;
      }
      std::reverse(keep.begin(), keep.end());
      break;
  }
  for (auto& [r, remove] : keep)
    if (!remove && r.second > r.first) out.emplace_back(s.substr(r.first, r.second - r.first));
}

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Encoding

std::string Tokenizer::Impl::normalize(std::string_view s) const {
  std::string cur(s);
  for (const int options : normalizers) {
    bool ascii = true;
    for (const char c : cur) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    if (ascii) break;  // ASCII is invariant under every normal form
    utf8proc_uint8_t* dst = nullptr;
    const auto n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()), static_cast<utf8proc_ssize_t>(cur.size()),
                     &dst, static_cast<utf8proc_option_t>(options));
    if (n < 0) throw Error(Status::invalid_argument, fmt::format("normalisation failed: {}", utf8proc_errmsg(n)));
    cur.assign(reinterpret_cast<const char*>(dst), static_cast<std::size_t>(n));
    std::free(dst);
  }
  return cur;
}

// tokenizers' Word::merge_all: a min-heap on (rank, position); stale entries are recognised by the merge
// that their pair would produce now.
void Tokenizer::Impl::bpe(std::string_view word, std::vector<std::int32_t>& out) const {
  struct Symbol {
    std::int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  std::size_t i = 0;
  while (i < word.size()) {
    const std::size_t b = i;
    detail::next_cp(word, i);
    const std::string_view ch = word.substr(b, i - b);
    auto add = [&](std::int32_t id) {
      sym.push_back({id, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, true});
    };
    if (auto it = vocab.find(ch); it != vocab.end()) {
      add(it->second);
      continue;
    }
    if (byte_fallback) {
      std::vector<std::int32_t> ids;
      for (const char c : ch) {
        auto f = vocab.find(fmt::format("<0x{:02X}>", static_cast<unsigned char>(c)));
        if (f == vocab.end()) {
          ids.clear();
          break;
        }
        ids.push_back(f->second);
      }
      if (!ids.empty()) {
        for (auto id : ids) add(id);
        continue;
      }
    }
    if (unk_id) {
      if (fuse_unk && !sym.empty() && sym.back().id == *unk_id) continue;
      add(*unk_id);
    }
    // Without an unknown token the character is dropped, as tokenizers does.
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Cand {
    std::int32_t rank;
    int pos;
    std::int32_t new_id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand> q;
  auto find = [&](std::int32_t a, std::int32_t b) -> const detail::MergeEntry* {
    const auto it = merges.find(detail::pair_key(a, b));
    return it == merges.end() ? nullptr : &it->second;
  };
  for (std::size_t k = 0; k + 1 < sym.size(); ++k)
    if (const auto* m = find(sym[k].id, sym[k + 1].id)) q.push({m->rank, static_cast<int>(k), m->new_id});
  while (!q.empty()) {
    const Cand top = q.top();
    q.pop();
    Symbol& cur = sym[static_cast<std::size_t>(top.pos)];
    if (!cur.alive || cur.next == -1) continue;
    Symbol& right = sym[static_cast<std::size_t>(cur.next)];
    const auto* now = find(cur.id, right.id);
    if (now == nullptr || now->new_id != top.new_id) continue;
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (right.next != -1) sym[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (cur.prev != -1)
      if (const auto* m = find(sym[static_cast<std::size_t>(cur.prev)].id, cur.id))
        q.push({m->rank, cur.prev, m->new_id});
    if (cur.next != -1)
      if (const auto* m = find(cur.id, sym[static_cast<std::size_t>(cur.next)].id))
        q.push({m->rank, top.pos, m->new_id});
  }
  for (const Symbol& s : sym)
    if (s.alive) out.push_back(s.id);
}

void Tokenizer::Impl::model_tokenize(std::string_view word, std::vector<std::int32_t>& out) const {
  if (ignore_merges)
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  constexpr std::size_t kCacheableLength = 256;
  constexpr std::size_t kCacheCapacity = 20000;
  const bool cacheable = word.size() <= kCacheableLength;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = out.size();
  bpe(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheCapacity) cache.clear();
    cache.emplace(std::string(word),
                  std::vector<std::int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }
}

void Tokenizer::Impl::pre_tokenize_and_model(std::string_view s, std::vector<std::int32_t>& out) const {
  std::vector<std::string> pieces{std::string(s)};
  std::vector<std::string> next;
  const auto& table = detail::byte_table();
  for (const detail::PreStep& step : pre) {
    next.clear();
    for (const std::string& piece : pieces) {
      if (step.kind == detail::PreStep::split) {
        detail::split_piece(step, piece, next);
        continue;
      }
      std::string p = piece;
      if (step.add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      std::vector<std::string> parts;
      if (step.regex) {
        detail::PreStep iso;
        iso.regex = step.regex;
        detail::split_piece(iso, p, parts);
      } else if (!p.empty()) {
        parts.push_back(std::move(p));
      }
      for (const std::string& part : parts) {
        std::string mapped;
        mapped.reserve(part.size() * 2);
        for (const char c : part) mapped += table.encode[static_cast<unsigned char>(c)];
        next.push_back(std::move(mapped));
      }
    }
    pieces.swap(next);
  }
  for (const std::string& piece : pieces)
    if (!piece.empty()) model_tokenize(piece, out);
}

// tokenizers' AddedVocabulary::find_matches over the tokens of one pass (normalized=false on the raw text,
// normalized=true on the normalised text). Appends (text, -1) pieces and (token, id) matches.
void Tokenizer::Impl::split_added(std::string_view s, bool normalized_pass, bool parse_special,
                                  std::vector<std::pair<std::string_view, std::int32_t>>& out) const {
  const auto& first = normalized_pass ? norm_first : raw_first;
  std::size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const AddedToken* hit = nullptr;
    for (const std::size_t k : first[static_cast<unsigned char>(s[pos])]) {
      const AddedToken& t = added[k];
      if (s.compare(pos, t.match.size(), t.match) == 0) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    std::size_t start = pos, stop = pos + hit->match.size();
    pos = stop;  // matches never overlap, whether or not this one is used
    if (!parse_special && hit->special) continue;
    if (hit->single_word) {
      bool word_before = false, word_after = false;
      if (start > 0) {
        std::size_t b = start - 1;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
        std::size_t j = b;
        word_before = detail::is_word_char(detail::next_cp(s, j));
      }
      if (stop < s.size()) {
        std::size_t j = stop;
        word_after = detail::is_word_char(detail::next_cp(s, j));
      }
      if (word_before || word_after) continue;
    }
    if (hit->lstrip) {
      std::size_t b = start;
      while (b > 0) {
        std::size_t c = b - 1;
        while (c > 0 && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
        std::size_t j = c;
        if (!detail::is_white_space(detail::next_cp(s, j))) break;
        b = c;
      }
      start = std::max(b, start_offset);
    }
    if (hit->rstrip) {
      while (stop < s.size()) {
        std::size_t j = stop;
        if (!detail::is_white_space(detail::next_cp(s, j))) break;
        stop = j;
      }
      pos = std::max(pos, stop);
    }
    if (start_offset < start) out.emplace_back(s.substr(start_offset, start - start_offset), -1);
    out.emplace_back(s.substr(start, stop - start), hit->id);
    start_offset = stop;
  }
  if (start_offset < s.size()) out.emplace_back(s.substr(start_offset), -1);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  if (const auto bad_at = detail::utf8_error_offset(text); bad_at != std::string_view::npos)
    throw Error(Status::invalid_argument, fmt::format("encode: text is not valid UTF-8 (byte {})", bad_at));
  const Impl& m = *impl_;
  std::vector<std::int32_t> out;
  std::vector<std::pair<std::string_view, std::int32_t>> raw, norm;
  m.split_added(text, false, parse_special, raw);
  for (const auto& [piece, id] : raw) {
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    const std::string normalized = m.normalize(piece);
    if (!m.any_normalized_added) {
      m.pre_tokenize_and_model(normalized, out);
      continue;
    }
    norm.clear();
    m.split_added(normalized, true, parse_special, norm);
    for (const auto& [p2, id2] : norm) {
      if (id2 >= 0)
        out.push_back(id2);
      else
        m.pre_tokenize_and_model(p2, out);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decoding

namespace {
const Tokenizer::Impl& checked(const std::shared_ptr<const Tokenizer::Impl>& impl, std::int32_t id) {
  if (id < 0 || static_cast<std::size_t>(id) >= impl->id_kind.size() ||
      impl->id_kind[static_cast<std::size_t>(id)] == 0)
    throw Error(Status::invalid_token,
                fmt::format("token id {} is not in the vocabulary (size {})", id, impl->id_kind.size()));
  return *impl;
}
}  // namespace

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (const std::int32_t id : ids) {
    const Impl& m = checked(impl_, id);
    if (skip_special && m.id_kind[static_cast<std::size_t>(id)] == 3) continue;
    if (!m.decoder_byte_level && !first) bytes += ' ';
    bytes += m.id_bytes[static_cast<std::size_t>(id)];
    first = false;
  }
  std::string out;
  out.reserve(bytes.size());
  detail::append_utf8_lossy(out, bytes, true);
  return out;
}

std::string StreamDecoder::push(std::int32_t id) {
  if (skip_unknown_ && id >= tokenizer_->vocab_size()) return {};
  const Tokenizer::Impl& m = checked(tokenizer_->impl_, id);
  if (skip_special_ && m.id_kind[static_cast<std::size_t>(id)] == 3) return {};
  if (!m.decoder_byte_level && !first_) pending_ += ' ';
  pending_ += m.id_bytes[static_cast<std::size_t>(id)];
  first_ = false;
  std::string out;
  const std::size_t used = detail::append_utf8_lossy(out, pending_, false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  detail::append_utf8_lossy(out, pending_, true);
  reset();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Queries

std::int32_t Tokenizer::vocab_size() const noexcept { return static_cast<std::int32_t>(impl_->id_kind.size()); }

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}
const std::string& Tokenizer::id_to_token(std::int32_t id) const {
  return checked(impl_, id).id_token[static_cast<std::size_t>(id)];
}
std::string_view Tokenizer::token_bytes(std::int32_t id) const {
  return checked(impl_, id).id_bytes[static_cast<std::size_t>(id)];
}
bool Tokenizer::is_special(std::int32_t id) const {
  return checked(impl_, id).id_kind[static_cast<std::size_t>(id)] == 3;
}
bool Tokenizer::is_added(std::int32_t id) const {
  return checked(impl_, id).id_kind[static_cast<std::size_t>(id)] >= 2;
}
std::span<const AddedToken> Tokenizer::added_tokens() const noexcept { return impl_->added; }

// ---------------------------------------------------------------------------------------------
// Loading

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(Status::io_error, fmt::format("cannot open tokenizer file {}", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(Status::io_error, fmt::format("cannot read tokenizer file {}", path));
  return from_json(ss.str(), path);
}

Tokenizer Tokenizer::from_json(std::string_view text, std::string_view what) {
  using detail::bad;
  using detail::unsupported;
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(Status::invalid_file, fmt::format("{}: not valid JSON: {}", what, e.what()));
  }
  if (!doc.is_object()) bad(what, "top level", "must be an object");
  auto m = std::make_shared<Impl>();
  m->what = what;

  // Model: BPE with vocab and merges.
  const json* model = detail::member(doc, "model");
  if (model == nullptr || !model->is_object()) bad(what, "model", "must be an object");
  if (const json* t = detail::member(*model, "type")) {
    if (!t->is_string()) bad(what, "model.type", "must be a string");
    if (t->get<std::string>() != "BPE")
      unsupported(what, "model.type", fmt::format("\"{}\" is not BPE", t->get<std::string>()));
  }
  if (const json* d = detail::member(*model, "dropout"); d != nullptr && !(d->is_number() && d->get<double>() == 0.0))
    unsupported(what, "model.dropout", "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = detail::member(*model, key); v != nullptr && !(v->is_string() && v->get<std::string>().empty()))
      unsupported(what, fmt::format("model.{}", key), "must be empty");
  m->ignore_merges = detail::get_bool(*model, "ignore_merges", false, what, "model");
  m->byte_fallback = detail::get_bool(*model, "byte_fallback", false, what, "model");
  m->fuse_unk = detail::get_bool(*model, "fuse_unk", false, what, "model");

  const json* vocab = detail::member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) bad(what, "model.vocab", "must be an object of token: id");
  std::int32_t max_id = -1;
  m->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const std::int32_t id = detail::get_id(it.value(), what, fmt::format("model.vocab[\"{}\"]", it.key()));
    m->vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  // Ids index dense tables, so a stray huge id must not make us allocate gigabytes.
  const json* added_json = detail::member(doc, "added_tokens");
  const std::size_t id_bound =
      2 * (vocab->size() + (added_json && added_json->is_array() ? added_json->size() : 0)) + 1024;
  if (static_cast<std::size_t>(max_id) >= id_bound)
    bad(what, "model.vocab", fmt::format("id {} is far beyond the {} entries", max_id, vocab->size()));
  std::vector<std::string> id_token(static_cast<std::size_t>(max_id + 1));
  std::vector<std::uint8_t> kind(static_cast<std::size_t>(max_id + 1), 0);
  for (const auto& [tok, id] : m->vocab) {
    if (kind[static_cast<std::size_t>(id)] != 0)
      bad(what, "model.vocab",
          fmt::format("id {} is given to both \"{}\" and \"{}\"", id, id_token[static_cast<std::size_t>(id)], tok));
    id_token[static_cast<std::size_t>(id)] = tok;
    kind[static_cast<std::size_t>(id)] = 1;
  }
  if (const json* unk = detail::member(*model, "unk_token")) {
    if (!unk->is_string()) bad(what, "model.unk_token", "must be a string or null");
    auto it = m->vocab.find(unk->get<std::string>());
    if (it == m->vocab.end())
      bad(what, "model.unk_token", fmt::format("\"{}\" is not in the vocabulary", unk->get<std::string>()));
    m->unk_id = it->second;
  }

  const json* merges = detail::member(*model, "merges");
  if (merges != nullptr && !merges->is_array()) bad(what, "model.merges", "must be an array");
  if (merges != nullptr) {
    m->merges.reserve(merges->size());
    for (std::size_t i = 0; i < merges->size(); ++i) {
      const json& e = (*merges)[i];
      const std::string field = fmt::format("model.merges[{}]", i);
      std::string a, b;
      if (e.is_string()) {
        const std::string& s = e.get_ref<const std::string&>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos) bad(what, field, fmt::format("\"{}\" is not \"left right\"", s));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        bad(what, field, "must be \"left right\" or [left, right]");
      }
      const auto ia = m->vocab.find(a), ib = m->vocab.find(b), iab = m->vocab.find(a + b);
      if (ia == m->vocab.end()) bad(what, field, fmt::format("\"{}\" is not in the vocabulary", a));
      if (ib == m->vocab.end()) bad(what, field, fmt::format("\"{}\" is not in the vocabulary", b));
      if (iab == m->vocab.end()) bad(what, field, fmt::format("\"{}\" is not in the vocabulary", a + b));
      // A repeated pair keeps its last rank, as in tokenizers (the map is built by insertion).
      m->merges[detail::pair_key(ia->second, ib->second)] = {static_cast<std::int32_t>(i), iab->second};
    }
  }

  // Added tokens.
  if (const json* added = added_json) {
    if (!added->is_array()) bad(what, "added_tokens", "must be an array");
    for (std::size_t i = 0; i < added->size(); ++i) {
      const json& e = (*added)[i];
      const std::string field = fmt::format("added_tokens[{}]", i);
      if (!e.is_object()) bad(what, field, "must be an object");
      AddedToken t;
      const json* id = detail::member(e, "id");
      if (id == nullptr) bad(what, field + ".id", "is missing");
      t.id = detail::get_id(*id, what, field + ".id");
      if (static_cast<std::size_t>(t.id) >= id_bound)
        bad(what, field + ".id", fmt::format("id {} is far beyond the vocabulary", t.id));
      t.content = detail::get_string(e, "content", what, field);
      if (t.content.empty()) bad(what, field + ".content", "is empty");
      if (detail::utf8_error_offset(t.content) != std::string_view::npos) bad(what, field + ".content", "is not UTF-8");
      t.special = detail::get_bool(e, "special", false, what, field);
      t.single_word = detail::get_bool(e, "single_word", false, what, field);
      t.lstrip = detail::get_bool(e, "lstrip", false, what, field);
      t.rstrip = detail::get_bool(e, "rstrip", false, what, field);
      t.normalized = detail::get_bool(e, "normalized", !t.special, what, field);
      if (m->added_by_content.count(t.content)) bad(what, field, fmt::format("\"{}\" is listed twice", t.content));
      if (static_cast<std::size_t>(t.id) >= kind.size()) {
        id_token.resize(static_cast<std::size_t>(t.id) + 1);
        kind.resize(static_cast<std::size_t>(t.id) + 1, 0);
      }
      const auto slot = static_cast<std::size_t>(t.id);
      if (kind[slot] >= 2) bad(what, field, fmt::format("id {} is already taken by \"{}\"", t.id, id_token[slot]));
      if (kind[slot] == 1 && id_token[slot] != t.content)
        bad(what, field, fmt::format("id {} is already the vocabulary token \"{}\"", t.id, id_token[slot]));
      if (auto v = m->vocab.find(t.content); v != m->vocab.end() && v->second != t.id)
        bad(what, field, fmt::format("\"{}\" is vocabulary id {}, not {}", t.content, v->second, t.id));
      id_token[slot] = t.content;
      kind[slot] = t.special ? 3 : 2;
      m->added_by_content.emplace(t.content, t.id);
      m->added.push_back(std::move(t));
    }
  }

  // Normaliser, pre-tokenizer, decoder, post-processor.
  if (const json* n = detail::member(doc, "normalizer"))
    detail::parse_normalizer(*n, m->normalizers, what, "normalizer");
  if (const json* p = detail::member(doc, "pre_tokenizer"))
    detail::parse_pre_tokenizer(*p, m->pre, what, "pre_tokenizer");
  m->decoder_byte_level = false;
  if (const json* d = detail::member(doc, "decoder")) {
    const std::string type = detail::type_of(*d, what, "decoder");
    if (type != "ByteLevel") unsupported(what, "decoder", fmt::format("decoder type \"{}\" is not supported", type));
    m->decoder_byte_level = true;
  }
  if (const json* p = detail::member(doc, "post_processor")) {
    const std::string type = detail::type_of(*p, what, "post_processor");
    if (type != "ByteLevel")
      unsupported(what, "post_processor", fmt::format("post-processor type \"{}\" is not supported", type));
  }

  // Matching tables: normalized tokens are matched in their normalised form.
  for (std::size_t k = 0; k < m->added.size(); ++k) {
    AddedToken& t = m->added[k];
    t.match = t.normalized ? m->normalize(t.content) : t.content;
    // tokenizers reports (and decodes) a normalised token by its normalised form.
    id_token[static_cast<std::size_t>(t.id)] = t.match;
    m->any_normalized_added = m->any_normalized_added || t.normalized;
    if (t.match.empty()) continue;
    (t.normalized ? m->norm_first : m->raw_first)[static_cast<unsigned char>(t.match[0])].push_back(k);
  }
  for (auto* table : {&m->raw_first, &m->norm_first})
    for (auto& bucket : *table)
      std::stable_sort(bucket.begin(), bucket.end(), [&](std::size_t x, std::size_t y) {
        return m->added[x].match.size() > m->added[y].match.size();
      });

  // What each id decodes to (ByteLevel: every char mapped back to its byte, or the token's own bytes when a
  // char is not in the table).
  m->id_bytes.resize(id_token.size());
  const auto& table = detail::byte_table();
  for (std::size_t id = 0; id < id_token.size(); ++id) {
    const std::string& tok = id_token[id];
    if (!m->decoder_byte_level || kind[id] == 0) {
      m->id_bytes[id] = tok;
      continue;
    }
    std::string bytes;
    bool mapped = detail::utf8_error_offset(tok) == std::string_view::npos;
    for (std::size_t i = 0; i < tok.size() && mapped;) {
      const char32_t cp = detail::next_cp(tok, i);
      if (cp >= table.decode.size() || table.decode[cp] < 0)
        mapped = false;
      else
        bytes += static_cast<char>(table.decode[cp]);
    }
    m->id_bytes[id] = mapped ? bytes : tok;
  }
  m->id_token = std::move(id_token);
  m->id_kind = std::move(kind);
  return Tokenizer(std::move(m));
}

}  // namespace gdn
