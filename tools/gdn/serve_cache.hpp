#pragma once
// gdn serve's prefix cache: a radix tree over token ids whose nodes hold Context snapshots taken at any
// token (the end of a prompt, every --cache-interval tokens, the start of each chat turn, the end
// of a generation). A new request starts from the snapshot of its longest cached prefix and prefills
// only the rest. Snapshots are exact (GDN state copied, KV pages shared copy-on-write), so a hit
// continues bit-identically to a cold run, which is what makes token granularity possible: nothing is
// rounded to a block size and no state is approximated.
//
// Memory: a node is charged its snapshot's GDN state, the MTP hidden row it keeps, and the KV pages its
// snapshot holds that its lineage parent (the previous snapshot of the same sequence, still cached)
// does not: they share every full page below the parent's length, and copy-on-write gave the child its
// own copy of the parent's last, partial page. When a lineage parent is evicted, its children are
// charged again against its own parent (with which they share at least as much). So the charges sum to
// at least the memory the cache keeps alive; they are held under the budget by evicting the least
// recently used snapshot (a lookup uses the path to its hit; among equals the deepest goes first).
//
// Used by the engine thread only (the Context's thread rule).

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "gdn/runtime/context.hpp"

namespace gdn::serve {

struct CacheHit {
  std::uint64_t node = 0;        // 0: no cached prefix
  SnapshotId snapshot = 0;
  std::int64_t length = 0;       // tokens the snapshot has consumed
  bool mtp = false;              // the snapshot's MTP layer has seen every pair but the last, kept in `hidden`
  std::span<const float> hidden; // main-model hidden state of the last position (what its MTP pair needs)
};

struct CacheStats {
  std::int64_t bytes = 0, budget = 0, nodes = 0, snapshots = 0;
  std::int64_t hits = 0, misses = 0, inserted = 0, evicted = 0, hit_tokens = 0;
};

class PrefixCache {
 public:
  // budget_bytes 0 disables the cache.
  PrefixCache(Context& ctx, std::int64_t budget_bytes);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool enabled() const noexcept { return budget_ > 0; }

  // The longest cached prefix of `tokens` of at most max_length tokens, marked as recently used.
  CacheHit lookup(std::span<const Token> tokens, std::int64_t max_length);

  // Takes `snap`, a snapshot of a sequence that has consumed exactly `tokens`. `lineage` is the node of
  // the sequence's previous snapshot (inserted by it, or the one it started from), 0 if none. Returns
  // the node now holding `tokens` (an existing one when that prefix is already cached: `snap` is then
  // freed), or 0 when it does not fit the budget (freed too).
  std::uint64_t insert(std::span<const Token> tokens, SnapshotId snap, std::vector<float> hidden, bool mtp,
                       std::uint64_t lineage);

  // Frees every snapshot.
  void clear();
  CacheStats stats() const;
  // What a node of `length` tokens is charged with no lineage parent (bytes per cached prefix).
  std::int64_t charge_for(std::int64_t length, std::int64_t parent_length, std::size_t hidden_floats) const;

 private:
  struct Node {
    std::uint64_t id = 0;
    Node* parent = nullptr;
    std::vector<Token> edge;  // the tokens from the parent to here
    std::int64_t depth = 0;   // tokens from the root
    std::map<Token, std::unique_ptr<Node>> children;
    bool has_snapshot = false;
    SnapshotId snapshot = 0;
    std::vector<float> hidden;
    bool mtp = false;
    std::int64_t charge = 0;
    std::uint64_t lineage = 0;  // the node whose pages this snapshot shares (0: none)
    std::uint64_t last_use = 0;
  };

  Node* find_or_split(std::span<const Token> tokens);
  bool evict_one(const Node* keep);
  std::int64_t lineage_length(std::uint64_t id, const Node* n) const;
  void drop_snapshot(Node* n);
  void prune(Node* n);

  Context& ctx_;
  std::int64_t budget_ = 0, bytes_ = 0;
  std::int64_t page_bytes_ = 0, state_bytes_ = 0;
  int page_size_ = 0;
  std::unique_ptr<Node> root_;
  std::unordered_map<std::uint64_t, Node*> by_id_;
  std::uint64_t next_id_ = 1, clock_ = 0;
  CacheStats stats_;
};

}  // namespace gdn::serve
