// The memory plan (gdn/model/memory_plan.hpp) against what really happens: for fixtures and random
// checkpoints of odd sizes and several context parameters, a Context's own accounting equals the
// plan's per-sequence figures, the heap its construction allocates (measured with mallinfo2)
// equals the plan's context bytes, and the model's packed bytes and placement equal the plan's.
// Then the decisions loading makes from the memory it can get (GDN_MEMORY_AVAILABLE simulates a
// smaller machine): packing falls back to reading in place with one line saying why, --pack is
// refused with a Status, and a context that cannot fit is refused before anything is allocated.

#include <catch2/catch.hpp>

#include <malloc.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gdn/io/safetensors.hpp"
#include "gdn/model/memory_plan.hpp"
#include "gdn/model/packed_image.hpp"
#include "random_checkpoint.hpp"
#include "test_util.hpp"

using namespace gdn;

namespace {

std::int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<std::int64_t>(m.uordblks + m.hblkhd);
}

// Whether mallinfo2 sees this process's allocations: not under a sanitizer's allocator (ASan keeps
// its own heap and reports zeros), where the allocation comparisons are skipped with a message.
bool heap_measurable() {
  static const bool measurable = [] {
    const std::int64_t before = heap_in_use();
    void* volatile p = std::malloc(std::size_t{1} << 20);
    const bool seen = heap_in_use() - before >= (std::int64_t{1} << 20);
    std::free(p);
    if (!seen) WARN("mallinfo2 does not see this allocator (a sanitizer build): allocation sizes are not compared");
    return seen;
  }();
  return measurable;
}

// Sets GDN_MEMORY_AVAILABLE for the scope.
struct MemoryLimit {
  explicit MemoryLimit(const char* bytes) { ::setenv("GDN_MEMORY_AVAILABLE", bytes, 1); }
  ~MemoryLimit() { ::unsetenv("GDN_MEMORY_AVAILABLE"); }
};

std::vector<ContextParams> parameter_sets() {
  std::vector<ContextParams> out;
  ContextParams a;
  a.max_sequences = 1;
  a.max_context = 100;
  a.threads = 2;
  out.push_back(a);
  ContextParams b = a;
  b.max_sequences = 3;
  b.max_context = 300;
  b.max_batch_tokens = 64;
  b.max_rollback_tokens = 4;
  b.state_dtype = DType::bf16;
  out.push_back(b);
  ContextParams c = a;
  c.max_sequences = 5;
  c.kv_page_size = 7;
  c.matmul_input = MatmulInput::bf16;
  c.max_logits_rows = 9;
  c.threads = 1;
  out.push_back(c);
  return out;
}

void check_plan(const std::string& dir) {
  INFO("checkpoint " << dir);
  const ModelInfo info = inspect_model(dir);
  const auto model = Model::load(dir);
  // The summary: what the loader binds.
  io::Checkpoint ck(dir);
  CHECK(info.checkpoint.tensors == static_cast<std::int64_t>(ck.names().size()));
  CHECK(info.checkpoint.has_mtp == model->has_mtp());
  std::int64_t bytes = 0;
  for (const auto& n : ck.names()) bytes += static_cast<std::int64_t>(ck.get(n).nbytes());
  CHECK(info.checkpoint.bytes == bytes);
  CHECK(info.checkpoint.model_bytes + info.checkpoint.other_bytes == bytes);
  for (const ContextParams& p : parameter_sets()) {
    INFO("max_sequences " << p.max_sequences << ", max_context " << p.max_context << ", rollback " << p.max_rollback_tokens);
    const MemoryPlan plan = plan_memory(info, p);
    CHECK(plan.weights == model->weight_placement());
    if (model->weight_placement() != WeightPlacement::in_place)
      CHECK(plan.packed_bytes == static_cast<std::int64_t>(model->packed_bytes()));
    const std::int64_t before = heap_in_use();
    Context ctx(model, p);
    const std::int64_t allocated = heap_in_use() - before;
    CHECK(ctx.gdn_state_bytes_per_sequence() == plan.gdn_recurrent_bytes_per_sequence + plan.gdn_conv_bytes_per_sequence);
    CHECK(ctx.kv_bytes_per_token() == plan.kv_bytes_per_token);
    CHECK(ctx.rollback_bytes_per_sequence() == plan.rollback_bytes_per_sequence);
    CHECK(ctx.kv_free_pages() == plan.kv_pages);
    // What creating the context allocated, against the plan: the same within a few kB of small
    // bookkeeping (thread handles, vector headers) the plan leaves out.
    INFO("allocated " << allocated << ", planned " << plan.context_bytes);
    if (heap_measurable()) CHECK(std::llabs(allocated - plan.context_bytes) <= plan.context_bytes / 100 + 16384);
  }
}

}  // namespace

TEST_CASE("the memory plan is what a context allocates", "[plan]") {
  for (const char* fixture : {"qwen35_tied", "qwen35_cond_mtp", "qwen35_cond_mtp_single", "qwen35_f32params", "qwen3next_dense"})
    check_plan(test::fixture_model(fixture));
  // Odd sizes: dv 600, a conv kernel of 5, 80 query heads per kv head, an untied MTP model.
  test::RandomModelSpec s;
  s.lin_v_dim = 600;
  s.conv_kernel = 5;
  s.q_heads = 80;
  s.kv_heads = 1;
  s.head_dim = 4;
  s.mtp = true;
  s.tied = false;
  test::TempDir dir("plan");
  test::write_random_checkpoint(s, dir.str());
  check_plan(dir.str());
}

TEST_CASE("inspect_model refuses what Model::load refuses, with the same status", "[plan]") {
  test::TempDir dir("plan_bad");
  test::RandomModelSpec s;
  test::write_random_checkpoint(s, dir.str());
  auto cfg = test::random_model_config(s);
  cfg["intermediate_size"] = 49;  // the MLP tensors are [48, 32]
  std::ofstream(std::filesystem::path(dir.str()) / "config.json") << cfg.dump();
  const auto status_of = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.status();
    }
    return Status::ok;
  };
  CHECK(status_of([&] { inspect_model(dir.str()); }) == Status::tensor_mismatch);
  CHECK(status_of([&] { Model::load(dir.str()); }) == Status::tensor_mismatch);
  CHECK(status_of([&] { inspect_model("/nonexistent/dir"); }) == Status::io_error);
}

TEST_CASE("the CUDA plan is computed from the sizes the CUDA backend keeps", "[plan]") {
  const ModelInfo info = inspect_model(test::fixture_model("qwen35_cond_mtp"));
  const ModelConfig& c = info.config;
  ContextParams p;
  p.backend = Backend::cuda;
  p.max_sequences = 2;
  p.max_context = 64;
  p.max_rollback_tokens = 3;
  const MemoryPlan plan = plan_memory(info, p);
  const std::int64_t gdn = c.count_layers(LayerKind::linear_attention);
  const std::int64_t rec = gdn * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  const std::int64_t conv = gdn * (c.linear_conv_kernel_dim - 1) * c.gdn_conv_dim() * 2;
  CHECK(plan.device_weight_bytes == info.checkpoint.model_parameters * 2);
  CHECK(plan.gdn_recurrent_bytes_per_sequence == rec);
  CHECK(plan.gdn_conv_bytes_per_sequence == conv);
  CHECK(plan.kv_bytes_per_token == (c.count_layers(LayerKind::full_attention) + 1) * 2 * c.attn_kv_dim() * 2);
  CHECK(plan.rollback_bytes_per_sequence == 4 * (rec + conv));
  CHECK(plan.device_bytes >= plan.device_weight_bytes + 2 * (rec + conv + plan.rollback_bytes_per_sequence) + plan.kv_bytes);
}

TEST_CASE("loading decides from the memory it can get; a context that cannot fit is a Status", "[plan][memory]") {
  const std::string dir = test::fixture_model("qwen35_tied");
  if (default_packed_image_path(dir).empty()) {
    WARN("SKIPPED: this CPU's projection kernel reads weights in place; nothing to pack");
    return;
  }
  {
    MemoryLimit limit("1000");  // bytes: far less than the packed copy plus its margin
    std::vector<std::string> notices;
    ModelParams mp;
    mp.notice = [&](const std::string& line) { notices.push_back(line); };
    const auto model = Model::load(dir, mp);
    CHECK(model->weight_placement() == WeightPlacement::in_place);
    REQUIRE(notices.size() == 1);
    CHECK_THAT(notices[0], Catch::Contains("reading the weights of") && Catch::Contains("in place") &&
                               Catch::Contains("needs") && Catch::Contains("GDN_MEMORY_AVAILABLE") && Catch::Contains("gdn pack"));
    CHECK(model->weight_notice() == notices[0]);
    const MemoryPlan plan = plan_memory(dir);
    CHECK(plan.weights == WeightPlacement::in_place);
    CHECK_THAT(plan.weights_reason, Catch::Contains("packing them needs"));
    // --pack: refused, never killed.
    mp.weights = WeightPlacement::packed;
    try {
      Model::load(dir, mp);
      FAIL("packing was accepted");
    } catch (const Error& e) {
      CHECK(e.status() == Status::out_of_capacity);
      CHECK_THAT(e.what(), Catch::Contains("cannot pack the weights"));
    }
    // A context is refused before anything is allocated.
    const std::int64_t before = heap_in_use();
    try {
      Context ctx(model, ContextParams{});
      FAIL("the context was created");
    } catch (const Error& e) {
      CHECK(e.status() == Status::out_of_capacity);
      CHECK_THAT(e.what(), Catch::Contains("needs") && Catch::Contains("but 1.0 kB available"));
    }
    CHECK(heap_in_use() - before < 65536);  // nothing of the 18 MB it would need
  }
  // With memory to spare it packs, silently.
  std::vector<std::string> notices;
  ModelParams mp;
  mp.notice = [&](const std::string& line) { notices.push_back(line); };
  CHECK(Model::load(dir, mp)->weight_placement() == WeightPlacement::packed);
  CHECK(notices.empty());
}
