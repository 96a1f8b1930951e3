// Exact state control: snapshot/restore, fork with copy-on-write KV pages, rollback inside the
// last step for every j, prefix reuse at token granularity, save/load across processes, and
// capacity errors that leave no partial state. "Exact" means bit-identical logits.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "test_util.hpp"

using namespace gdn;

namespace {

using Clock = std::chrono::steady_clock;

ContextParams params(int seqs = 4, int rollback = 8) {
  ContextParams p;
  p.max_sequences = seqs;
  p.max_context = 400;
  p.kv_page_size = 16;
  p.threads = 2;
  p.max_rollback_tokens = rollback;
  return p;
}

std::vector<Token> tokens_from(int seed, int n) {
  std::vector<Token> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<Token>((seed * 131 + i * 37 + (i * i) % 11) % 256));
  return t;
}

// Runs `steps` (each a list of tokens) on seq and returns the logits of the last token of each.
std::vector<float> run_steps(Context& ctx, SeqId seq, const std::vector<std::vector<Token>>& steps) {
  std::vector<float> out;
  Batch b;
  for (const auto& st : steps) {
    b.clear();
    b.add(seq, st, LogitsFor::last);
    ctx.step(b);
    out.insert(out.end(), ctx.logits(0).begin(), ctx.logits(0).end());
  }
  return out;
}

std::vector<std::vector<Token>> singles(const std::vector<Token>& t) {
  std::vector<std::vector<Token>> s;
  for (const Token x : t) s.push_back({x});
  return s;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const char* const model_names[] = {"qwen35_cond_mtp", "qwen35_tied"};

}  // namespace

TEST_CASE("snapshot, continue, restore, continue again: identical", "[state]") {
  for (const char* name : model_names) {
    auto model = Model::load(test::fixture_model(name));
    Context ctx(model, params());
    const SeqId s = ctx.create_sequence();
    run_steps(ctx, s, {tokens_from(1, 37)});  // 37: the last KV page is partial
    const SnapshotId snap = ctx.snapshot(s);
    const auto first = run_steps(ctx, s, singles(tokens_from(2, 20)));
    ctx.restore(s, snap);
    CHECK(ctx.sequence_length(s) == 37);
    const auto again = run_steps(ctx, s, singles(tokens_from(2, 20)));
    CHECK(same(first, again));
    ctx.free_snapshot(snap);
    CHECK_THROWS_AS(ctx.restore(s, snap), Error);  // a freed snapshot handle is refused
  }
}

TEST_CASE("fork shares KV pages copy-on-write; both branches equal runs without forking", "[state]") {
  for (const char* name : model_names) {
    auto model = Model::load(test::fixture_model(name));
    const auto prefix = tokens_from(3, 37), a_tail = tokens_from(4, 12), b_tail = tokens_from(5, 12);
    std::vector<float> ref_a, ref_b;
    {
      Context ref(model, params());
      SeqId x = ref.create_sequence();
      run_steps(ref, x, {prefix});
      ref_a = run_steps(ref, x, singles(a_tail));
      SeqId y = ref.create_sequence();
      run_steps(ref, y, {prefix});
      ref_b = run_steps(ref, y, singles(b_tail));
    }
    Context ctx(model, params());
    const SeqId a = ctx.create_sequence();
    run_steps(ctx, a, {prefix});
    const auto free_before = ctx.kv_free_pages();
    const SeqId b = ctx.fork_sequence(a);
    CHECK(ctx.kv_free_pages() == free_before);  // nothing copied yet
    CHECK(ctx.sequence_length(b) == 37);
    // Interleave the two branches so each write into the shared partial page must copy it.
    std::vector<float> got_a, got_b;
    Batch batch;
    for (std::size_t i = 0; i < a_tail.size(); ++i) {
      batch.clear();
      batch.add(b, b_tail[i]);
      batch.add(a, a_tail[i]);
      ctx.step(batch);
      got_b.insert(got_b.end(), ctx.logits(0).begin(), ctx.logits(0).end());
      got_a.insert(got_a.end(), ctx.logits(1).begin(), ctx.logits(1).end());
    }
    CHECK(same(got_a, ref_a));
    CHECK(same(got_b, ref_b));
    CHECK(ctx.kv_free_pages() < free_before);  // the partial page was copied
  }
}

TEST_CASE("rollback inside the last step is exact for every j", "[state][rollback]") {
  for (const char* name : model_names) {
    for (const DType dt : {DType::f32, DType::bf16}) {
      auto model = Model::load(test::fixture_model(name));
      const auto prompt = tokens_from(6, 45);
      const auto verify = tokens_from(7, 8);  // k + 1 = 8 tokens, as an MTP verify step with k = 7
      const auto after = tokens_from(8, 3);
      ContextParams p = params(2, 8);
      p.state_dtype = dt;
      Context ctx(model, p);
      Context ref(model, p);
      for (std::size_t j = 0; j <= verify.size(); ++j) {
        const SeqId s = ctx.create_sequence();
        run_steps(ctx, s, {prompt});
        Batch b;
        b.add(s, verify, LogitsFor::all);
        ctx.step(b);
        REQUIRE(ctx.rollbackable_tokens(s) == 8);
        ctx.rollback(s, static_cast<std::int64_t>(j));
        CHECK(ctx.sequence_length(s) == static_cast<std::int64_t>(prompt.size() + j));
        const auto got = run_steps(ctx, s, singles(after));
        ctx.free_sequence(s);
        // Reference: a sequence that only ever saw the first j verify tokens (as one step).
        const SeqId r = ref.create_sequence();
        run_steps(ref, r, {prompt});
        if (j > 0) run_steps(ref, r, {std::vector<Token>(verify.begin(), verify.begin() + static_cast<std::ptrdiff_t>(j))});
        const auto want = run_steps(ref, r, singles(after));
        ref.free_sequence(r);
        INFO(name << " state " << dtype_name(dt) << " j=" << j);
        CHECK(same(got, want));
      }
    }
  }
}

TEST_CASE("rollback is refused when it cannot be exact", "[state][rollback]") {
  auto model = Model::load(test::fixture_model("qwen35_tied"));
  Context ctx(model, params(2, 4));
  const SeqId s = ctx.create_sequence();
  Batch b;
  b.add(s, tokens_from(9, 6));  // more tokens than the log holds
  ctx.step(b);
  CHECK(ctx.rollbackable_tokens(s) == 0);
  CHECK_THROWS_AS(ctx.rollback(s, 2), Error);
  b.clear();
  b.add(s, tokens_from(10, 3));
  ctx.step(b);
  CHECK_THROWS_AS(ctx.rollback(s, 4), Error);  // keep > tokens of the step
  ctx.rollback(s, 1);
  ctx.rollback(s, 0);  // a second, shorter rollback of the same step is still exact
  CHECK(ctx.sequence_length(s) == 6);
  Context no_log(model, params(1, 0));
  const SeqId t = no_log.create_sequence();
  b.clear();
  b.add(t, tokens_from(11, 2));
  no_log.step(b);
  CHECK_THROWS_AS(no_log.rollback(t, 1), Error);
}

TEST_CASE("a step added with rollback = false is not logged, and computes the same", "[state][rollback]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  Context a(model, params(1, 4)), b(model, params(1, 4));
  const SeqId sa = a.create_sequence(), sb = b.create_sequence();
  const auto prompt = tokens_from(3, 20), next = tokens_from(4, 3);
  Batch ba, bb;
  ba.add(sa, prompt);
  bb.add(sb, prompt);
  a.step(ba);
  b.step(bb);
  ba.clear();
  bb.clear();
  ba.add(sa, next, LogitsFor::last);
  bb.add(sb, next, LogitsFor::last, false, /*rollback=*/false);
  a.step(ba);
  b.step(bb);
  const std::vector<float> la(a.logits(0).begin(), a.logits(0).end()), lb(b.logits(0).begin(), b.logits(0).end());
  CHECK(same(la, lb));
  CHECK(a.rollbackable_tokens(sa) == 3);
  CHECK(b.rollbackable_tokens(sb) == 0);
  CHECK_THROWS_AS(b.rollback(sb, 1), Error);
}

TEST_CASE("prefix reuse: many sequences start from one system-prompt snapshot", "[state][prefix]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  const auto system = tokens_from(12, 150);  // not a multiple of the 16-token page
  const int n = 6;
  ContextParams p = params(n + 1, 0);
  Context ctx(model, p);
  const SeqId base = ctx.create_sequence();
  const auto t0 = Clock::now();
  run_steps(ctx, base, {system});
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const SnapshotId snap = ctx.snapshot(base);
  ctx.free_sequence(base);
  double fork_s = 0;
  for (int i = 0; i < n; ++i) {
    const auto user = tokens_from(20 + i, 9);
    const auto t1 = Clock::now();
    const SeqId s = ctx.create_sequence_from(snap);
    fork_s += std::chrono::duration<double>(Clock::now() - t1).count();
    const auto got = run_steps(ctx, s, {user});
    ctx.free_sequence(s);
    Context fresh(model, params(1, 0));
    const SeqId f = fresh.create_sequence();
    run_steps(fresh, f, {system});
    const auto want = run_steps(fresh, f, {user});
    CHECK(same(got, want));
  }
  WARN(fmt::format("prefix reuse: 150-token system prompt prefill {:.3f} ms once; starting a sequence from the snapshot "
                   "{:.4f} ms on average ({} sequences): {:.0f}x cheaper than re-prefilling",
                   prefill_s * 1e3, fork_s / n * 1e3, n, prefill_s / (fork_s / n)));
  ctx.free_snapshot(snap);
  CHECK(ctx.kv_free_pages() == ctx.params().max_sequences * ceil(400 / 16.0));
}

TEST_CASE("costs of snapshot, fork and rollback are measured", "[state][costs]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  Context ctx(model, params(4, 4));
  const SeqId s = ctx.create_sequence();
  run_steps(ctx, s, {tokens_from(30, 100)});
  const int reps = 200;
  auto time = [&](auto&& f) {
    const auto t = Clock::now();
    for (int i = 0; i < reps; ++i) f();
    return std::chrono::duration<double>(Clock::now() - t).count() / reps * 1e6;
  };
  const double snap_us = time([&] { ctx.free_snapshot(ctx.snapshot(s)); });
  const double fork_us = time([&] { ctx.free_sequence(ctx.fork_sequence(s)); });
  // A 4-token verify step (k = 3), then a rollback to 1 token, from the same start each time.
  Batch b;
  b.add(s, tokens_from(31, 4), LogitsFor::all);
  const SnapshotId start = ctx.snapshot(s);
  double step_us = 0, rb_us = 0;
  for (int i = 0; i < 20; ++i) {
    ctx.restore(s, start);
    const auto t0 = Clock::now();
    ctx.step(b);
    const auto t1 = Clock::now();
    ctx.rollback(s, 1);
    const auto t2 = Clock::now();
    step_us += std::chrono::duration<double>(t1 - t0).count() * 1e6 / 20;
    rb_us += std::chrono::duration<double>(t2 - t1).count() * 1e6 / 20;
    CHECK(ctx.sequence_length(s) == 101);
  }
  ctx.free_snapshot(start);
  WARN(fmt::format("state costs (qwen35_cond_mtp fixture): snapshot+free {:.1f} us, fork+free {:.1f} us, rollback 4 -> 1 token {:.1f} us, "
                   "the 4-token verify step itself {:.1f} us; GDN state {} B, rollback log {} B per sequence, KV {} B per token",
                   snap_us, fork_us, rb_us, step_us, ctx.snapshot_bytes(), ctx.rollback_bytes_per_sequence(),
                   ctx.kv_bytes_per_token()));
  // Rollback memory: one GDN state plus small per-token inputs.
  CHECK(ctx.rollback_bytes_per_sequence() <= static_cast<std::int64_t>(1.25 * static_cast<double>(ctx.snapshot_bytes())) +
                                                 4 * 4 * 3 * (model->config().gdn_conv_dim() + 2 * model->config().linear_num_value_heads));
}

TEST_CASE("capacity errors are actionable and leave no partial state", "[state][capacity]") {
  auto model = Model::load(test::fixture_model("qwen35_tied"));
  ContextParams p = params(2, 0);
  p.kv_pages = 5;  // 80 positions in all
  Context ctx(model, p);
  const SeqId a = ctx.create_sequence();
  const SeqId b = ctx.create_sequence();
  try {
    ctx.create_sequence();
    FAIL("third sequence accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::out_of_capacity);
  }
  const auto prompt = tokens_from(40, 60);
  run_steps(ctx, a, {prompt});  // 4 pages
  Batch batch;
  batch.add(b, tokens_from(41, 30));  // needs 2 pages, 1 free
  try {
    ctx.step(batch);
    FAIL("step past the KV pool accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::out_of_capacity);
    CHECK(std::string(e.what()).find("KV pages") != std::string::npos);
  }
  CHECK(ctx.sequence_length(b) == 0);
  CHECK(ctx.sequence_length(a) == 60);
  // A mixed batch where one entry is bad changes nothing for the good one.
  batch.clear();
  batch.add(a, Token{5});
  batch.add(b, Token{9999});
  CHECK_THROWS_AS(ctx.step(batch), Error);
  CHECK(ctx.sequence_length(a) == 60);
  // Continuing after the errors equals a clean run.
  const auto got = run_steps(ctx, a, singles({5, 6, 7}));
  Context clean(model, params(1, 0));
  const SeqId c = clean.create_sequence();
  run_steps(clean, c, {prompt});
  CHECK(same(got, run_steps(clean, c, singles({5, 6, 7}))));
  // Context length limit.
  ContextParams small = params(1, 0);
  small.max_context = 10;
  Context tiny(model, small);
  const SeqId t = tiny.create_sequence();
  batch.clear();
  batch.add(t, tokens_from(42, 11));
  try {
    tiny.step(batch);
    FAIL("overflow accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::context_overflow);
  }
}

namespace {
std::string temp_path(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() / fmt::format("gdn_{}_{}", ::getpid(), leaf)).string();
}
void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}
std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(c.size() / 4);
  std::memcpy(v.data(), c.data(), v.size() * 4);
  return v;
}
}  // namespace

// Run by the test below in a separate process: loads the state and continues.
TEST_CASE("[child] load a saved sequence and continue", "[.child]") {
  const char* state = std::getenv("GDN_STATE_FILE");
  const char* out = std::getenv("GDN_LOGITS_OUT");
  REQUIRE(state != nullptr);
  REQUIRE(out != nullptr);
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  Context ctx(model, params(1, 0));
  const SeqId s = ctx.load_sequence(state);
  write_floats(out, run_steps(ctx, s, singles(tokens_from(51, 10))));
}

TEST_CASE("save a sequence, resume it bit-identically in a new process", "[state][file]") {
  auto model = Model::load(test::fixture_model("qwen35_cond_mtp"));
  Context ctx(model, params(2, 0));
  const SeqId s = ctx.create_sequence();
  run_steps(ctx, s, {tokens_from(50, 77)});
  // Also give the MTP layer some positions, so its KV is saved too.
  Batch mb;
  std::vector<float> hidden(static_cast<std::size_t>(5 * model->config().hidden_size), 0.25f);
  mb.add(s, tokens_from(52, 5), LogitsFor::none);
  ctx.step_mtp(mb, hidden);
  const std::string path = temp_path("seq.gdnstate");
  ctx.save_sequence(s, path);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
  const auto want = run_steps(ctx, s, singles(tokens_from(51, 10)));

  // In-process load into a different context.
  {
    Context other(model, params(3, 0));
    const SeqId t = other.load_sequence(path);
    CHECK(other.sequence_length(t) == 77);
    CHECK(other.mtp_length(t) == 5);
    CHECK(same(run_steps(other, t, singles(tokens_from(51, 10))), want));
  }
  // In a new process.
  const std::string out = temp_path("child.f32");
  const std::string cmd = fmt::format("GDN_STATE_FILE='{}' GDN_LOGITS_OUT='{}' '{}/bin/test_state_control' '[.child]' > /dev/null",
                                      path, out, GDN_BINARY_DIR);
  REQUIRE(std::system(cmd.c_str()) == 0);
  CHECK(same(read_floats(out), want));

  // Corruption is detected, and a wrong model is refused.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x55');
  }
  Context other(model, params(1, 0));
  try {
    other.load_sequence(path);
    FAIL("corrupted file accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::invalid_file);
    CHECK(std::string(e.what()).find("checksum") != std::string::npos);
  }
  ctx.save_sequence(s, path);
  auto tied = Model::load(test::fixture_model("qwen35_tied"));
  Context wrong(tied, params(1, 0));
  CHECK_THROWS_AS(wrong.load_sequence(path), Error);
  // A state written with a float32 KV cache is refused by a bf16 one (it would continue exactly in neither).
  ContextParams bf16_kv = params(1, 0);
  bf16_kv.kv_dtype = DType::bf16;
  Context rounded(model, bf16_kv);
  try {
    rounded.load_sequence(path);
    FAIL("a float32-KV state accepted by a bf16-KV context");
  } catch (const Error& e) {
    CHECK(e.status() == Status::invalid_argument);
    CHECK(std::string(e.what()).find("its KV cache dtype is F32, the context's is BF16") != std::string::npos);
  }
  std::filesystem::remove(path);
  std::filesystem::remove(out);
}
