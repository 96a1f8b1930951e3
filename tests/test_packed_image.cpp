// The packed weight image (gdn/model/packed_image.hpp): written once, mapped by every load; logits
// from it are bit-identical to packing at load and to reading in place, on every fixture layout;
// loading finds it where `gdn pack` puts it; a refused image (its refusals are catalogued in
// test_bad_inputs) falls back to the checkpoint with one line naming why; a sparse checkpoint
// gives a sparse image; and the header's codec and layout sizes agree with the kernels'.

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/linear.hpp"
#include "gdn/io/safetensors.hpp"
#include "gdn/model/memory_plan.hpp"
#include "gdn/model/packed_image.hpp"
#include "gdn/model/weights.hpp"
#include "random_checkpoint.hpp"
#include "test_util.hpp"

using namespace gdn;
namespace fs = std::filesystem;

namespace {

std::vector<float> logits_of(const std::shared_ptr<const Model>& model) {
  ContextParams p;
  p.max_sequences = 1;
  p.max_context = 80;
  p.max_batch_tokens = 80;
  p.threads = 2;
  Context ctx(model, p);
  std::vector<Token> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(static_cast<Token>((i * 37 + 5) % model->config().vocab_size));
  return test::prefill_logits(ctx, prompt);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool kernel_reads_images() { return !default_packed_image_path(".").empty(); }

}  // namespace

TEST_CASE("packed image layouts have the kernels' sizes", "[image]") {
  for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{{1, 1}, {31, 33}, {32, 64}, {33, 65}, {248, 5120}, {600, 17}}) {
    CHECK(packed_layout_elements("panels", rows, cols) == cpu::weight_image_elements(cpu::WeightImage::panels, rows, cols));
    CHECK(packed_layout_elements("amx_tiles", rows, cols) == cpu::weight_image_elements(cpu::WeightImage::amx_tiles, rows, cols));
    CHECK(packed_layout_elements("q8_0", rows, cols) == cpu::weight_image_elements(cpu::WeightImage::q8_0, rows, cols));
    CHECK(packed_layout_elements("q4_0", rows, cols) == cpu::weight_image_elements(cpu::WeightImage::q4_0, rows, cols));
    CHECK(packed_layout_elements("q5_0", rows, cols) == cpu::weight_image_elements(cpu::WeightImage::q5_0, rows, cols));
    CHECK(packed_layout_elements("q4_k", rows, cols) == cpu::weight_image_elements(cpu::WeightImage::q4_k, rows, cols));
  }
  CHECK(packed_layout_elements("none", 32, 32) == 0);
}

TEST_CASE("the header round-trips and lays tensors out aligned", "[image]") {
  PackedImageHeader h;
  h.layout = "panels";
  h.layout_version = packed_layout_version("panels");
  h.fingerprint = "abc";
  h.writer = "test";
  h.tensors = {{"a", 33, 65, 0, packed_layout_elements("panels", 33, 65) * 2, ""}, {"b", 1, 1, 0, packed_layout_elements("panels", 1, 1) * 2, ""}};
  const std::string head = encode_packed_image_header(h);
  CHECK(head.size() == h.data_offset);
  CHECK(h.data_offset % PackedImageHeader::alignment == 0);
  std::vector<std::byte> file(h.file_bytes);
  std::memcpy(file.data(), head.data(), head.size());
  const PackedImageHeader p = parse_packed_image_header(file, "t.gdnimg");
  CHECK(p.layout == "panels");
  CHECK(p.fingerprint == "abc");
  REQUIRE(p.tensors.size() == 2);
  CHECK(p.tensors[1].offset % PackedImageHeader::alignment == 0);
  CHECK(p.tensors[1].offset >= p.tensors[0].offset + p.tensors[0].bytes);
  CHECK(p.file_bytes == file.size());
}

TEST_CASE("logits from a mapped image equal packing at load and reading in place", "[image]") {
  if (!kernel_reads_images()) {
    WARN("SKIPPED: this CPU's projection kernel reads weights in place (no image layout)");
    return;
  }
  for (const char* fixture : {"qwen35_tied", "qwen35_cond_mtp", "qwen35_f32params", "qwen3next_dense"}) {
    INFO("fixture " << fixture);
    test::TempDir dir("image");
    const fs::path copy = fs::path(dir.str()) / fixture;
    fs::copy(test::fixture_model(fixture), copy, fs::copy_options::recursive);
    const PackImageResult r = write_packed_image(copy.string());
    CHECK(r.path == default_packed_image_path(copy.string()));
    CHECK(fs::file_size(r.path) == r.file_bytes);
    // Found where gdn pack puts it, without being named.
    std::vector<std::string> notices;
    ModelParams mp;
    mp.notice = [&](const std::string& line) { notices.push_back(line); };
    const auto mapped = Model::load(copy.string(), mp);
    CHECK(mapped->weight_placement() == WeightPlacement::image);
    CHECK(mapped->packed_image_path() == r.path);
    CHECK(notices.empty());
    ModelParams in_place, packed;
    in_place.weights = WeightPlacement::in_place;
    packed.packed_image = (copy / "no-such-image").string();  // not found: packs (with a notice)
    packed.notice = [](const std::string&) {};
    const auto m_packed = Model::load(copy.string(), packed);
    CHECK(m_packed->weight_placement() == WeightPlacement::packed);
    CHECK(m_packed->packed_bytes() == mapped->packed_bytes());
    // Packing asked for packs although a valid image is there (no image looked for, no notice),
    // and the plan says the same.
    ModelParams pack_asked;
    pack_asked.weights = WeightPlacement::packed;
    pack_asked.notice = [&](const std::string& line) { notices.push_back(line); };
    const auto m_pack_asked = Model::load(copy.string(), pack_asked);
    CHECK(m_pack_asked->weight_placement() == WeightPlacement::packed);
    CHECK(m_pack_asked->packed_image_path().empty());
    CHECK(notices.empty());
    const MemoryPlan pack_plan = plan_memory(copy.string(), ContextParams{}, pack_asked);
    CHECK(pack_plan.weights == WeightPlacement::packed);
    CHECK(pack_plan.packed_image.empty());
    CHECK(plan_memory(copy.string()).weights == WeightPlacement::image);
    const auto l = logits_of(mapped);
    CHECK(same_bits(l, logits_of(m_packed)));
    CHECK(same_bits(l, logits_of(m_pack_asked)));
    CHECK(same_bits(l, logits_of(Model::load(copy.string(), in_place))));
    // The fingerprint read from the files equals the one from the mapping.
    const PackedImageHeader h = read_packed_image_header(r.path);
    std::vector<std::string> names;
    for (const auto& t : h.tensors) names.push_back(t.name);
    CHECK(checkpoint_fingerprint(copy.string(), names) == h.fingerprint);
    CHECK(checkpoint_fingerprint(io::Checkpoint(copy.string()), names) == h.fingerprint);
  }
}

TEST_CASE("a refused image falls back to the checkpoint with one line saying why", "[image]") {
  if (!kernel_reads_images()) {
    WARN("SKIPPED: this CPU's projection kernel reads weights in place (no image layout)");
    return;
  }
  test::TempDir dir("image_refused");
  const fs::path copy = fs::path(dir.str()) / "m";
  fs::copy(test::fixture_model("qwen35_tied"), copy, fs::copy_options::recursive);
  const PackImageResult r = write_packed_image(copy.string());
  fs::resize_file(r.path, r.file_bytes - 4096);  // truncated
  std::vector<std::string> notices;
  ModelParams mp;
  mp.notice = [&](const std::string& line) { notices.push_back(line); };
  const auto m = Model::load(copy.string(), mp);
  CHECK(m->weight_placement() == WeightPlacement::packed);
  REQUIRE(notices.size() == 1);
  CHECK_THAT(notices[0], Catch::Contains("not using the packed image") && Catch::Contains("truncated") &&
                             Catch::Contains("packed the weights at load instead"));
  // The plan sees the same.
  const MemoryPlan plan = plan_memory(copy.string());
  CHECK(plan.weights == WeightPlacement::packed);
  CHECK_THAT(plan.weights_reason, Catch::Contains("truncated"));
  // In place never looks at it.
  notices.clear();
  mp.weights = WeightPlacement::in_place;
  CHECK(Model::load(copy.string(), mp)->weight_placement() == WeightPlacement::in_place);
  CHECK(notices.empty());
}

TEST_CASE("a sparse checkpoint gives a sparse image", "[image]") {
  if (!kernel_reads_images()) {
    WARN("SKIPPED: this CPU's projection kernel reads weights in place (no image layout)");
    return;
  }
  test::TempDir dir("image_sparse");
  test::RandomModelSpec s;
  s.hidden = 256;
  s.ffn = 512;
  test::write_random_checkpoint(s, dir.str());
  // Zero every projection but the embedding (as a sparse all-zero checkpoint has them).
  auto tensors = test::read_tensors(dir.str());
  for (auto& [name, t] : tensors)
    if (t.shape.size() == 2 && name.find("embed") == std::string::npos) std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0});
  test::write_safetensors((fs::path(dir.str()) / "model.safetensors").string(), tensors);
  const PackImageResult r = write_packed_image(dir.str());
  struct stat st {};
  REQUIRE(::stat(r.path.c_str(), &st) == 0);
  // Only the header and the tied lm_head (the embedding, not zero) are written.
  const auto embedding = static_cast<std::uint64_t>(s.vocab) * s.hidden * 2;
  CHECK(r.written_bytes <= 3 * embedding + (64u << 10));
  CHECK(static_cast<std::uint64_t>(st.st_blocks) * 512 < r.file_bytes / 2);
  const auto m = Model::load(dir.str());
  CHECK(m->weight_placement() == WeightPlacement::image);
  ModelParams in_place;
  in_place.weights = WeightPlacement::in_place;
  CHECK(same_bits(logits_of(m), logits_of(Model::load(dir.str(), in_place))));
}

// The quantised images of each lm_head policy (ModelParams::lm_head_quant): each has its own file,
// its header records every tensor's encoding, the memory plan counts the lm_head in its format, the
// mapped image equals quantising at load bit for bit, and gdn pack is deterministic.
TEST_CASE("quantised images per lm_head policy: own file, encodings recorded, deterministic, mapped == packed", "[image][quant]") {
  for (const char* fixture : {"qwen35_tied", "qwen35_cond_mtp"}) {
    INFO("fixture " << fixture);
    test::TempDir dir("image_lm_head");
    const fs::path copy = fs::path(dir.str()) / fixture;
    fs::copy(test::fixture_model(fixture), copy, fs::copy_options::recursive);
    const auto read_all = [](const std::string& path) {
      std::ifstream f(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(f), {});
    };
    for (const WeightQuant quant : {WeightQuant::q4_0, WeightQuant::q4_k}) {
      const char* const qname = weight_quant_name(quant);
      const LmHeadQuant all_4bit = quant == WeightQuant::q4_0 ? LmHeadQuant::q4_0 : LmHeadQuant::q4_k;
      std::size_t sizes[2] = {};
      int k = 0;
      for (const LmHeadQuant lm : {LmHeadQuant::automatic, all_4bit}) {
        INFO("quant " << qname << " lm_head " << lm_head_quant_name(lm));
        PackImageOptions o;
        o.quant = quant;
        o.lm_head_quant = lm;
        const PackImageResult r = write_packed_image(copy.string(), o);
        CHECK(r.path == default_packed_image_path(copy.string(), quant, lm));
        CHECK(fs::path(r.path).filename() == (lm == LmHeadQuant::automatic ? fmt::format("gdn-packed.{}.gdnimg", qname)
                                                                           : fmt::format("gdn-packed.{0}.lm_head-{0}.gdnimg", qname)));
        const std::string first = read_all(r.path);
        const PackImageResult again = write_packed_image(copy.string(), o);
        CHECK(read_all(again.path) == first);  // byte-identical
        const PackedImageHeader h = read_packed_image_header(r.path);
        CHECK(h.weight_encoding == qname);
        ModelParams mp;
        mp.quant = quant;
        mp.lm_head_quant = lm;
        mp.weights = WeightPlacement::image;
        const auto mapped = Model::load(copy.string(), mp);
        CHECK(mapped->packed_image_path() == r.path);
        int q8 = 0;
        for (const auto& t : h.tensors) q8 += t.encoding == "q8_0";
        CHECK(q8 == (lm == LmHeadQuant::automatic ? 1 : 0));  // the lm_head alone (tied: the embedding's copy)
        const std::string lm_name = mapped->config().tie_word_embeddings ? "embed_tokens" : "lm_head";
        for (const auto& t : h.tensors)
          if (t.encoding == "q8_0") CHECK(t.name.find(lm_name) != std::string::npos);
        // The plan counts the bytes loading maps.
        CHECK(plan_memory(copy.string(), ContextParams{}, mp).packed_bytes == static_cast<std::int64_t>(mapped->packed_bytes()));
        mp.weights = WeightPlacement::packed;
        const auto packed = Model::load(copy.string(), mp);
        CHECK(packed->packed_bytes() == mapped->packed_bytes());
        CHECK(same_bits(logits_of(mapped), logits_of(packed)));
        sizes[k++] = mapped->packed_bytes();
      }
      CHECK(sizes[0] > sizes[1]);  // the q8_0 lm_head is larger
    }
  }
}

// q4_k_m: the projections llama.cpp's Q4_K_M gives more bits (TensorSpec::more_bits) are q8_0 in
// the image, the rest q4_k, or q5_0 where their rows are not whole super-blocks of 256 (the
// fixtures' are not); the plan counts what loading maps; mapped == packed.
TEST_CASE("q4_k_m image: its 8-bit projections are the ones the policy names", "[image][quant]") {
  for (const char* fixture : {"qwen35_cond_mtp", "qwen3next_dense"}) {
    INFO("fixture " << fixture);
    test::TempDir dir("image_q4_k_m");
    const fs::path copy = fs::path(dir.str()) / fixture;
    fs::copy(test::fixture_model(fixture), copy, fs::copy_options::recursive);
    PackImageOptions o;
    o.quant = WeightQuant::q4_k_m;
    const PackImageResult r = write_packed_image(copy.string(), o);
    CHECK(fs::path(r.path).filename() == "gdn-packed.q4_k_m.gdnimg");
    const PackedImageHeader h = read_packed_image_header(r.path);
    CHECK(h.weight_encoding == "q4_k");
    ModelParams mp;
    mp.quant = WeightQuant::q4_k_m;
    mp.weights = WeightPlacement::image;
    const auto mapped = Model::load(copy.string(), mp);
    std::set<std::string> more;
    int layers_with_more = 0;
    for (int i = 0; i < mapped->config().num_layers; ++i) layers_with_more += quant_more_bits_layer(i, mapped->config().num_layers);
    for (const auto& spec : model_tensor_specs(mapped->config(), mapped->weights().prefix, true))
      if (spec.more_bits) more.insert(spec.name);
    CHECK(layers_with_more > 0);
    CHECK(static_cast<int>(more.size()) == 2 * layers_with_more);  // the v_proj or in_proj_qkv(z), and down_proj
    int partial = 0;
    for (const auto& t : h.tensors) {
      INFO(t.name << " " << t.encoding << " [" << t.rows << ", " << t.cols << "]");
      const bool lm_head = t.name.find(mapped->config().tie_word_embeddings ? "embed_tokens" : "lm_head") != std::string::npos;
      CHECK(t.encoding == (more.count(t.name) || lm_head ? "q8_0" : t.cols % 256 == 0 ? "q4_k" : "q5_0"));
      partial += t.encoding == "q5_0";
    }
    CHECK(partial > 0);
    // The result counts each encoding's tensors (gdn pack prints them).
    std::size_t counted = 0;
    for (const auto& [encoding, n] : r.encodings) {
      counted += n;
      if (encoding == "q5_0") CHECK(static_cast<int>(n) == partial);
    }
    CHECK(counted == h.tensors.size());
    CHECK(plan_memory(copy.string(), ContextParams{}, mp).packed_bytes == static_cast<std::int64_t>(mapped->packed_bytes()));
    mp.weights = WeightPlacement::packed;
    const auto packed = Model::load(copy.string(), mp);
    CHECK(same_bits(logits_of(mapped), logits_of(packed)));
    // A q4_k image is not a q4_k_m one: refused, naming the first tensor that differs.
    o.quant = WeightQuant::q4_k;
    const PackImageResult plain = write_packed_image(copy.string(), o);
    mp.weights = WeightPlacement::image;
    mp.packed_image = plain.path;
    CHECK_THROWS_WITH(Model::load(copy.string(), mp), Catch::Contains("is q4_k, and this load reads it as q5_0"));
    // With the lm_head at 4 bits its rows (not whole super-blocks here) are q5_0 too; that image maps
    // for its own policy, and a load of another lm_head format is told the flags that fit it.
    o.quant = WeightQuant::q4_k_m;
    o.lm_head_quant = LmHeadQuant::q4_k;
    const PackImageResult four = write_packed_image(copy.string(), o);
    mp.packed_image = four.path;
    mp.lm_head_quant = LmHeadQuant::q4_k;
    mp.weights = WeightPlacement::image;
    const auto lm4 = Model::load(copy.string(), mp);
    mp.weights = WeightPlacement::packed;
    CHECK(same_bits(logits_of(lm4), logits_of(Model::load(copy.string(), mp))));
    mp.weights = WeightPlacement::image;
    mp.lm_head_quant = LmHeadQuant::automatic;
    CHECK_THROWS_WITH(Model::load(copy.string(), mp),
                      Catch::Contains("is q5_0, and this load reads it as q8_0 (lm_head_quant q8_0)") &&
                          Catch::Contains("--quant q4_k_m --lm-head-quant q8_0, or load with --lm-head-quant q4_k"));
  }
}
