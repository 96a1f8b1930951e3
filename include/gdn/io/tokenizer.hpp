#pragma once
// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json, as Qwen3.5 / Qwen3.6 ship it.
//
// encode() follows the `tokenizers` pipeline step by step, because ids must match Hugging Face exactly:
//   1. added tokens (added_tokens[]) are cut out of the raw text first, leftmost-longest, honouring their
//      lstrip / rstrip / single_word flags; tokens with normalized=true are matched after step 2 instead;
//   2. each remaining piece is normalised (NFC for Qwen; utf8proc);
//   3. pre-tokenised: Split on the tokenizer.json regex (PCRE2 with UTF+UCP, so \p{L} \p{M} \p{N} and \s
//      are Unicode classes), then ByteLevel maps every byte to one printable code point (GPT-2's table);
//   4. every pre-token is merged with BPE by merge rank (lowest rank first, leftmost on ties), or looked up
//      whole first when the model sets ignore_merges.
// decode() maps tokens back to bytes (ByteLevel decoder) and replaces ill-formed UTF-8 with U+FFFD the way
// Rust's String::from_utf8_lossy does, so decode(encode(x)) == NFC(x) for any valid UTF-8 x.
//
// Not supported (loading fails with Status::unsupported_model): models other than BPE, BPE dropout,
// continuing_subword_prefix / end_of_word_suffix, normalizers other than NFC/NFD/NFKC/NFKD (and Sequence of
// them), pre-tokenizers other than Split / ByteLevel (and Sequence), decoders other than ByteLevel, and
// post-processors that insert tokens (TemplateProcessing etc.; Qwen adds no BOS).
//
// Known difference from Hugging Face: Unicode versions. Character classes come from PCRE2's tables (Unicode
// 14 in PCRE2 10.42) where tokenizers' Oniguruma has Unicode 16, and NFC comes from utf8proc (Unicode 15)
// where tokenizers' normaliser predates Unicode 10. Text containing letters, digits or marks assigned after
// Unicode 14, or combining marks newer than those tables next to other marks, can tokenize differently;
// everything else is identical (tests/test_tokenizer.cpp checks 10k varied samples).
//
// A Tokenizer is immutable after loading; encode/decode are safe to call from several threads at once.
// Copies share the loaded tables.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gdn {

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  std::int32_t id = 0;
  std::string content;
  bool special = false;      // decode(skip_special) drops it; encode(parse_special=false) reads it as text
  bool single_word = false;  // matches only when not glued to a word character on either side
  bool lstrip = false;       // the match swallows the whitespace on its left
  bool rstrip = false;       // the match swallows the whitespace on its right
  bool normalized = false;   // matched in the normalised text rather than the raw text
  std::string match;         // what is searched for: `content`, normalised when `normalized`
};

class Tokenizer {
 public:
  // Reads a tokenizer.json. Throws gdn::Error: io_error when the file cannot be read, invalid_file naming
  // the field when it is malformed, unsupported_model for a feature listed above.
  static Tokenizer load(const std::string& path);
  // The same from the file's text; `what` names the source in error messages.
  static Tokenizer from_json(std::string_view json, std::string_view what = "tokenizer.json");

  // Ids for UTF-8 `text` (invalid UTF-8 throws invalid_argument). With parse_special=false the special
  // added tokens (special=true) are encoded as plain text; non-special added tokens (e.g. <think>) are
  // still matched, as in `tokenizers` with encode_special_tokens=true. No BOS/EOS is added.
  std::vector<std::int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Text for `ids`; ids outside [0, vocab_size()) throw invalid_token. skip_special drops special tokens.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // Number of ids: one more than the largest id of the vocabulary or the added tokens.
  std::int32_t vocab_size() const noexcept;
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  // The token's string as tokenizer.json spells it (byte-level form for vocabulary tokens).
  const std::string& id_to_token(std::int32_t id) const;
  // The bytes the token decodes to; may be an incomplete piece of a UTF-8 character.
  std::string_view token_bytes(std::int32_t id) const;
  bool is_special(std::int32_t id) const;  // an added token with special=true
  bool is_added(std::int32_t id) const;    // any added token
  std::span<const AddedToken> added_tokens() const noexcept;

  struct Impl;

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Incremental decoding for generation: feed one id at a time, get back only complete UTF-8 text. Bytes of a
// character split across tokens are held until the character is complete; ill-formed bytes come out as
// U+FFFD as soon as they are known to be ill-formed. Concatenating every push() and the final flush() gives
// exactly Tokenizer::decode() of the same ids. The tokenizer must outlive the decoder.
class StreamDecoder {
 public:
  // skip_unknown: an id past the tokenizer's vocabulary has no text instead of being an error. A
  // checkpoint's vocab_size is often padded past its tokenizer's ids (Qwen3.5: 248,320 rows for 248,077
  // ids) and a model can sample a padding row; transformers decodes it to nothing. Generation sets it.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false, bool skip_unknown = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special), skip_unknown_(skip_unknown) {}

  // Text completed by `id` (often empty for a partial character). Throws invalid_token for a bad id
  // (a negative one always; one past the vocabulary unless skip_unknown).
  std::string push(std::int32_t id);
  // Whatever is still held, with an unfinished character replaced by U+FFFD; then starts afresh.
  std::string flush();
  void reset() noexcept {
    pending_.clear();
    first_ = true;
  }
  // Bytes held back because they may be the start of a character.
  std::size_t pending_bytes() const noexcept { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool skip_unknown_;
  bool first_ = true;
  std::string pending_;
};

namespace detail {
// Appends `bytes` to `out` as UTF-8, replacing each maximal ill-formed subsequence with U+FFFD (Unicode's
// "substitution of maximal subparts", which Rust's from_utf8_lossy implements). Unless `final`, a well-formed
// but unfinished sequence at the end is left unconsumed. Returns the number of bytes consumed.
std::size_t append_utf8_lossy(std::string& out, std::string_view bytes, bool final);
// Offset of the first ill-formed byte, or npos when `text` is valid UTF-8.
std::size_t utf8_error_offset(std::string_view text) noexcept;
}  // namespace detail

}  // namespace gdn
