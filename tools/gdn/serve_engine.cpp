#include "serve_engine.hpp"

#include <poll.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "serve_cache.hpp"
#include "serve_text.hpp"

namespace gdn::serve {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Token argmax(std::span<const float> p) { return static_cast<Token>(std::max_element(p.begin(), p.end()) - p.begin()); }

// Sampler::draw's inverse CDF with a given uniform: drafts use the uniform the sequence's sampler will
// draw the token at that position with, so a draft distribution close to the target's proposes the
// token the target will draw (the verification itself never depends on how a draft was chosen).
Token draw_with(std::span<const float> probs, double u) {
  double cum = 0.0;
  Token last = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    last = static_cast<Token>(i);
    if (u < cum) return last;
  }
  return last;
}

// Expected tokens of a round with k drafts each accepted with probability a.
double expected_tokens(int k, double a) {
  double e = 0.0, term = 1.0;
  for (int i = 0; i <= k; ++i, term *= a) e += term;
  return e;
}

// An exponentially weighted least-squares fit of seconds = a + b · rows.
struct CostFit {
  double w = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  void add(double x, double y) {
    constexpr double decay = 0.97;
    w = w * decay + 1;
    sx = sx * decay + x;
    sy = sy * decay + y;
    sxx = sxx * decay + x * x;
    sxy = sxy * decay + x * y;
  }
  bool known() const { return w > 2.5; }
  void fit(double& a, double& b) const {
    const double mx = sx / w, my = sy / w, var = sxx / w - mx * mx;
    // Rows that barely vary (a steady batch) say nothing about the slope: assume a row costs a tenth
    // of the mean step until they do.
    b = var > 0.05 * std::max(1.0, mx * mx) * 0.01 ? (sxy / w - mx * my) / var : 0.1 * my / std::max(mx, 1.0);
    b = std::clamp(b, 0.0, my / std::max(mx, 1.0));
    a = std::max(0.0, my - b * mx);
  }
};

// Seconds per generated token of engine loops, by the number of running sequences (a loop's cost per token
// depends on its batch): the ratio of exponentially weighted sums of seconds and of tokens, so that a loop
// that only prefills (no token) still counts its time. The weights forget slowly (by 1/256 per loop), so a
// change of load shows within a few cohorts.
struct PerTokenCost {
  std::vector<double> seconds, tokens;
  std::vector<std::int64_t> loops;
  explicit PerTokenCost(int buckets)
      : seconds(static_cast<std::size_t>(buckets) + 1, 0.0), tokens(seconds.size(), 0.0), loops(seconds.size(), 0) {}
  void add(std::size_t batch, double s, std::int64_t n) {
    constexpr double decay = 1.0 - 1.0 / 256;
    batch = std::min(batch, seconds.size() - 1);
    seconds[batch] = seconds[batch] * decay + s;
    tokens[batch] = tokens[batch] * decay + static_cast<double>(n);
    ++loops[batch];
  }
  double per_token(std::size_t b) const { return tokens[b] > 0 ? seconds[b] / tokens[b] : 0.0; }
};

}  // namespace

void Histogram::add(double v) {
  std::size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++n;
}

ContextParams serve_context_params(const std::shared_ptr<const Model>& model, const EngineConfig& config) {
  ContextParams p;
  p.max_sequences = config.max_sequences;
  p.max_context = config.max_context;
  p.max_batch_tokens = config.step_tokens;
  p.max_logits_rows = config.step_tokens;
  p.threads = config.threads;
  p.backend = config.backend;
  p.device = config.device;
  p.state_dtype = config.state_dtype;
  p.kv_dtype = config.kv_dtype;
  // Per-token recurrence for every GDN segment: a sequence's numbers then do not depend on how its
  // tokens were split into steps (chunk boundaries would), which is what lets a cache hit at any
  // token and a prefill chunked under the budget reproduce a cold run bit for bit.
  p.gdn_chunk_min_tokens = 1 << 30;
  const bool mtp = config.mtp > 0 && model->has_mtp();
  p.max_rollback_tokens = mtp ? config.mtp + 1 : 0;
  if (model->config().count_layers(LayerKind::full_attention) > 0 || mtp) {
    // Enough pages for every slot to reach max_context, plus the cache's share: snapshots keep pages
    // alive after their sequences are gone, and the cache never holds more than its budget.
    ContextParams probe;
    probe.max_sequences = 1;
    probe.max_context = 16;
    // On the engine's own backend: a CPU probe of a model loaded for CUDA would make the CPU's packed
    // form of every weight just to learn one number, and the backends store KV differently.
    probe.backend = config.backend;
    probe.device = config.device;
    probe.kv_dtype = config.kv_dtype;
    probe.threads = 1;
    const std::int64_t kv_token = Context(model, probe).kv_bytes_per_token();
    const std::int64_t per_seq = (config.max_context + p.kv_page_size - 1) / p.kv_page_size;
    const std::int64_t page_bytes = std::max<std::int64_t>(kv_token * p.kv_page_size, 1);
    p.kv_pages = per_seq * config.max_sequences + std::max<std::int64_t>(config.cache_bytes, 0) / page_bytes;
  }
  return p;
}

// --- the engine thread's state ------------------------------------------------------------------

namespace {

struct Slot {
  std::shared_ptr<Request> req;
  SeqId seq = 0;
  bool has_seq = false;
  std::int64_t L = 0, pos = 0;  // prompt length, prompt tokens consumed
  std::vector<Token> fed;       // every token the sequence has consumed
  std::unique_ptr<Sampler> sampler, ahead;
  std::deque<double> uniforms;  // the sampler's next uniforms, drawn ahead for drafting
  std::unique_ptr<StopText> text;
  bool decoding = false;
  Token pending = 0;
  std::int64_t generated = 0;
  Finish finish = Finish::none;
  std::vector<std::int64_t> points;  // prompt positions to snapshot at, ascending, > pos
  std::size_t next_point = 0;
  bool snapshot_due = false;
  std::uint64_t lineage = 0;
  std::int64_t last_snapshot = 0;
  // MTP: pairs (hidden of position t, token at t + 1) not yet fed to the MTP layer.
  bool mtp = false;
  bool mtp_cohort = false;  // admitted to draft (the gate's cohort), even after it stops drafting
  std::vector<float> pair_hidden;
  std::vector<Token> pair_tokens;
  std::vector<Token> drafts;
  std::vector<float> chain_hidden;
  std::int64_t mtp_valid = 0;
  int k = 0, since_explore = 0, rounds_at_zero = 0;
  std::int64_t trials = 0;  // drafts tried (up to the first rejection of each round)
  double alpha = 0.5;
  // This loop's entry in the main batch.
  std::size_t entry = 0;
  std::int64_t chunk = 0;
  bool in_batch = false;
  Clock::time_point last_emit;
  bool first_emitted = false;
  std::vector<Token> out_tokens;  // generated this loop, not yet handed over
};

}  // namespace

struct Engine::Impl {
  Impl(std::shared_ptr<const Model> m, const Tokenizer& t, const EngineConfig& c, const ContextParams& cp)
      : model(std::move(m)), tok(t), cfg(c), ctx(model, cp), cache(ctx, c.cache_bytes), cost_plain(c.max_sequences),
        cost_mtp(c.max_sequences) {
    V = model->config().vocab_size;
    H = model->config().hidden_size;
    mtp_enabled = cfg.mtp > 0 && model->has_mtp();
    probs.resize(static_cast<std::size_t>(V));
    met.max_sequences = cfg.max_sequences;
    met.cache_budget = cache.stats().budget;
  }

  std::shared_ptr<const Model> model;
  const Tokenizer& tok;
  EngineConfig cfg;
  Context ctx;
  PrefixCache cache;
  int V = 0, H = 0;
  bool mtp_enabled = false;

  mutable std::mutex qm;
  std::condition_variable qcv;
  std::deque<std::shared_ptr<Request>> queue;
  bool accepting = true, stopping = false, healthy = true;
  Clock::time_point deadline;

  mutable std::mutex mm;
  EngineMetrics met;

  std::vector<std::unique_ptr<Slot>> running;
  CostFit main_cost, draft_cost;
  double alpha_global = 0.5;
  std::size_t last_decoding = 0, last_drafting = 0;
  std::int64_t last_rows = 0;
  // Adaptive MTP's gate (start_mtp): requests are admitted in cohorts that all draft or all decode plainly,
  // and the decode loops whose every sequence belongs to one kind measure that kind's seconds per token.
  PerTokenCost cost_plain, cost_mtp;
  // A cohort lasts until kCohortLoops loops of one kind were measured since it began: one request of 64
  // tokens alone, about one turnover of the batch when many run.
  static constexpr std::int64_t kCohortLoops = 64;
  bool cohort_mtp = false;
  std::int64_t cohort_loops = kCohortLoops;
  int cohorts_since_explore = 0, explore_every = 4;
  bool exploring = false, mtp_pays = false;
  Batch batch, mtp_batch;
  std::vector<float> mtp_hidden, probs;
  std::string piece;

  void loop();
  void iterate();
  void poll_hangups();
  void admit();
  void start(const std::shared_ptr<Request>& r);
  int choose_k(Slot& s);
  bool start_mtp();
  double mtp_cost_ratio(std::int64_t& samples) const;
  void mtp_phase();
  void flush_mtp(std::span<Slot* const> slots);
  void take_snapshot(Slot& s);
  void post_prefill(Slot& s);
  void post_decode(Slot& s);
  Token commit_sample(Slot& s, std::span<const float> logits);
  std::size_t take(Slot& s, std::span<const Token> tokens);
  void emit(Slot& s, const std::string& text, std::int64_t tokens);
  void finish_slots();
  void close(Slot& s, Finish f, const std::string& error = {});
  void fail_all(const std::string& why);
};

Engine::Engine(std::shared_ptr<const Model> model, const Tokenizer& tokenizer, const EngineConfig& config) {
  if (config.max_sequences < 1) throw Error(Status::invalid_argument, "--max-sequences must be at least 1");
  if (config.mtp < 0 || config.mtp > 8) throw Error(Status::invalid_argument, "--mtp must be in [0, 8]");
  if (config.step_tokens < config.max_sequences * (config.mtp + 1) + 1)
    throw Error(Status::invalid_argument,
                fmt::format("--step-tokens {} leaves no room for prefill beside {} decoding sequences with up to {} drafts",
                            config.step_tokens, config.max_sequences, config.mtp));
  cp_ = serve_context_params(model, config);
  impl_ = std::make_unique<Impl>(std::move(model), tokenizer, config, cp_);
  snapshot_bytes_ = impl_->ctx.snapshot_bytes();
  kv_bytes_per_token_ = impl_->ctx.kv_bytes_per_token();
  rollback_bytes_ = impl_->ctx.rollback_bytes_per_sequence();
  std::thread([this] { impl_->loop(); }).swap(thread_);
}

Engine::~Engine() { shutdown(std::chrono::milliseconds(0)); }

Engine::Submit Engine::submit(const std::shared_ptr<Request>& r) {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.qm);
    if (!m.healthy) return Submit::unhealthy;
    if (!m.accepting) return Submit::shutting_down;
    if (static_cast<int>(m.queue.size()) >= m.cfg.max_queue) {
      std::lock_guard ml(m.mm);
      ++m.met.rejected;
      return Submit::queue_full;
    }
    r->arrival = Clock::now();
    m.queue.push_back(r);
  }
  m.qcv.notify_one();
  return Submit::ok;
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  if (!impl_) return;
  {
    std::lock_guard lk(impl_->qm);
    impl_->accepting = false;
    if (!impl_->stopping) {
      impl_->stopping = true;
      impl_->deadline = Clock::now() + grace;
    } else {
      impl_->deadline = std::min(impl_->deadline, Clock::now() + grace);
    }
  }
  impl_->qcv.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineMetrics Engine::metrics() const {
  Impl& m = *impl_;
  EngineMetrics out;
  {
    std::lock_guard lk(m.mm);
    out = m.met;
  }
  std::lock_guard lk(m.qm);
  out.queue_depth = static_cast<std::int64_t>(m.queue.size());
  out.healthy = m.healthy;
  return out;
}

// --- the loop ------------------------------------------------------------------------------------

void Engine::Impl::loop() {
  for (;;) {
    bool expired = false;
    {
      std::unique_lock lk(qm);
      if (running.empty()) qcv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (stopping && running.empty() && queue.empty()) break;
      expired = stopping && Clock::now() >= deadline;
    }
    if (expired) {
      // Shutdown's grace is over: whatever is left is cancelled.
      std::deque<std::shared_ptr<Request>> left;
      {
        std::lock_guard lk(qm);
        left.swap(queue);
      }
      for (auto& r : left) {
        running.push_back(std::make_unique<Slot>());
        running.back()->req = r;
      }
      for (auto& s : running) s->req->cancelled = true;
    }
    poll_hangups();
    // Cancelled requests leave before anything is computed for them.
    for (auto& s : running)
      if (s->req->cancelled && s->finish == Finish::none) s->finish = Finish::cancelled;
    finish_slots();
    admit();
    if (running.empty()) continue;
    // For the MTP gate: this loop's time and tokens, when every running request is of one kind.
    const auto t0 = Clock::now();
    const std::size_t n = running.size();
    std::size_t n_mtp = 0;
    std::int64_t generated = 0;
    for (const auto& s : running) {
      n_mtp += s->mtp_cohort ? 1 : 0;
      generated -= s->generated;
    }
    try {
      iterate();
    } catch (const std::exception& e) {
      fail_all(e.what());
    }
    for (const auto& s : running) generated += s->generated;
    const bool one_kind = running.size() == n && (n_mtp == 0 || n_mtp == n);
    finish_slots();  // inside the measured time: a drafting request's last MTP catch-up happens here
    if (mtp_enabled && cfg.mtp_adaptive && one_kind) {
      (n_mtp > 0 ? cost_mtp : cost_plain).add(n, seconds(Clock::now() - t0), generated);
      ++cohort_loops;
    }
  }
  cache.clear();
}

void Engine::Impl::poll_hangups() {
  std::vector<pollfd> fds;
  std::vector<Request*> who;
  const auto add = [&](Request* r) {
    if (r->fd >= 0 && !r->cancelled) {
      fds.push_back(pollfd{r->fd, POLLRDHUP, 0});
      who.push_back(r);
    }
  };
  for (auto& s : running) add(s->req.get());
  std::lock_guard lk(qm);
  for (auto& r : queue) add(r.get());
  if (fds.empty()) return;
  if (::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (std::size_t i = 0; i < fds.size(); ++i)
    if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) who[i]->cancelled = true;
}

void Engine::Impl::admit() {
  while (static_cast<int>(running.size()) < cfg.max_sequences) {
    std::shared_ptr<Request> r;
    {
      std::lock_guard lk(qm);
      if (queue.empty()) break;
      r = std::move(queue.front());
      queue.pop_front();
    }
    if (r->cancelled) {
      auto s = std::make_unique<Slot>();
      s->req = r;
      close(*s, Finish::cancelled);
      continue;
    }
    try {
      start(r);
    } catch (const std::exception& e) {
      auto s = std::make_unique<Slot>();
      s->req = r;
      close(*s, Finish::error, e.what());
    }
  }
  std::lock_guard lk(mm);
  met.running = static_cast<std::int64_t>(running.size());
}

// MTP's seconds per token over plain decoding's, pooled over the batch sizes both have measured (each
// weighted by the fewer of its two sample counts); 0 while no batch size has enough of both.
double Engine::Impl::mtp_cost_ratio(std::int64_t& samples) const {
  constexpr std::int64_t enough = 32;
  double num = 0, den = 0;
  samples = 0;
  for (std::size_t b = 1; b < cost_plain.loops.size(); ++b) {
    const std::int64_t w = std::min(cost_plain.loops[b], cost_mtp.loops[b]);
    if (w < enough || cost_plain.per_token(b) <= 0 || cost_mtp.per_token(b) <= 0) continue;
    num += static_cast<double>(w) * cost_mtp.per_token(b) / cost_plain.per_token(b);
    den += static_cast<double>(w);
    samples += w;
  }
  return den > 0 ? num / den : 0.0;
}

// Whether a new request drafts. Requests are admitted in cohorts that all draft or all decode plainly, so
// that most engine loops hold one kind only and measure its seconds per generated token: the whole loop,
// prefill, the MTP layer, the step, sampling, handing tokens over, snapshots at the end (a loop of mixed
// kinds measures neither). A cohort lasts kCohortLoops measured loops. A cohort drafts when drafting measurably paid: MTP's time per
// token at least 3 % below plain decoding's, at the same numbers of running sequences. Until both are
// measured the cohorts alternate; after that, every explore_every-th cohort takes the other kind so that a
// change (acceptance, load) is noticed, and the interval doubles (to 64) each time the exploration confirms
// the choice. A plain request does no MTP work at all: no hidden rows, no MTP-layer steps. (So its
// snapshots hold no MTP state, and a later request starting from one decodes plainly, whatever its cohort.)
bool Engine::Impl::start_mtp() {
  if (!mtp_enabled) return false;
  if (!cfg.mtp_adaptive) return true;
  if (cohort_loops < kCohortLoops) return cohort_mtp;
  std::int64_t samples = 0;
  const double ratio = mtp_cost_ratio(samples);
  const bool pays = ratio > 0 && ratio < 0.97;
  const bool explored = exploring;
  exploring = false;
  if (samples == 0) {
    cohort_mtp = !cohort_mtp;  // nothing to compare yet: alternate
  } else {
    // After an exploring cohort: the choice stood, so look less often; or it changed, so look again soon.
    if (explored) explore_every = pays == mtp_pays ? std::min(explore_every * 2, 64) : 4;
    mtp_pays = pays;
    exploring = ++cohorts_since_explore >= explore_every;
    if (exploring) cohorts_since_explore = 0;
    cohort_mtp = exploring ? !pays : pays;
  }
  cohort_loops = 0;
  return cohort_mtp;
}

void Engine::Impl::start(const std::shared_ptr<Request>& r) {
  auto s = std::make_unique<Slot>();
  s->req = r;
  s->L = static_cast<std::int64_t>(r->prompt.size());
  const bool use_cache = cache.enabled() && r->use_cache;
  CacheHit hit;
  if (use_cache) hit = cache.lookup(r->prompt, s->L - 1);
  s->seq = hit.node ? ctx.create_sequence_from(hit.snapshot) : ctx.create_sequence();
  s->has_seq = true;
  s->pos = hit.length;
  s->fed.assign(r->prompt.begin(), r->prompt.begin() + s->pos);
  s->lineage = hit.node;
  s->last_snapshot = s->pos;
  s->sampler = std::make_unique<Sampler>(r->sampling, V);
  s->sampler->observe(r->prompt);
  if (!s->sampler->greedy()) s->ahead = std::make_unique<Sampler>(r->sampling, V);
  s->text = std::make_unique<StopText>(tok, r->stop_strings);
  if (use_cache) {
    if (cfg.cache_interval > 0)
      for (std::int64_t p = cfg.cache_interval; p < s->L - 1; p += cfg.cache_interval) s->points.push_back(p);
    for (const std::int64_t b : r->boundaries)
      if (b > 0 && b < s->L - 1) s->points.push_back(b);
    if (s->L >= 2) s->points.push_back(s->L - 1);
    std::sort(s->points.begin(), s->points.end());
    s->points.erase(std::unique(s->points.begin(), s->points.end()), s->points.end());
    s->points.erase(std::remove_if(s->points.begin(), s->points.end(), [&](std::int64_t p) { return p <= s->pos; }), s->points.end());
  }
  s->mtp = start_mtp() && (hit.node == 0 || (hit.mtp && static_cast<int>(hit.hidden.size()) == H &&
                                              ctx.mtp_length(s->seq) == s->pos - 1));
  s->mtp_cohort = s->mtp;
  if (s->mtp && hit.node) {
    s->pair_hidden.assign(hit.hidden.begin(), hit.hidden.end());
    s->pair_tokens.push_back(r->prompt[static_cast<std::size_t>(s->pos)]);
  }
  s->alpha = alpha_global;
  {
    std::lock_guard lk(r->m);
    r->cached_tokens = s->pos;
  }
  {
    std::lock_guard lk(mm);
    ++met.requests;
    met.prompt_tokens += s->L;
    met.cached_tokens += s->pos;
    const CacheStats cs = cache.stats();
    met.cache_hits = cs.hits;
    met.cache_misses = cs.misses;
  }
  running.push_back(std::move(s));
}

int Engine::Impl::choose_k(Slot& s) {
  const int K = static_cast<int>(std::min<std::int64_t>({cfg.mtp, s.req->max_tokens - s.generated - 1,
                                                          cfg.max_context - static_cast<std::int64_t>(s.fed.size()) - 2}));
  if (K <= 0) return 0;
  if (!cfg.mtp_adaptive || !main_cost.known() || !draft_cost.known()) return K;
  double a = 0, b = 0, ad = 0, bd = 0;
  main_cost.fit(a, b);
  draft_cost.fit(ad, bd);
  // This sequence's share of a plain loop, and what each draft adds: a verify row, a draft-step row,
  // and its part of the draft step's fixed cost.
  const double n = static_cast<double>(std::max<std::size_t>(last_decoding, 1));
  const double share = (a + b * static_cast<double>(std::max<std::int64_t>(last_rows, 1))) / n;
  const double per_draft = b + bd + ad / std::max<double>(1.0, static_cast<double>(last_drafting));
  int best = 0;
  double best_rate = 0;
  for (int k = 0; k <= K; ++k) {
    const double rate = expected_tokens(k, s.alpha) / (share + k * per_draft);
    if (rate > best_rate * 1.02) {  // a draft must pay clearly, or it is noise
      best_rate = rate;
      best = k;
    }
  }
  // Drafts that are hardly ever accepted: stop feeding the MTP layer altogether (so that a drafting cohort
  // on a model whose head does not predict costs little more than the plain cohorts the gate then chooses).
  if ((s.trials >= 8 && s.alpha < 0.1) || (best == 0 && ++s.rounds_at_zero >= 48)) {
    s.mtp = false;
    s.pair_hidden.clear();
    s.pair_tokens.clear();
    return 0;
  }
  if (best > 0) s.rounds_at_zero = 0;
  // Now and then a neighbour, so that a change in acceptance is noticed (seldom when drafts fail).
  if (++s.since_explore >= (s.alpha < 0.3 ? 64 : 16)) {
    s.since_explore = 0;
    return best == K ? best - 1 : best + 1;
  }
  return best;
}

void Engine::Impl::iterate() {
  // (a) Drafts per decoding sequence.
  std::size_t decoding = 0, drafting = 0;
  for (auto& s : running) {
    s->k = 0;
    if (!s->decoding) continue;
    ++decoding;
    if (s->mtp) s->k = choose_k(*s);
    drafting += s->k > 0 ? 1 : 0;
  }
  // (b) The MTP layer: catch-up, drafts.
  if (mtp_enabled) mtp_phase();
  for (auto& s : running) s->k = std::min(s->k, static_cast<int>(s->drafts.size()));
  // (c) Snapshots due where the last step's chunks ended (the MTP layer is caught up by now).
  for (auto& s : running)
    if (s->snapshot_due) {
      s->snapshot_due = false;
      take_snapshot(*s);
    }
  // (d) One step: decode rows first, then prefill chunks in arrival order under the budget.
  batch.clear();
  std::int64_t rows = 0;
  std::vector<std::vector<Token>> verify_tokens(running.size());
  for (std::size_t i = 0; i < running.size(); ++i) {
    Slot& s = *running[i];
    s.in_batch = false;
    if (!s.decoding) continue;
    auto& vt = verify_tokens[i];
    vt.push_back(s.pending);
    vt.insert(vt.end(), s.drafts.begin(), s.drafts.begin() + s.k);
    s.entry = batch.add(s.seq, vt, s.k > 0 ? LogitsFor::all : LogitsFor::last, s.mtp, /*rollback=*/s.k > 0);
    s.in_batch = true;
    rows += 1 + s.k;
  }
  std::int64_t budget = cfg.step_tokens - rows;
  for (auto& sp : running) {
    Slot& s = *sp;
    if (s.decoding || budget <= 0) continue;
    const std::int64_t next = s.next_point < s.points.size() ? s.points[s.next_point] : s.L;
    const std::int64_t n = std::min({s.L - s.pos, budget, next - s.pos});
    const bool last = s.pos + n == s.L;
    s.entry = batch.add(s.seq, std::span(s.req->prompt).subspan(static_cast<std::size_t>(s.pos), static_cast<std::size_t>(n)),
                        last ? LogitsFor::last : LogitsFor::none, s.mtp, /*rollback=*/false);
    s.chunk = n;
    s.in_batch = true;
    budget -= n;
    rows += n;
  }
  if (batch.entries().empty()) return;
  const auto t0 = Clock::now();
  ctx.step(batch);
  const double dt = seconds(Clock::now() - t0);
  main_cost.add(static_cast<double>(rows), dt);
  last_decoding = decoding;
  last_drafting = drafting;
  last_rows = rows;
  {
    std::lock_guard lk(mm);
    ++met.steps;
    met.step_rows += rows;
  }
  // (e) Results.
  for (auto& s : running) {
    if (!s->in_batch) continue;
    if (s->decoding) post_decode(*s);
    else post_prefill(*s);
  }
}

void Engine::Impl::mtp_phase() {
  // The first MTP step: every queued pair of a drafting sequence (the last gives its first draft), and
  // all but the last queued pair of sequences that are prefilling, have a snapshot due, or have many.
  mtp_batch.clear();
  mtp_hidden.clear();
  std::vector<Slot*> drafters, flushed;
  std::vector<std::size_t> flushed_n;
  for (auto& sp : running) {
    Slot& s = *sp;
    if (!s.mtp || s.pair_tokens.empty()) continue;
    if (s.decoding && s.k > 0) {
      mtp_batch.add(s.seq, s.pair_tokens, LogitsFor::last);
      mtp_hidden.insert(mtp_hidden.end(), s.pair_hidden.begin(), s.pair_hidden.end());
      drafters.push_back(&s);
    } else if (s.pair_tokens.size() > 1 && (!s.decoding || s.pair_tokens.size() > 64)) {
      const std::size_t n = s.pair_tokens.size() - 1;
      mtp_batch.add(s.seq, std::span(s.pair_tokens).first(n), LogitsFor::none);
      mtp_hidden.insert(mtp_hidden.end(), s.pair_hidden.begin(), s.pair_hidden.begin() + static_cast<std::ptrdiff_t>(n * H));
      flushed.push_back(&s);
      flushed_n.push_back(n);
    }
  }
  if (mtp_batch.entries().empty()) return;
  auto t0 = Clock::now();
  ctx.step_mtp(mtp_batch, mtp_hidden);
  if (!drafters.empty()) draft_cost.add(static_cast<double>(mtp_batch.token_count()), seconds(Clock::now() - t0));
  const auto draft_from = [&](Slot& s, std::int64_t row, int d) {
    std::span<float> q(probs);
    s.sampler->distribution(ctx.logits(row), q, s.drafts);
    Token t = 0;
    if (s.sampler->greedy()) {
      t = argmax(q);
    } else {
      while (s.uniforms.size() <= static_cast<std::size_t>(d)) s.uniforms.push_back(s.ahead->uniform());
      t = draw_with(q, s.uniforms[static_cast<std::size_t>(d)]);
    }
    s.drafts.push_back(t);
    const auto h = ctx.hidden(row);
    s.chain_hidden.assign(h.begin(), h.end());
  };
  for (std::size_t i = 0; i < mtp_batch.entries().size(); ++i) {
    const auto& e = mtp_batch.entries()[i];
    Slot* s = nullptr;
    for (Slot* d : drafters)
      if (d->seq == e.seq) s = d;
    if (s != nullptr) {
      s->mtp_valid = ctx.mtp_length(s->seq);
      s->drafts.clear();
      s->pair_tokens.clear();
      s->pair_hidden.clear();
      draft_from(*s, mtp_batch.last_row(i), 0);
    }
  }
  for (std::size_t j = 0; j < flushed.size(); ++j) {
    Slot& s = *flushed[j];
    const std::size_t n = flushed_n[j];
    s.pair_tokens.erase(s.pair_tokens.begin(), s.pair_tokens.begin() + static_cast<std::ptrdiff_t>(n));
    s.pair_hidden.erase(s.pair_hidden.begin(), s.pair_hidden.begin() + static_cast<std::ptrdiff_t>(n * H));
  }
  // Chained drafts: (post-norm MTP hidden, drafted token) at the next position.
  for (int d = 1;; ++d) {
    mtp_batch.clear();
    mtp_hidden.clear();
    std::vector<Slot*> step;
    for (Slot* s : drafters)
      if (s->k > d) {
        mtp_batch.add(s->seq, std::span(&s->drafts.back(), 1), LogitsFor::last);
        mtp_hidden.insert(mtp_hidden.end(), s->chain_hidden.begin(), s->chain_hidden.end());
        step.push_back(s);
      }
    if (step.empty()) break;
    t0 = Clock::now();
    ctx.step_mtp(mtp_batch, mtp_hidden);
    draft_cost.add(static_cast<double>(step.size()), seconds(Clock::now() - t0));
    for (std::size_t i = 0; i < step.size(); ++i) draft_from(*step[i], mtp_batch.last_row(i), d);
  }
}

// Feeds all but the last queued MTP pair of each slot (before a snapshot at the end of a request).
void Engine::Impl::flush_mtp(std::span<Slot* const> slots) {
  mtp_batch.clear();
  mtp_hidden.clear();
  std::vector<Slot*> fed_slots;
  for (Slot* s : slots) {
    if (!s->mtp || s->pair_tokens.size() <= 1) continue;
    const std::size_t n = s->pair_tokens.size() - 1;
    mtp_batch.add(s->seq, std::span(s->pair_tokens).first(n), LogitsFor::none);
    mtp_hidden.insert(mtp_hidden.end(), s->pair_hidden.begin(), s->pair_hidden.begin() + static_cast<std::ptrdiff_t>(n * H));
    fed_slots.push_back(s);
  }
  if (fed_slots.empty()) return;
  ctx.step_mtp(mtp_batch, mtp_hidden);
  for (Slot* s : fed_slots) {
    const std::size_t n = s->pair_tokens.size() - 1;
    s->pair_tokens.erase(s->pair_tokens.begin(), s->pair_tokens.begin() + static_cast<std::ptrdiff_t>(n));
    s->pair_hidden.erase(s->pair_hidden.begin(), s->pair_hidden.begin() + static_cast<std::ptrdiff_t>(n * H));
  }
}

void Engine::Impl::take_snapshot(Slot& s) {
  const std::int64_t len = ctx.sequence_length(s.seq);
  if (len != static_cast<std::int64_t>(s.fed.size()) || len <= s.last_snapshot) return;
  const SnapshotId snap = ctx.snapshot(s.seq);
  const bool mtp_ok = s.mtp && s.pair_tokens.size() == 1 && ctx.mtp_length(s.seq) == len - 1;
  std::vector<float> hidden;
  if (mtp_ok) hidden = s.pair_hidden;
  const std::uint64_t node = cache.insert(s.fed, snap, std::move(hidden), mtp_ok, s.lineage);
  if (node != 0) {
    s.lineage = node;
    s.last_snapshot = len;
  }
  const CacheStats cs = cache.stats();
  std::lock_guard lk(mm);
  met.cache_bytes = cs.bytes;
  met.cache_nodes = cs.snapshots;
  met.cache_evicted = cs.evicted;
}

Token Engine::Impl::commit_sample(Slot& s, std::span<const float> logits) {
  const Token x = s.sampler->sample(logits);
  s.sampler->observe(x);
  if (!s.sampler->greedy()) {
    // The sampler drew one uniform; keep the look-ahead aligned with it.
    if (!s.uniforms.empty()) s.uniforms.pop_front();
    else s.ahead->uniform();
  }
  return x;
}

void Engine::Impl::post_prefill(Slot& s) {
  const auto& prompt = s.req->prompt;
  const std::int64_t n = s.chunk;
  s.fed.insert(s.fed.end(), prompt.begin() + s.pos, prompt.begin() + s.pos + n);
  if (s.mtp)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = s.pos + i;
      if (t + 1 >= s.L) break;  // the last position's pair waits for the first sampled token
      const auto h = ctx.hidden(batch.output_row(s.entry, i));
      s.pair_hidden.insert(s.pair_hidden.end(), h.begin(), h.end());
      s.pair_tokens.push_back(prompt[static_cast<std::size_t>(t + 1)]);
    }
  s.pos += n;
  if (s.next_point < s.points.size() && s.pos == s.points[s.next_point]) {
    ++s.next_point;
    s.snapshot_due = true;
  }
  if (s.pos < s.L) return;
  const std::int64_t row = batch.last_row(s.entry);
  const Token first = commit_sample(s, ctx.logits(row));
  if (s.mtp) {
    const auto h = ctx.hidden(row);
    s.pair_hidden.insert(s.pair_hidden.end(), h.begin(), h.end());
    s.pair_tokens.push_back(first);
  }
  s.decoding = true;
  s.pending = first;
  take(s, std::span(&first, 1));
}

void Engine::Impl::post_decode(Slot& s) {
  const std::int64_t row0 = batch.entries()[s.entry].output_begin;
  std::vector<Token> committed;
  if (s.k == 0) {
    const std::int64_t row = batch.last_row(s.entry);
    const Token x = commit_sample(s, ctx.logits(row));
    committed.push_back(x);
    s.fed.push_back(s.pending);
    if (s.mtp) {
      const auto h = ctx.hidden(row);
      s.pair_hidden.insert(s.pair_hidden.end(), h.begin(), h.end());
      s.pair_tokens.push_back(x);
    }
  } else {
    // Each position's token is drawn exactly as plain decoding draws it; a draft is accepted only
    // when it is that token.
    int a = 0;
    for (int j = 0; j <= s.k; ++j) {
      const Token x = commit_sample(s, ctx.logits(row0 + j));
      committed.push_back(x);
      if (j < s.k && x == s.drafts[static_cast<std::size_t>(j)]) {
        ++a;
        continue;
      }
      break;
    }
    ctx.rollback(s.seq, a + 1);
    ctx.truncate_mtp(s.seq, s.mtp_valid);
    s.fed.push_back(s.pending);
    s.fed.insert(s.fed.end(), s.drafts.begin(), s.drafts.begin() + a);
    if (s.mtp)
      for (int j = 0; j <= a; ++j) {
        const auto h = ctx.hidden(row0 + j);
        s.pair_hidden.insert(s.pair_hidden.end(), h.begin(), h.end());
        s.pair_tokens.push_back(committed[static_cast<std::size_t>(j)]);
      }
    const int trials = a < s.k ? a + 1 : s.k;
    const double rate = static_cast<double>(a) / trials;
    s.alpha = 0.8 * s.alpha + 0.2 * rate;
    s.trials += trials;
    alpha_global = 0.8 * alpha_global + 0.2 * rate;
    {
      std::lock_guard lk(mm);
      met.drafted += s.k;
      met.accepted += a;
    }
    std::lock_guard lk(s.req->m);
    s.req->drafted += s.k;
    s.req->accepted += a;
  }
  s.drafts.clear();
  s.pending = committed.back();
  const std::size_t taken = take(s, committed);
  if (taken < committed.size()) {
    // Stopped inside the round: the sequence keeps only what the answer holds (the stop token last,
    // unfed), so a snapshot of it is the conversation's true prefix.
    const std::size_t extra = committed.size() - taken;
    ctx.rollback(s.seq, static_cast<std::int64_t>(taken));
    s.fed.resize(s.fed.size() - extra);
    if (s.mtp && s.pair_tokens.size() >= extra) {
      s.pair_tokens.resize(s.pair_tokens.size() - extra);
      s.pair_hidden.resize(s.pair_tokens.size() * static_cast<std::size_t>(H));
    }
  }
}

// Hands the generated tokens to the request, stopping at a stop token, a stop string or the length
// limit; returns how many were taken.
std::size_t Engine::Impl::take(Slot& s, std::span<const Token> tokens) {
  std::string out;
  std::int64_t n = 0;
  for (const Token t : tokens) {
    ++s.generated;
    ++n;
    s.out_tokens.push_back(t);
    const auto& stops = s.req->stop_tokens;
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) {
      s.text->finish(piece);
      out += piece;
      s.finish = Finish::stop;
      break;
    }
    if (s.text->push(t, piece)) {
      out += piece;
      s.finish = Finish::stop;
      break;
    }
    out += piece;
    if (s.generated >= s.req->max_tokens || static_cast<std::int64_t>(s.fed.size()) + 1 >= cfg.max_context) {
      s.text->finish(piece);
      out += piece;
      s.finish = Finish::length;
      break;
    }
  }
  emit(s, out, n);
  s.out_tokens.clear();
  return static_cast<std::size_t>(n);
}

void Engine::Impl::emit(Slot& s, const std::string& text, std::int64_t tokens) {
  const auto now = Clock::now();
  {
    std::lock_guard lk(mm);
    met.generated_tokens += tokens;
    if (!s.first_emitted) {
      met.ttft.add(seconds(now - s.req->arrival));
      for (std::int64_t i = 1; i < tokens; ++i) met.itl.add(0.0);
    } else {
      const double gap = seconds(now - s.last_emit) / static_cast<double>(std::max<std::int64_t>(tokens, 1));
      for (std::int64_t i = 0; i < tokens; ++i) met.itl.add(gap);
    }
  }
  s.first_emitted = true;
  s.last_emit = now;
  {
    std::lock_guard lk(s.req->m);
    s.req->text += text;
    s.req->tokens.insert(s.req->tokens.end(), s.out_tokens.begin(), s.out_tokens.end());
    s.req->completion_tokens = s.generated;
  }
  s.req->cv.notify_all();
}

void Engine::Impl::finish_slots() {
  std::vector<Slot*> ending;
  for (auto& s : running)
    if (s->finish != Finish::none) ending.push_back(s.get());
  if (ending.empty()) return;
  // A finished generation is a prefix too (an agent's next turn starts with it).
  try {
    std::vector<Slot*> snap;
    for (Slot* s : ending)
      if ((s->finish == Finish::stop || s->finish == Finish::length) && cache.enabled() && s->req->use_cache &&
          static_cast<std::int64_t>(s->fed.size()) > s->last_snapshot && ctx.usable())
        snap.push_back(s);
    if (!snap.empty()) {
      flush_mtp(snap);
      for (Slot* s : snap) take_snapshot(*s);
    }
  } catch (const std::exception&) {
    // A snapshot is an optimisation; the answers are complete.
  }
  for (Slot* s : ending) close(*s, s->finish);
  running.erase(std::remove_if(running.begin(), running.end(), [](const auto& s) { return s->finish != Finish::none; }),
                running.end());
  std::lock_guard lk(mm);
  met.running = static_cast<std::int64_t>(running.size());
}

void Engine::Impl::close(Slot& s, Finish f, const std::string& error) {
  s.finish = f;
  if (s.has_seq) {
    try {
      ctx.free_sequence(s.seq);
    } catch (const std::exception&) {
    }
    s.has_seq = false;
  }
  {
    std::lock_guard lk(mm);
    if (f == Finish::cancelled) ++met.cancelled;
    else if (f == Finish::error) ++met.failed;
    else ++met.finished;
  }
  {
    std::lock_guard lk(s.req->m);
    s.req->finish = f;
    s.req->error = error;
    s.req->done = true;
  }
  s.req->cv.notify_all();
}

void Engine::Impl::fail_all(const std::string& why) {
  for (auto& s : running) s->finish = Finish::error;
  for (auto& s : running) close(*s, Finish::error, why);
  running.clear();
  if (!ctx.usable()) {
    std::deque<std::shared_ptr<Request>> left;
    {
      std::lock_guard lk(qm);
      healthy = false;
      left.swap(queue);
    }
    for (auto& r : left) {
      Slot s;
      s.req = r;
      close(s, Finish::error, why);
    }
  }
}

}  // namespace gdn::serve
