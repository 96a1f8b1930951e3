#pragma once
// A Batch lists which sequences advance by which tokens in one step, and which positions want
// logits. The host owns batching: a step may mix a 500-token prompt for one sequence with single
// decode tokens for others. Positions are implicit: a sequence's tokens continue where it stands.
// Thread safety: plain data; one thread fills it, and a Batch not being modified may be read by any.

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
    std::int64_t token_begin;   // into tokens()
    std::int64_t token_count;
    std::int64_t output_begin;  // first output row of this entry in the step's results
    LogitsFor logits;
    bool hidden_all;            // an output row (final hidden state) for every token
    bool rollback;              // the step may be undone with Context::rollback (see add())
  };

  void clear() noexcept {
    entries_.clear();
    tokens_.clear();
    output_rows_ = 0;
  }
  void reserve(std::size_t entries, std::size_t tokens) {
    entries_.reserve(entries);
    tokens_.reserve(tokens);
  }

  // Appends `tokens` for `seq`; `logits` chooses which positions get logits. With hidden_all,
  // every position gets an output row carrying its final hidden state (what the MTP head reads),
  // while logits are still computed only where `logits` asks. Each sequence may appear once.
  // rollback = false promises that this step of the sequence will not be rolled back: a context with
  // max_rollback_tokens > 0 then skips logging it (the log copies the sequence's whole GDN state, which
  // a plain decode step in a speculative server does not need).
  std::size_t add(SeqId seq, std::span<const Token> tokens, LogitsFor logits = LogitsFor::last, bool hidden_all = false,
                  bool rollback = true) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    Entry e{seq, static_cast<std::int64_t>(tokens_.size()), n, output_rows_, logits, hidden_all, rollback};
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    output_rows_ += hidden_all || logits == LogitsFor::all ? n : (logits == LogitsFor::last && n > 0 ? 1 : 0);
    entries_.push_back(e);
    return entries_.size() - 1;
  }
  std::size_t add(SeqId seq, Token token, LogitsFor logits = LogitsFor::last) {
    return add(seq, std::span<const Token>(&token, 1), logits);
  }

  std::span<const Entry> entries() const noexcept { return entries_; }
  std::span<const Token> tokens() const noexcept { return tokens_; }
  std::int64_t token_count() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  std::int64_t output_rows() const noexcept { return output_rows_; }
  // The output row of entry e's token i (i counts within the entry), or -1 when it has none.
  std::int64_t output_row(std::size_t e, std::int64_t i) const noexcept {
    const Entry& en = entries_[e];
    if (en.hidden_all || en.logits == LogitsFor::all) return en.output_begin + i;
    if (en.logits == LogitsFor::last && i == en.token_count - 1) return en.output_begin;
    return -1;
  }
  // Whether that row carries logits.
  bool wants_logits(std::size_t e, std::int64_t i) const noexcept {
    const Entry& en = entries_[e];
    return en.logits == LogitsFor::all || (en.logits == LogitsFor::last && i == en.token_count - 1);
  }
  // The row holding the logits of entry e's last token (-1 when it has none).
  std::int64_t last_row(std::size_t e) const noexcept { return output_row(e, entries_[e].token_count - 1); }

 private:
  std::vector<Entry> entries_;
  std::vector<Token> tokens_;
  std::int64_t output_rows_ = 0;
};

}  // namespace gdn
