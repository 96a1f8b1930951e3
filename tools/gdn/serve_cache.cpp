#include "serve_cache.hpp"

#include <algorithm>

namespace gdn::serve {

PrefixCache::PrefixCache(Context& ctx, std::int64_t budget_bytes)
    : ctx_(ctx), budget_(std::max<std::int64_t>(budget_bytes, 0)), root_(std::make_unique<Node>()) {
  page_size_ = ctx.params().kv_page_size;
  page_bytes_ = ctx.kv_bytes_per_token() * page_size_;
  state_bytes_ = ctx.snapshot_bytes();
  stats_.budget = budget_;
}

PrefixCache::~PrefixCache() {
  try {
    clear();
  } catch (...) {  // a context that became unusable still owns (and frees) its snapshots
  }
}

std::int64_t PrefixCache::charge_for(std::int64_t length, std::int64_t parent_length, std::size_t hidden_floats) const {
  const std::int64_t pages = (length + page_size_ - 1) / page_size_ - parent_length / page_size_;
  return state_bytes_ + std::max<std::int64_t>(pages, 0) * page_bytes_ + static_cast<std::int64_t>(hidden_floats * sizeof(float));
}

CacheHit PrefixCache::lookup(std::span<const Token> tokens, std::int64_t max_length) {
  CacheHit hit;
  if (!enabled()) return hit;
  Node* cur = root_.get();
  Node* best = nullptr;
  std::size_t d = 0;
  for (;;) {
    if (cur->has_snapshot && cur->depth <= max_length) best = cur;
    if (d >= tokens.size()) break;
    const auto it = cur->children.find(tokens[d]);
    if (it == cur->children.end()) break;
    Node* child = it->second.get();
    const auto& e = child->edge;
    if (d + e.size() > tokens.size() || !std::equal(e.begin(), e.end(), tokens.begin() + static_cast<std::ptrdiff_t>(d))) break;
    d += e.size();
    cur = child;
  }
  if (best == nullptr) {
    ++stats_.misses;
    return hit;
  }
  ++clock_;
  for (Node* n = best; n != nullptr; n = n->parent) n->last_use = clock_;
  ++stats_.hits;
  stats_.hit_tokens += best->depth;
  hit.node = best->id;
  hit.snapshot = best->snapshot;
  hit.length = best->depth;
  hit.mtp = best->mtp;
  hit.hidden = best->hidden;
  return hit;
}

PrefixCache::Node* PrefixCache::find_or_split(std::span<const Token> tokens) {
  Node* cur = root_.get();
  std::size_t d = 0;
  const auto make = [&](Node* parent, std::span<const Token> edge) {
    auto n = std::make_unique<Node>();
    n->id = next_id_++;
    n->parent = parent;
    n->edge.assign(edge.begin(), edge.end());
    n->depth = parent->depth + static_cast<std::int64_t>(edge.size());
    Node* raw = n.get();
    by_id_[raw->id] = raw;
    parent->children[edge.front()] = std::move(n);
    return raw;
  };
  while (d < tokens.size()) {
    const auto it = cur->children.find(tokens[d]);
    if (it == cur->children.end()) return make(cur, tokens.subspan(d));
    Node* child = it->second.get();
    const auto& e = child->edge;
    std::size_t c = 0;
    while (c < e.size() && d + c < tokens.size() && e[c] == tokens[d + c]) ++c;
    if (c == e.size()) {
      cur = child;
      d += c;
      continue;
    }
    // Split the edge after c tokens: cur -> mid -> child.
    std::unique_ptr<Node> owned = std::move(it->second);
    cur->children.erase(it);
    Node* mid = make(cur, std::span<const Token>(e.data(), c));
    owned->edge.erase(owned->edge.begin(), owned->edge.begin() + static_cast<std::ptrdiff_t>(c));
    owned->parent = mid;
    const Token first = owned->edge.front();
    mid->children[first] = std::move(owned);
    if (d + c == tokens.size()) return mid;
    return make(mid, tokens.subspan(d + c));
  }
  return cur;
}

std::uint64_t PrefixCache::insert(std::span<const Token> tokens, SnapshotId snap, std::vector<float> hidden, bool mtp,
                                  std::uint64_t lineage) {
  if (!enabled() || tokens.empty()) {
    ctx_.free_snapshot(snap);
    return 0;
  }
  ++clock_;
  Node* n = find_or_split(tokens);
  const auto touch = [&](Node* from) {
    for (Node* p = from; p != nullptr; p = p->parent) p->last_use = clock_;
  };
  if (n->has_snapshot) {
    ctx_.free_snapshot(snap);
    touch(n);
    return n->id;
  }
  std::int64_t charge = 0;
  for (;;) {
    if (lineage_length(lineage, n) == 0) lineage = 0;  // gone (evicted), or not an ancestor
    charge = charge_for(n->depth, lineage_length(lineage, n), hidden.size());
    if (bytes_ + charge <= budget_) break;
    if (!evict_one(n)) {
      ctx_.free_snapshot(snap);
      prune(n);
      return 0;
    }
  }
  n->has_snapshot = true;
  n->snapshot = snap;
  n->hidden = std::move(hidden);
  n->mtp = mtp;
  n->charge = charge;
  n->lineage = lineage;
  bytes_ += charge;
  touch(n);
  ++stats_.inserted;
  return n->id;
}

// The length of node `id` when it holds a snapshot and is an ancestor of n, else 0.
std::int64_t PrefixCache::lineage_length(std::uint64_t id, const Node* n) const {
  const auto it = by_id_.find(id);
  if (it == by_id_.end() || !it->second->has_snapshot) return 0;
  for (const Node* p = n->parent; p != nullptr; p = p->parent)
    if (p == it->second) return p->depth;
  return 0;
}

bool PrefixCache::evict_one(const Node* keep) {
  Node* victim = nullptr;
  for (const auto& [id, n] : by_id_)
    if (n != keep && n->has_snapshot &&
        (victim == nullptr || n->last_use < victim->last_use || (n->last_use == victim->last_use && n->depth > victim->depth)))
      victim = n;
  if (victim == nullptr) return false;
  // Its lineage children shared its pages; they share at least as many with its own lineage parent.
  for (const auto& [id, n] : by_id_) {
    if (!n->has_snapshot || n->lineage != victim->id) continue;
    n->lineage = lineage_length(victim->lineage, n) > 0 ? victim->lineage : 0;
    const std::int64_t charge = charge_for(n->depth, lineage_length(n->lineage, n), n->hidden.size());
    bytes_ += charge - n->charge;
    n->charge = charge;
  }
  drop_snapshot(victim);
  ++stats_.evicted;
  prune(victim);
  return true;
}

void PrefixCache::drop_snapshot(Node* n) {
  if (!n->has_snapshot) return;
  n->has_snapshot = false;
  bytes_ -= n->charge;
  n->charge = 0;
  n->hidden.clear();
  n->hidden.shrink_to_fit();
  ctx_.free_snapshot(n->snapshot);
}

// Removes n and then its ancestors while they hold nothing: no snapshot, no children.
void PrefixCache::prune(Node* n) {
  while (n != nullptr && n != root_.get() && !n->has_snapshot && n->children.empty()) {
    Node* parent = n->parent;
    by_id_.erase(n->id);
    parent->children.erase(n->edge.front());  // destroys n
    n = parent;
  }
}

void PrefixCache::clear() {
  for (auto& [id, n] : by_id_) drop_snapshot(n);
  by_id_.clear();
  root_ = std::make_unique<Node>();
  bytes_ = 0;
}

CacheStats PrefixCache::stats() const {
  CacheStats s = stats_;
  s.bytes = bytes_;
  s.nodes = static_cast<std::int64_t>(by_id_.size());
  s.snapshots = 0;
  for (const auto& [id, n] : by_id_) s.snapshots += n->has_snapshot ? 1 : 0;
  return s;
}

}  // namespace gdn::serve
