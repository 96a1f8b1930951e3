#pragma once
// A Batch lists which sequences advance by which tokens in one step, and which positions want
// logits. The host owns batching: a step may mix a 500-token prompt for one sequence with single
// decode tokens for others. Positions are implicit: a sequence's tokens continue where it stands.

#include <cstdint>
#include <span>
#include <vector>

namespace gdn {

using Token = std::int32_t;

// A sequence handle: slot index in the low 32 bits, the slot's generation in the high 32, so a
// handle to a freed (and possibly reused) slot is detected instead of silently aliasing.
using SeqId = std::uint64_t;

enum class LogitsFor : std::uint8_t { none, last, all };

class Batch {
 public:
  struct Entry {
    SeqId seq;
    std::int64_t token_begin;  // into tokens()
    std::int64_t token_count;
    std::int64_t logits_begin;  // first row of this entry's logits in the step's output
    LogitsFor logits;
  };

  void clear() noexcept {
    entries_.clear();
    tokens_.clear();
    logits_rows_ = 0;
  }
  void reserve(std::size_t entries, std::size_t tokens) {
    entries_.reserve(entries);
    tokens_.reserve(tokens);
  }

  // Appends `tokens` for `seq`. Returns the index of the entry. Each sequence may appear once.
  std::size_t add(SeqId seq, std::span<const Token> tokens, LogitsFor logits = LogitsFor::last) {
    Entry e{seq, static_cast<std::int64_t>(tokens_.size()), static_cast<std::int64_t>(tokens.size()), logits_rows_, logits};
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    logits_rows_ += logits == LogitsFor::none ? 0 : (logits == LogitsFor::last ? (tokens.empty() ? 0 : 1)
                                                                              : static_cast<std::int64_t>(tokens.size()));
    entries_.push_back(e);
    return entries_.size() - 1;
  }
  std::size_t add(SeqId seq, Token token, LogitsFor logits = LogitsFor::last) {
    return add(seq, std::span<const Token>(&token, 1), logits);
  }

  std::span<const Entry> entries() const noexcept { return entries_; }
  std::span<const Token> tokens() const noexcept { return tokens_; }
  std::int64_t token_count() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  std::int64_t logits_rows() const noexcept { return logits_rows_; }
  // The output row of entry e's token i (i counts within the entry), or -1 when it has none.
  std::int64_t logits_row(std::size_t e, std::int64_t i) const noexcept {
    const Entry& en = entries_[e];
    if (en.logits == LogitsFor::all) return en.logits_begin + i;
    if (en.logits == LogitsFor::last && i == en.token_count - 1) return en.logits_begin;
    return -1;
  }

 private:
  std::vector<Entry> entries_;
  std::vector<Token> tokens_;
  std::int64_t logits_rows_ = 0;
};

}  // namespace gdn
