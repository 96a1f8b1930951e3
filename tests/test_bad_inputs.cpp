// The bad-input catalogue: files an embedding server did not make and requests it does not control.
// Every case names its id (listed with its status and message in docs/reliability.md; the last test
// checks that the two agree), asserts the exact gdn::Status (or gdn_status through the C ABI) and a
// substring of the message, and checks that nothing was left behind: a failed Model::load keeps no
// file open or mapped (and leaks nothing: the ASan build checks), a failed step or load_sequence
// changes no sequence, no KV page and no output, and the context then continues bit-identically to
// one that never saw the bad request. Bad files are made at test time from the fixtures.
//
// Cases already covered elsewhere are not repeated here; docs/reliability.md lists them with their
// test (test_safetensors, test_config, test_state_control, test_capi, test_tokenizer).

#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "gdn.h"
#include "gdn/io/tokenizer.hpp"
#include "gdn/model/packed_image.hpp"
#include "gdn/state/state_file.hpp"
#include "test_util.hpp"

using namespace gdn;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// ---------------------------------------------------------------------------------------------
// The checks every case makes.

// Runs f and expects gdn::Error with `status` and a message containing `needle`.
template <typename F>
void expect_error(const char* id, Status status, const std::string& needle, F&& f) {
  INFO("case " << id);
  try {
    f();
    FAIL_CHECK("accepted; expected " << status_name(status) << " '" << needle << "'");
  } catch (const Error& e) {
    INFO("message: " << e.what());
    CHECK(status_name(e.status()) == status_name(status));
    CHECK_THAT(e.what(), Catch::Contains(needle));
  } catch (const std::exception& e) {
    FAIL_CHECK("threw a non-gdn exception: " << e.what());
  }
}

// The same through the C ABI: f returns a gdn_status; the message is gdn_last_error().
template <typename F>
void expect_c_error(const char* id, gdn_status status, const std::string& needle, F&& f) {
  INFO("case " << id);
  const gdn_status got = f();
  INFO("message: " << gdn_last_error());
  CHECK(std::string(gdn_status_string(got)) == gdn_status_string(status));
  CHECK_THAT(gdn_last_error(), Catch::Contains(needle));
}

// ---------------------------------------------------------------------------------------------
// Files.

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("gdn_bad_inputs_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

std::vector<std::byte> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}
void write_bytes(const fs::path& p, std::span<const std::byte> b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

void put_le64(std::vector<std::byte>& b, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

// A safetensors file split into its JSON header (key order kept) and its data section.
struct Safetensors {
  ojson header;
  std::vector<std::byte> data;

  static Safetensors read(const fs::path& p) {
    const auto b = read_bytes(p);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint64_t>(b[static_cast<std::size_t>(i)]);
    Safetensors s;
    s.header = ojson::parse(reinterpret_cast<const char*>(b.data()) + 8, reinterpret_cast<const char*>(b.data()) + 8 + n);
    s.data.assign(b.begin() + static_cast<std::ptrdiff_t>(8 + n), b.end());
    return s;
  }
  // `header_text` replaces the serialised header (for what JSON objects cannot hold, e.g. a key twice).
  void write(const fs::path& p, const std::string& header_text = {}) const {
    const std::string h = header_text.empty() ? header.dump() : header_text;
    std::vector<std::byte> b(8 + h.size());
    put_le64(b, 0, h.size());
    std::memcpy(b.data() + 8, h.data(), h.size());
    b.insert(b.end(), data.begin(), data.end());
    write_bytes(p, b);
  }
};

// A fixture copied into a temp dir, to be damaged.
struct Copy {
  TempDir dir;
  fs::path path;
  explicit Copy(const std::string& fixture) : path(dir.path / fixture) {
    fs::copy(test::fixture_model(fixture), path, fs::copy_options::recursive);
  }
  fs::path file(const std::string& name) const { return path / name; }
  void edit_weights(const std::string& file_name, const std::function<void(Safetensors&)>& f) const {
    auto s = Safetensors::read(file(file_name));
    f(s);
    s.write(file(file_name));
  }
  void edit_config(const std::function<void(ojson&)>& f) const {
    auto j = ojson::parse(read_text(file("config.json")));
    f(j);
    write_text(file("config.json"), j.dump(2));
  }
  void load() const { Model::load(path.string()); }
};

// Open file descriptors and mappings of files under the temp directory: a failed load must leave none.
std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}
std::size_t temp_mappings() {
  std::ifstream maps("/proc/self/maps");
  const std::string needle = (fs::temp_directory_path() / "gdn_bad_inputs_").string();
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(needle) != std::string::npos;
  return n;
}

// `text` with the JSON string "@nested@" replaced by 200 000 nested arrays.
std::string with_nested(std::string text) {
  constexpr std::size_t depth = 200000;
  const std::string marker = "\"@nested@\"";
  const auto at = text.find(marker);
  REQUIRE(at != std::string::npos);
  text.replace(at, marker.size(), std::string(depth, '[') + std::string(depth, ']'));
  return text;
}

std::string with_nested_if(const std::string& text) {
  return text.find("\"@nested@\"") == std::string::npos ? text : with_nested(text);
}

std::vector<std::byte> safetensors_bytes(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> f(8 + header.size() + data_bytes, std::byte{0});
  put_le64(f, 0, header.size());
  std::memcpy(f.data() + 8, header.data(), header.size());
  return f;
}

// ---------------------------------------------------------------------------------------------
// Contexts.

ContextParams small_params(int sequences = 2, int max_context = 64) {
  ContextParams p;
  p.max_sequences = sequences;
  p.max_context = max_context;
  p.kv_page_size = 16;
  p.threads = 1;
  p.max_batch_tokens = 64;
  return p;
}

std::vector<Token> prompt(int seed, int n) {
  std::vector<Token> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<Token>((seed * 97 + i * 31 + i * i) % 256));
  return t;
}

std::vector<float> last_logits(Context& ctx, SeqId s, std::span<const Token> tokens) {
  Batch b;
  b.add(s, tokens, LogitsFor::last);
  ctx.step(b);
  const auto l = ctx.logits(0);
  return {l.begin(), l.end()};
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What a failed call must leave unchanged.
struct Observed {
  std::map<SeqId, std::pair<std::int64_t, std::int64_t>> lengths;
  int live = 0;
  std::int64_t free_pages = 0, output_rows = 0;
  std::vector<float> row0;

  static Observed of(const Context& ctx, std::initializer_list<SeqId> seqs) {
    Observed o;
    for (const SeqId s : seqs) o.lengths[s] = {ctx.sequence_length(s), ctx.mtp_length(s)};
    o.live = ctx.live_sequences();
    o.free_pages = ctx.kv_free_pages();
    o.output_rows = ctx.output_rows();
    if (o.output_rows > 0) {
      const auto h = ctx.hidden(0);
      o.row0.assign(h.begin(), h.end());
    }
    return o;
  }
  void check_same(const Context& ctx) const {
    for (const auto& [s, len] : lengths) {
      CHECK(ctx.sequence_length(s) == len.first);
      CHECK(ctx.mtp_length(s) == len.second);
    }
    CHECK(ctx.live_sequences() == live);
    CHECK(ctx.kv_free_pages() == free_pages);
    CHECK(ctx.output_rows() == output_rows);
    if (output_rows > 0) CHECK(same_bits(ctx.hidden(0), row0));
  }
};

// A runtime case: the call must fail as stated and change nothing.
template <typename F>
void expect_refused(const char* id, Status status, const std::string& needle, Context& ctx,
                    std::initializer_list<SeqId> seqs, F&& f) {
  const Observed before = Observed::of(ctx, seqs);
  expect_error(id, status, needle, std::forward<F>(f));
  before.check_same(ctx);
}

// The packed-image layout this CPU's kernel reads (AMX machines: amx_tiles), and the other one.
std::string cpu_layout_this() {
  return default_packed_image_path(".").find("panels") != std::string::npos ? "panels" : "amx_tiles";
}
std::string cpu_layout_other() { return cpu_layout_this() == "panels" ? "amx_tiles" : "panels"; }

const char* const tied = "qwen35_tied";
const char* const mtp_single = "qwen35_cond_mtp_single";
const char* const sharded = "qwen35_cond_mtp";

}  // namespace

// =============================================================================================
TEST_CASE("bad checkpoints are refused and leave nothing open, mapped or allocated", "[bad][load]") {
  const std::size_t fds_before = open_fds();

  SECTION("config.json") {
    {
      Copy m(tied);
      fs::remove(m.file("config.json"));
      expect_error("load.config_missing", Status::io_error, "config.json", [&] { m.load(); });
    }
    {
      Copy m(tied);
      const std::string cfg = read_text(m.file("config.json"));
      write_text(m.file("config.json"), cfg.substr(0, cfg.size() / 2));
      expect_error("load.config_truncated", Status::invalid_file, "not valid JSON", [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_config([](ojson& c) { c["vocab_size"] = 512; });  // the embedding is [256, 64]
      expect_error("load.config_shape_embedding", Status::tensor_mismatch,
                   "'model.embed_tokens.weight' has shape [256, 64] but the config implies [512, 64]", [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_config([](ojson& c) { c["tie_word_embeddings"] = false; });  // an untied model needs lm_head
      expect_error("load.missing_lm_head", Status::missing_tensor, "'lm_head.weight' is missing", [&] { m.load(); });
    }
  }

  SECTION("the safetensors container") {
    {
      Copy m(tied);
      write_bytes(m.file("model.safetensors"), {});
      expect_error("load.weights_empty", Status::invalid_file, "0 bytes, shorter than the 8-byte header length",
                   [&] { m.load(); });
    }
    {
      Copy m(tied);
      auto b = read_bytes(m.file("model.safetensors"));
      put_le64(b, 0, b.size());  // the header alone would be longer than the file
      write_bytes(m.file("model.safetensors"), b);
      expect_error("load.header_length_past_end", Status::invalid_file, "runs past the end", [&] { m.load(); });
    }
    {
      Copy m(tied);
      auto b = read_bytes(m.file("model.safetensors"));
      put_le64(b, 0, std::uint64_t{1} << 62);  // would overflow 8 + n on 64 bits if added carelessly
      write_bytes(m.file("model.safetensors"), b);
      expect_error("load.header_length_absurd", Status::invalid_file, "exceeds the 100000000 byte limit", [&] { m.load(); });
    }
    {
      Copy m(tied);
      auto b = read_bytes(m.file("model.safetensors"));
      b.resize(8 + 1000);  // cut inside the JSON header
      write_bytes(m.file("model.safetensors"), b);
      expect_error("load.truncated_in_header", Status::invalid_file, "runs past the end", [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_weights("model.safetensors", [](Safetensors& s) {
        auto& e = s.header["model.norm.weight"];
        const std::uint64_t size = e["data_offsets"][1].get<std::uint64_t>() - e["data_offsets"][0].get<std::uint64_t>();
        e["data_offsets"] = {s.data.size() + 64, s.data.size() + 64 + size};
      });
      expect_error("load.offset_out_of_range", Status::invalid_file, "'model.norm.weight' ends at byte", [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_weights("model.safetensors", [](Safetensors& s) {
        // Move a vector into the middle of the embedding.
        auto& e = s.header["model.norm.weight"];
        const std::uint64_t size = e["data_offsets"][1].get<std::uint64_t>() - e["data_offsets"][0].get<std::uint64_t>();
        e["data_offsets"] = {1024, 1024 + size};
      });
      expect_error("load.offsets_overlap", Status::invalid_file, "overlap in the data section", [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_weights("model.safetensors", [](Safetensors& s) { s.header["model.norm.weight"]["dtype"] = "F8_E4M3"; });
      expect_error("load.unknown_dtype", Status::invalid_file, "unknown dtype 'F8_E4M3'", [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_weights("model.safetensors", [](Safetensors& s) { s.header["model.norm.weight"]["dtype"] = "F32"; });
      expect_error("load.dtype_size_mismatch", Status::invalid_file, "spans 128 bytes but F32 of shape [64] needs 256",
                   [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_weights("model.safetensors", [](Safetensors& s) { s.header["model.embed_tokens.weight"]["shape"] = {256 * 64}; });
      expect_error("load.rank_mismatch", Status::tensor_mismatch, "has shape [16384] but the config implies [256, 64]",
                   [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_weights("model.safetensors", [](Safetensors& s) { s.header.erase("model.layers.3.self_attn.o_proj.weight"); });
      expect_error("load.missing_tensor_entry", Status::missing_tensor,
                   "'model.layers.3.self_attn.o_proj.weight' is missing from the checkpoint", [&] { m.load(); });
    }
    {
      Copy m(tied);
      m.edit_weights("model.safetensors", [](Safetensors& s) { s.header.erase("model.embed_tokens.weight"); });
      expect_error("load.missing_embedding", Status::missing_tensor, "no embedding found", [&] { m.load(); });
    }
    {
      Copy m(tied);
      auto s = Safetensors::read(m.file("model.safetensors"));
      std::string text = s.header.dump();
      const std::string entry = "\"model.norm.weight\":" + s.header["model.norm.weight"].dump();
      text.insert(text.size() - 1, "," + entry);  // the same name again, with the same offsets
      s.write(m.file("model.safetensors"), text);
      expect_error("load.duplicate_name", Status::invalid_file, "'model.norm.weight' appears twice", [&] { m.load(); });
    }
    {
      Copy m(tied);
      // Spliced in as text: dump() itself would recurse 200 000 levels deep.
      auto s = Safetensors::read(m.file("model.safetensors"));
      s.header["model.norm.weight"]["shape"] = "@nested@";
      s.write(m.file("model.safetensors"), with_nested(s.header.dump()));
      expect_error("load.deeply_nested_shape", Status::invalid_file, "must be a non-negative integer, got an array",
                   [&] { m.load(); });
    }
  }

  SECTION("sharded checkpoints and their index") {
    const std::string s1 = "model-00001-of-00003.safetensors", s2 = "model-00002-of-00003.safetensors";
    {
      Copy m(sharded);
      m.edit_weights(s2, [](Safetensors& s) {
        // Rename shard 2's first tensor to a name shard 1 holds.
        ojson renamed;
        bool first = true;
        for (auto it = s.header.begin(); it != s.header.end(); ++it) {
          if (first && it.key() != "__metadata__") {
            renamed["model.language_model.embed_tokens.weight"] = it.value();
            first = false;
          } else {
            renamed[it.key()] = it.value();
          }
        }
        s.header = renamed;
      });
      expect_error("shard.duplicate_across_shards", Status::invalid_file,
                   "'model.language_model.embed_tokens.weight' appears in both", [&] { m.load(); });
    }
    {
      Copy m(sharded);
      auto idx = ojson::parse(read_text(m.file("model.safetensors.index.json")));
      idx["weight_map"]["lm_head.weight"] = "../model-00003-of-00003.safetensors";
      write_text(m.file("model.safetensors.index.json"), idx.dump());
      expect_error("shard.path_traversal", Status::invalid_file, "is not a file in the directory", [&] { m.load(); });
    }
    {
      Copy m(sharded);
      auto idx = ojson::parse(read_text(m.file("model.safetensors.index.json")));
      idx["weight_map"]["lm_head.weight"] = s1;  // it lives in shard 3
      write_text(m.file("model.safetensors.index.json"), idx.dump());
      expect_error("shard.index_wrong_shard", Status::invalid_file, "lists 'lm_head.weight' in '" + s1 + "', which does not hold it",
                   [&] { m.load(); });
    }
    {
      Copy m(sharded);
      write_text(m.file("model.safetensors.index.json"), "{\"weight_map\": {");
      expect_error("shard.index_not_json", Status::invalid_file, "not valid JSON", [&] { m.load(); });
    }
    {
      Copy m(sharded);
      write_text(m.file("model.safetensors.index.json"), R"({"metadata": {}, "weight_map": ["x"]})");
      expect_error("shard.index_no_weight_map", Status::invalid_file, "missing the 'weight_map' object", [&] { m.load(); });
    }
  }

  // Nothing of the failed loads stays open or mapped (ASan's leak check covers memory).
  CHECK(open_fds() == fds_before);
  CHECK(temp_mappings() == 0);
}

TEST_CASE("safetensors headers: overlaps, nesting and offsets the loader must not miss", "[bad][safetensors]") {
  const auto parse = [](const std::vector<std::byte>& f) { io::parse_safetensors_header(f, "t.safetensors"); };
  // An empty tensor between two overlapping ones once hid the overlap (only neighbours were compared).
  expect_error("st.overlap_behind_empty_tensor", Status::invalid_file, "tensors 'a' and 'c' overlap", [&] {
    parse(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[16],"data_offsets":[0,64]},)"
                            R"("b":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                            R"("c":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
                            64));
  });
  expect_error("st.data_offsets_not_integers", Status::invalid_file, "data_offsets[0] of 'a' must be a non-negative integer, got \"0\"",
               [&] { parse(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":["0",4]}})", 4)); });
  expect_error("st.entry_not_object", Status::invalid_file, "entry 'a' is not an object",
               [&] { parse(safetensors_bytes(R"({"a":[1,2,3]})", 0)); });
  // A zero-size tensor may sit anywhere; it overlaps nothing.
  CHECK_NOTHROW(parse(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                        R"("z":{"dtype":"BF16","shape":[0,3],"data_offsets":[8,8]}})",
                                        16)));
}

// =============================================================================================
TEST_CASE("bad config.json fields are refused by name", "[bad][config]") {
  const std::string base_text = read_text(fs::path(test::fixture_model(sharded)) / "config.json");
  const auto parse_edited = [&](const std::function<void(ojson&)>& edit) {
    auto j = ojson::parse(base_text);
    edit(j);
    parse_model_config(with_nested_if(j.dump()), "config.json");
  };
  const auto text = [](ojson& j) -> ojson& { return j["text_config"]; };

  expect_error("cfg.field_missing", Status::invalid_file, "'text_config.vocab_size' is missing",
               [&] { parse_edited([&](ojson& j) { text(j).erase("vocab_size"); }); });
  expect_error("cfg.float_for_integer", Status::invalid_file, "'text_config.num_hidden_layers' must be an integer, got 4.0",
               [&] { parse_edited([&](ojson& j) { text(j)["num_hidden_layers"] = 4.0; }); });
  expect_error("cfg.text_config_not_object", Status::invalid_file, "'text_config' must be an object",
               [&] { parse_edited([&](ojson& j) { j["text_config"] = ojson::array(); }); });
  expect_error("cfg.layer_types_not_list", Status::invalid_file, "'text_config.layer_types' must be a list",
               [&] { parse_edited([&](ojson& j) { text(j)["layer_types"] = "full_attention"; }); });
  expect_error("cfg.rope_parameters_not_object", Status::invalid_file, "'text_config.rope_parameters' must be an object",
               [&] { parse_edited([&](ojson& j) { text(j)["rope_parameters"] = 10000; }); });
  expect_error("cfg.eps_not_number", Status::invalid_file, "'text_config.rms_norm_eps' must be a number, got \"1e-6\"",
               [&] { parse_edited([&](ojson& j) { text(j)["rms_norm_eps"] = "1e-6"; }); });
  expect_error("cfg.eps_zero", Status::invalid_file, "'text_config.rms_norm_eps' must be a positive number",
               [&] { parse_edited([&](ojson& j) { text(j)["rms_norm_eps"] = 0; }); });
  expect_error("cfg.heads_not_divisible", Status::invalid_file, "must divide num_attention_heads",
               [&] { parse_edited([&](ojson& j) { text(j)["num_key_value_heads"] = 3; }); });
  expect_error("cfg.conv_kernel_unsupported", Status::unsupported_model, "'text_config.linear_conv_kernel_dim' is 32; 1..16 supported",
               [&] { parse_edited([&](ojson& j) { text(j)["linear_conv_kernel_dim"] = 32; }); });
  expect_error("cfg.mtp_layers_unsupported", Status::unsupported_model, "'text_config.mtp_num_hidden_layers' is 2; 0 or 1 supported",
               [&] { parse_edited([&](ojson& j) { text(j)["mtp_num_hidden_layers"] = 2; }); });
  expect_error("cfg.attention_bias", Status::unsupported_model, "'text_config.attention_bias' is true",
               [&] { parse_edited([&](ojson& j) { text(j)["attention_bias"] = true; }); });
  expect_error("cfg.architectures_empty", Status::invalid_file, "'architectures' must be a non-empty list of names",
               [&] { parse_edited([&](ojson& j) { j["architectures"] = ojson::array(); }); });
  // Regressions: values that used to be truncated or to overflow, found by fuzzing and review.
  expect_error("cfg.int_truncation", Status::invalid_file,
               "'text_config.linear_conv_kernel_dim' is 4294967300, outside the range of a 32-bit integer",
               [&] { parse_edited([&](ojson& j) { text(j)["linear_conv_kernel_dim"] = 4294967300LL; }); });
  expect_error("cfg.eos_truncation", Status::invalid_file, "4294967297 is outside the vocabulary of 256",
               [&] { parse_edited([&](ojson& j) { text(j)["eos_token_id"] = 4294967297LL; }); });
  expect_error("cfg.partial_rotary_absurd", Status::invalid_file, "'text_config.rope_parameters.partial_rotary_factor' is",
               [&] { parse_edited([&](ojson& j) { text(j)["rope_parameters"]["partial_rotary_factor"] = 1e300; }); });
  expect_error("cfg.derived_size_overflow", Status::invalid_file, "above the supported 2^30", [&] {
    parse_edited([&](ojson& j) {
      text(j)["linear_num_value_heads"] = 1 << 30;
      text(j)["linear_value_head_dim"] = 1 << 30;
    });
  });
  expect_error("cfg.deeply_nested_value", Status::invalid_file, "'text_config.hidden_size' must be an integer, got an array",
               [&] { parse_edited([&](ojson& j) { text(j)["hidden_size"] = "@nested@"; }); });
}

// =============================================================================================
TEST_CASE("bad requests are refused whole, change nothing, and the context continues exactly", "[bad][step]") {
  auto model = Model::load(test::fixture_model(mtp_single));
  const int V = model->config().vocab_size, H = model->config().hidden_size;
  Context ctx(model, small_params(2, 64));
  const SeqId a = ctx.create_sequence();
  const auto pa = prompt(1, 10);
  last_logits(ctx, a, pa);
  Batch b;

  SECTION("tokens, lengths, handles, batches") {
    const SeqId c = ctx.create_sequence();
    expect_refused("step.token_negative", Status::invalid_token, "token id -1 at index 0", ctx, {a, c}, [&] {
      b.clear();
      b.add(c, Token{-1});
      ctx.step(b);
    });
    expect_refused("step.token_past_vocab", Status::invalid_token, "token id 256 at index 0 of sequence", ctx, {a, c}, [&] {
      b.clear();
      b.add(c, Token{256});
      ctx.step(b);
    });
    expect_refused("step.bad_token_in_mixed_batch", Status::invalid_token, "at index 3 of sequence", ctx, {a, c}, [&] {
      b.clear();
      b.add(a, Token{5});
      b.add(c, std::vector<Token>{1, 2, 3, V + 7, 4});
      ctx.step(b);
    });
    expect_refused("step.prompt_past_context", Status::context_overflow, "cannot take 65 more tokens: max_context is 64", ctx, {a, c},
                   [&] {
                     b.clear();
                     b.add(c, prompt(2, 65));
                     ctx.step(b);
                   });
    expect_refused("step.sequence_twice", Status::invalid_argument, "appears twice in the batch", ctx, {a, c}, [&] {
      b.clear();
      b.add(a, Token{5});
      b.add(a, Token{6});
      ctx.step(b);
    });
    expect_refused("step.empty_entry", Status::invalid_argument, "has no tokens", ctx, {a, c}, [&] {
      b.clear();
      b.add(c, std::span<const Token>{});
      ctx.step(b);
    });
    expect_refused("seq.pool_exhausted", Status::out_of_capacity, "all 2 sequence slots are in use", ctx, {a, c},
                   [&] { ctx.create_sequence(); });
    ctx.free_sequence(c);
    expect_refused("step.freed_sequence", Status::invalid_sequence, "is not a live sequence of this context", ctx, {a}, [&] {
      b.clear();
      b.add(c, Token{1});
      ctx.step(b);
    });
    const SeqId c2 = ctx.create_sequence();  // the same slot, a new generation
    CHECK(c2 != c);
    expect_refused("step.stale_handle_reused_slot", Status::invalid_sequence, "is not a live sequence", ctx, {a, c2}, [&] {
      b.clear();
      b.add(a, Token{5});
      b.add(c, Token{1});
      ctx.step(b);
    });
    expect_refused("seq.never_existed", Status::invalid_sequence, "sequence id 0x7", ctx, {a, c2},
                   [&] { ctx.sequence_length(SeqId{7}); });
    expect_refused("seq.free_twice", Status::invalid_sequence, "free_sequence: sequence id", ctx, {a, c2},
                   [&] { ctx.free_sequence(c); });
    // Decode up to the limit, then one more.
    last_logits(ctx, c2, prompt(3, 64));
    expect_refused("step.decode_past_context", Status::context_overflow, "at position 64 cannot take 1 more tokens", ctx, {a, c2},
                   [&] {
                     b.clear();
                     b.add(c2, Token{1});
                     ctx.step(b);
                   });
  }

  SECTION("outputs, MTP, rollback, snapshots") {
    expect_refused("out.row_out_of_range", Status::invalid_argument, "logits: row 1 is outside the last step's 1 rows", ctx, {a},
                   [&] { ctx.logits(1); });
    expect_refused("out.hidden_row_negative", Status::invalid_argument, "hidden: row -1 is outside", ctx, {a},
                   [&] { ctx.hidden(-1); });
    expect_refused("mtp.hidden_size_mismatch", Status::invalid_argument, "step_mtp: 47 hidden values given for 1 tokens of width 48",
                   ctx, {a}, [&] {
                     std::vector<float> hidden(static_cast<std::size_t>(H - 1), 0.0f);
                     b.clear();
                     b.add(a, Token{1});
                     ctx.step_mtp(b, hidden);
                   });
    expect_refused("mtp.past_context", Status::context_overflow, "step_mtp: sequence", ctx, {a}, [&] {
      std::vector<float> hidden(static_cast<std::size_t>(65 * H), 0.0f);
      b.clear();
      b.add(a, prompt(4, 65), LogitsFor::none);
      ctx.step_mtp(b, hidden);
    });
    expect_refused("rollback.not_enabled", Status::invalid_argument, "has no step to roll back", ctx, {a},
                   [&] { ctx.rollback(a, 0); });
    expect_refused("mtp.truncate_beyond", Status::invalid_argument, "truncate_mtp: length 3 is outside [0, 0]", ctx, {a},
                   [&] { ctx.truncate_mtp(a, 3); });
    const SnapshotId snap = ctx.snapshot(a);
    ctx.free_snapshot(snap);
    expect_refused("snapshot.stale", Status::invalid_argument, "is not a live snapshot of this context", ctx, {a},
                   [&] { ctx.restore(a, snap); });
    expect_refused("snapshot.stale_create_from", Status::invalid_argument, "create_sequence_from: snapshot id", ctx, {a},
                   [&] { ctx.create_sequence_from(snap); });
  }

  SECTION("the KV pool, when a batch needs more than is free") {
    ContextParams p = small_params(2, 64);
    p.kv_pages = 4;  // 64 positions for both sequences together
    Context small(model, p);
    const SeqId x = small.create_sequence(), y = small.create_sequence();
    last_logits(small, x, prompt(5, 40));  // 3 pages, 1 free
    expect_refused("step.kv_pool_exhausted_by_batch", Status::out_of_capacity, "the batch needs 3 more KV pages but only 1 are free",
                   small, {x, y}, [&] {
                     b.clear();
                     b.add(x, prompt(6, 10));  // 40 → 50: a 4th page
                     b.add(y, prompt(7, 20));  // 2 pages
                     small.step(b);
                   });
    const auto got = last_logits(small, x, prompt(6, 10));
    Context clean(model, small_params(1, 64));
    const SeqId z = clean.create_sequence();
    last_logits(clean, z, prompt(5, 40));
    CHECK(same_bits(got, last_logits(clean, z, prompt(6, 10))));
  }

  // After every refusal above, `a` continues exactly like a sequence that never saw one.
  std::vector<float> got;
  for (const Token t : {Token{5}, Token{6}, Token{7}}) {
    const auto l = last_logits(ctx, a, std::span<const Token>(&t, 1));
    got.insert(got.end(), l.begin(), l.end());
  }
  Context clean(model, small_params(1, 64));
  const SeqId s = clean.create_sequence();
  last_logits(clean, s, pa);
  std::vector<float> want;
  for (const Token t : {Token{5}, Token{6}, Token{7}}) {
    const auto l = last_logits(clean, s, std::span<const Token>(&t, 1));
    want.insert(want.end(), l.begin(), l.end());
  }
  CHECK(same_bits(got, want));
}

TEST_CASE("context parameters out of range are refused before anything is allocated", "[bad][params]") {
  auto model = Model::load(test::fixture_model(tied));
  const auto make = [&](const std::function<void(ContextParams&)>& edit) {
    ContextParams p = small_params();
    edit(p);
    Context ctx(model, p);
  };
  expect_error("params.max_sequences_zero", Status::invalid_argument, "max_sequences must be in [1, 2^20], got 0",
               [&] { make([](ContextParams& p) { p.max_sequences = 0; }); });
  expect_error("params.max_context_negative", Status::invalid_argument, "max_context must be positive, got -5",
               [&] { make([](ContextParams& p) { p.max_context = -5; }); });
  expect_error("params.kv_page_size", Status::invalid_argument, "kv_page_size must be in [1, 4096], got 8192",
               [&] { make([](ContextParams& p) { p.kv_page_size = 8192; }); });
  expect_error("params.rollback_past_batch", Status::invalid_argument, "max_rollback_tokens must be in [0, max_batch_tokens = 64]",
               [&] { make([](ContextParams& p) { p.max_rollback_tokens = 65; }); });
  expect_error("params.state_dtype", Status::invalid_argument, "state_dtype must be F32 or BF16, got F16",
               [&] { make([](ContextParams& p) { p.state_dtype = DType::f16; }); });
  expect_error("params.chunk_min_zero", Status::invalid_argument, "gdn_chunk_min_tokens must be positive, got 0",
               [&] { make([](ContextParams& p) { p.gdn_chunk_min_tokens = 0; }); });
  expect_error("params.backend_unknown", Status::invalid_argument, "backend must be cpu or cuda, got 7",
               [&] { make([](ContextParams& p) { p.backend = static_cast<Backend>(7); }); });
  // This suite runs where there is no GPU (or no nvcc): the reason is in the message.
  expect_error("params.cuda_without_device", Status::backend_unavailable, "the CUDA backend is not available",
               [&] { make([](ContextParams& p) { p.backend = Backend::cuda; }); });
  // Regression: 2^40 pages used to be multiplied out and allocated (page ids are int32).
  expect_error("params.kv_pool_absurd", Status::out_of_capacity, "page ids are 32-bit",
               [&] { make([](ContextParams& p) { p.kv_pages = std::int64_t{1} << 40; }); });
  expect_error("params.max_context_absurd", Status::out_of_capacity, "page ids are 32-bit", [&] {
    make([](ContextParams& p) {
      p.max_context = INT_MAX;
      p.max_sequences = 2;
      p.kv_page_size = 1;
    });
  });
  // A pool that addresses fine but needs petabytes: refused before the zeroing that would get the
  // process OOM-killed.
  expect_error("params.context_beyond_memory", Status::out_of_capacity, "TB KV cache", [&] {
    make([](ContextParams& p) {
      p.kv_pages = (std::int64_t{1} << 31) - 1;
      p.kv_page_size = 4096;
    });
  });
}

// =============================================================================================
// Sizes and memory at load: a size the kernels cannot run is refused naming its field (every other
// accepted size runs: tests/test_model_sizes.cpp), packing that cannot fit is a Status, and a
// packed weight image that is not exactly what it claims is refused, never misread.
TEST_CASE("sizes, memory and packed images at load", "[bad][sizes][image]") {
  const std::string base_text = read_text(fs::path(test::fixture_model(sharded)) / "config.json");
  const auto parse_edited = [&](const std::function<void(ojson&)>& edit) {
    auto j = ojson::parse(base_text);
    edit(j);
    parse_model_config(j.dump(), "config.json");
  };
  expect_error("cfg.head_dim_zero", Status::invalid_file, "'text_config.head_dim' is missing, and hidden_size / num_attention_heads", [&] {
    parse_edited([](ojson& j) {
      j["text_config"].erase("head_dim");
      j["text_config"]["num_attention_heads"] = 64;  // hidden 48
      j["text_config"]["num_key_value_heads"] = 1;
    });
  });

  if (default_packed_image_path(test::fixture_model(tied)).empty()) {
    WARN("SKIPPED the packed-image cases: this CPU's projection kernel reads weights in place");
    return;
  }
  {
    ::setenv("GDN_MEMORY_AVAILABLE", "1000", 1);
    ModelParams mp;
    mp.weights = WeightPlacement::packed;
    expect_error("load.pack_does_not_fit", Status::out_of_capacity, "cannot pack the weights",
                 [&] { Model::load(test::fixture_model(tied), mp); });
    ::unsetenv("GDN_MEMORY_AVAILABLE");
  }

  Copy m(tied);
  const fs::path image = m.file("gdn-packed.image");
  PackImageOptions po;
  po.out = image.string();
  write_packed_image(m.path.string(), po);
  const auto good = read_bytes(image);
  ModelParams strict;  // the image required, so its refusal is the error
  strict.weights = WeightPlacement::image;
  strict.packed_image = image.string();
  const auto load_image = [&] { Model::load(m.path.string(), strict); };
  REQUIRE_NOTHROW(load_image());
  const auto with = [&](const std::function<void(std::vector<std::byte>&)>& edit, bool fix_crc) {
    auto b = good;
    edit(b);
    if (fix_crc) {  // a deliberate edit, past the checksum
      const std::uint32_t n = static_cast<std::uint32_t>(b[12]) | static_cast<std::uint32_t>(b[13]) << 8 |
                              static_cast<std::uint32_t>(b[14]) << 16 | static_cast<std::uint32_t>(b[15]) << 24;
      const auto crc = static_cast<std::uint32_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(b.data()), 16 + n));
      for (int i = 0; i < 4; ++i) b[16 + n + static_cast<std::uint32_t>(i)] = static_cast<std::byte>((crc >> (8 * i)) & 0xff);
    }
    write_bytes(image, b);
  };
  const auto json_edit = [&](const std::string& from, const std::string& to) {
    return [from, to](std::vector<std::byte>& b) {
      std::string text(reinterpret_cast<const char*>(b.data()), std::min<std::size_t>(b.size(), 1 << 20));
      const auto at = text.find(from);
      REQUIRE(at != std::string::npos);
      REQUIRE(from.size() == to.size());  // keeps the header's length
      std::memcpy(b.data() + at, to.data(), to.size());
    };
  };
  with([](auto& b) { b.resize(b.size() - 4096); }, false);
  expect_error("image.truncated", Status::invalid_file, "bytes but the file has", load_image);
  with([](auto& b) { b[40] ^= std::byte{1}; }, false);
  expect_error("image.corrupt_header", Status::invalid_file, "header checksum mismatch (corrupted)", load_image);
  with([](auto& b) { b[0] = std::byte{'X'}; }, false);
  expect_error("image.not_an_image", Status::invalid_file, "wrong magic (not a libgdn packed weight image)", load_image);
  with([](auto& b) { b[8] = std::byte{2}; }, false);
  expect_error("image.future_version", Status::invalid_file, "format version 2 is not the supported 1", load_image);
  with(json_edit("\"weight_encoding\":\"bf16\"", "\"weight_encoding\":\"q3_k\""), true);
  expect_error("image.unknown_encoding", Status::invalid_file, "weight encoding 'q3_k' is not one this libgdn reads", load_image);
  const std::string layout = cpu_layout_this(), unknown = layout.substr(0, layout.size() - 1) + "z";
  REQUIRE(packed_layout_version(layout) < 9);  // the one-digit edit below keeps the header's length
  with(json_edit(fmt::format("\"layout_version\":{}", packed_layout_version(layout)), "\"layout_version\":9"), true);
  expect_error("image.layout_version", Status::invalid_file,
               fmt::format("layout {} version 9 is not the version {}", layout, packed_layout_version(layout)), load_image);
  with(json_edit(fmt::format("\"layout\":\"{}\"", layout), fmt::format("\"layout\":\"{}\"", unknown)), true);
  expect_error("image.unknown_layout", Status::invalid_file, fmt::format("layout '{}' is not one this libgdn reads", unknown), load_image);
  with([](auto& b) {  // the first tensor's offset, one byte on
    const std::string text(reinterpret_cast<const char*>(b.data()), 1 << 12);
    auto at = text.find("\"offset\":");
    REQUIRE(at != std::string::npos);
    at = text.find_first_not_of("0123456789", at + 9) - 1;
    b[at] = static_cast<std::byte>(static_cast<char>(b[at]) + 1);
  }, true);
  expect_error("image.misaligned_tensor", Status::invalid_file, "is misaligned, out of order or outside the", load_image);
  // Another checkpoint's image (same shapes, other values): stale or foreign.
  write_bytes(image, good);
  m.edit_weights("model.safetensors", [](Safetensors& st) {
    const auto& e = st.header["model.layers.0.mlp.up_proj.weight"];
    st.data[e["data_offsets"][0].get<std::size_t>() + 2] ^= std::byte{0x40};
  });
  expect_error("image.stale", Status::invalid_file, "the image is stale or foreign", load_image);
  // An image in the layout of another kernel (an AMX machine's, read on an AVX-512 one, or back).
  po.layout = cpu_layout_other();
  write_packed_image(m.path.string(), po);
  expect_error("image.other_layout", Status::invalid_file, "layout, this CPU's kernel", load_image);
  fs::remove(image);
  expect_error("image.missing", Status::io_error, "no packed image at", load_image);

  // The lm_head's format (ModelParams::lm_head_quant): a bad name, one without a quant, an image of
  // another lm_head policy, a tensor encoding a quantised image cannot hold.
  expect_error("params.lm_head_quant_unknown", Status::invalid_argument, "lm_head_quant 'q3' is not one of auto, q8_0",
               [] { (void)parse_lm_head_quant("q3"); });
  {
    ModelParams mp;
    mp.lm_head_quant = LmHeadQuant::q4_0;
    expect_error("params.lm_head_quant_without_quant", Status::invalid_argument, "lm_head_quant q4_0 needs a quant",
                 [&] { Model::load(m.path.string(), mp); });
  }
  PackImageOptions all_q4;
  all_q4.out = image.string();
  all_q4.quant = WeightQuant::q4_0;
  all_q4.lm_head_quant = LmHeadQuant::q4_0;
  write_packed_image(m.path.string(), all_q4);
  ModelParams q4 = strict;
  q4.quant = WeightQuant::q4_0;  // the automatic lm_head: q8_0
  expect_error("image.lm_head_other_format", Status::invalid_file, "is q4_0, and this load reads it as q8_0 (lm_head_quant q8_0)",
               [&] { Model::load(m.path.string(), q4); });
  const auto q4_image = read_bytes(image);
  auto edited = q4_image;
  {
    std::string text(reinterpret_cast<const char*>(edited.data()), std::min<std::size_t>(edited.size(), 1 << 20));
    const auto at = text.find("\"encoding\":\"q4_0\"");
    REQUIRE(at != std::string::npos);
    constexpr std::string_view other = "\"encoding\":\"q3_k\"";  // the same length: offsets stay valid
    std::memcpy(edited.data() + at, other.data(), other.size());
    const std::uint32_t n = static_cast<std::uint32_t>(edited[12]) | static_cast<std::uint32_t>(edited[13]) << 8 |
                            static_cast<std::uint32_t>(edited[14]) << 16 | static_cast<std::uint32_t>(edited[15]) << 24;
    const auto crc =
        static_cast<std::uint32_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(edited.data()), 16 + n));
    for (int i = 0; i < 4; ++i) edited[16 + n + static_cast<std::uint32_t>(i)] = static_cast<std::byte>((crc >> (8 * i)) & 0xff);
  }
  write_bytes(image, edited);
  q4.lm_head_quant = LmHeadQuant::q4_0;
  expect_error("image.tensor_encoding", Status::invalid_file, "has encoding 'q3_k', which a q4_0 image cannot hold",
               [&] { Model::load(m.path.string(), q4); });
  write_bytes(image, q4_image);
  REQUIRE_NOTHROW(Model::load(m.path.string(), q4));
  fs::remove(image);
}

// =============================================================================================
TEST_CASE("bad sequence-state files are refused and load nothing", "[bad][state]") {
  auto model = Model::load(test::fixture_model(mtp_single));
  Context ctx(model, small_params(2, 64));
  const SeqId s = ctx.create_sequence();
  last_logits(ctx, s, prompt(8, 40));
  TempDir dir;
  const fs::path good = dir.path / "good.gdnstate";
  ctx.save_sequence(s, good.string());
  ctx.free_sequence(s);
  const auto bytes = read_bytes(good);

  // Rewrites the file with the checksum made valid again, as a deliberate attacker would.
  const auto with_crc = [](std::vector<std::byte> b) {
    const std::size_t n = b.size() - 4;
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(b.data()), static_cast<uInt>(n));
    for (int i = 0; i < 4; ++i) b[n + static_cast<std::size_t>(i)] = static_cast<std::byte>((crc >> (8 * i)) & 0xff);
    return b;
  };
  const auto header_of = [&](const std::vector<std::byte>& b) {
    std::uint32_t n = 0;
    std::memcpy(&n, b.data() + 12, 4);
    return std::string(reinterpret_cast<const char*>(b.data()) + 16, n);
  };
  const auto with_header = [&](std::vector<std::byte> b, const std::string& from, const std::string& to) {
    std::string h = header_of(b);
    const auto at = h.find(from);
    REQUIRE(at != std::string::npos);
    REQUIRE(to.size() <= from.size());
    h.replace(at, from.size(), to + std::string(from.size() - to.size(), ' '));
    std::memcpy(b.data() + 16, h.data(), h.size());
    return with_crc(b);
  };
  const auto load_bytes = [&](const std::vector<std::byte>& b) {
    const fs::path p = dir.path / "bad.gdnstate";
    write_bytes(p, b);
    ctx.load_sequence(p.string());
  };

  expect_refused("state.missing_file", Status::io_error, "cannot open", ctx, {},
                 [&] { ctx.load_sequence((dir.path / "nope.gdnstate").string()); });
  expect_refused("state.too_short", Status::invalid_file, "10 bytes is too short", ctx, {},
                 [&] { load_bytes(std::vector<std::byte>(bytes.begin(), bytes.begin() + 10)); });
  expect_refused("state.truncated", Status::invalid_file, "checksum mismatch (corrupted or truncated)", ctx, {},
                 [&] { load_bytes(std::vector<std::byte>(bytes.begin(), bytes.end() - 100)); });
  expect_refused("state.bad_magic", Status::invalid_file, "wrong magic", ctx, {}, [&] {
    auto b = bytes;
    b[0] = std::byte{'X'};
    load_bytes(b);
  });
  expect_refused("state.future_version", Status::invalid_file, "format version 2 is not the supported 1", ctx, {}, [&] {
    auto b = bytes;
    b[8] = std::byte{2};
    load_bytes(with_crc(b));
  });
  expect_refused("state.header_length_past_end", Status::invalid_file, "header length 4294967295 is out of range", ctx, {}, [&] {
    auto b = bytes;
    REQUIRE(b.size() >= 20);  // (also tells GCC's -Wstringop-overflow the bytes are there)
    for (int i = 12; i < 16; ++i) b[static_cast<std::size_t>(i)] = std::byte{0xff};
    load_bytes(with_crc(b));
  });
  expect_refused("state.header_not_json", Status::invalid_file, "header is not valid JSON", ctx, {},
                 [&] { load_bytes(with_header(bytes, "{\"", "[[")); });
  expect_refused("state.field_negative", Status::invalid_file, "header field 'length' must be a non-negative integer", ctx, {},
                 [&] { load_bytes(with_header(bytes, "\"length\":40", "\"length\":-4")); });
  expect_refused("state.section_outside_file", Status::invalid_file, "section 'conv'", ctx, {}, [&] {
    const std::string h = header_of(bytes);
    const auto at = h.find("\"conv\":[");
    REQUIRE(at != std::string::npos);
    const auto comma = h.find(',', at);
    load_bytes(with_header(bytes, h.substr(at, comma - at), "\"conv\":[9"));  // offset 9: inside the fixed header
  });
  {
    // Self-consistent sizes and checksum, but more KV positions than the length accounts for.
    StateFileHeader hdr = parse_state_file(bytes, "good");
    std::vector<std::byte> conv(hdr.conv.bytes), rec(hdr.recurrent.bytes);
    hdr.kv_positions = hdr.length + 16;
    std::vector<std::byte> kv(static_cast<std::size_t>(hdr.kv_layers * 2 * hdr.kv_positions * hdr.kv_dim * 4));
    const std::string f = encode_state_file(hdr, conv, rec, kv);
    expect_refused("state.kv_positions_mismatch", Status::invalid_file, "kv_positions 56 is not the sequence's length", ctx, {},
                   [&] { load_bytes(std::vector<std::byte>(reinterpret_cast<const std::byte*>(f.data()),
                                                           reinterpret_cast<const std::byte*>(f.data()) + f.size())); });
  }
  {
    auto tied_model = Model::load(test::fixture_model(tied));
    Context t(tied_model, small_params(1, 64));
    const SeqId ts = t.create_sequence();
    last_logits(t, ts, prompt(9, 5));
    const fs::path p = dir.path / "tied.gdnstate";
    t.save_sequence(ts, p.string());
    expect_refused("state.different_model", Status::invalid_argument, "it was saved from a different model", ctx, {},
                   [&] { ctx.load_sequence(p.string()); });
  }
  {
    ContextParams bp = small_params(1, 64);
    bp.state_dtype = DType::bf16;
    Context bf(model, bp);
    const SeqId bs = bf.create_sequence();
    last_logits(bf, bs, prompt(10, 5));
    const fs::path p = dir.path / "bf16.gdnstate";
    bf.save_sequence(bs, p.string());
    expect_refused("state.state_dtype_mismatch", Status::invalid_argument, "its state dtype is BF16, the context's is F32", ctx, {},
                   [&] { ctx.load_sequence(p.string()); });
  }
  {
    Context shorter(model, small_params(1, 32));
    expect_refused("state.longer_than_context", Status::context_overflow, "holds 40 positions; max_context is 32", shorter, {},
                   [&] { shorter.load_sequence(good.string()); });
    Context one(model, small_params(1, 64));
    const SeqId taken = one.create_sequence();
    expect_refused("state.no_free_slot", Status::out_of_capacity, "load_sequence: all 1 sequence slots are in use", one, {taken},
                   [&] { one.load_sequence(good.string()); });
  }
  // The good file still loads and continues exactly.
  const SeqId back = ctx.load_sequence(good.string());
  CHECK(ctx.sequence_length(back) == 40);
}

// =============================================================================================
TEST_CASE("bad tokenizer.json files and tokenizer inputs", "[bad][tokenizer]") {
  const auto tiny = [](const std::string& model_extra, const std::string& vocab_extra = "") {
    return std::string(R"({"model": {"type": "BPE", )") + model_extra + R"("vocab": {"a": 0, "b": 1, "ab": 2)" + vocab_extra +
           R"(}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
              "decoder": {"type": "ByteLevel"}})";
  };
  expect_error("tok.model_not_bpe", Status::unsupported_model, "\"WordPiece\" is not BPE",
               [&] { Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})", "t.json"); });
  // A stray huge id must not size the id tables (found by fuzzing: 2^31 ids allocated ~64 GB).
  expect_error("tok.vocab_id_far_beyond", Status::invalid_file, "far beyond",
               [&] { Tokenizer::from_json(tiny("", R"(, "zz": 2000000000)"), "t.json"); });
  expect_error("tok.merge_not_in_vocab", Status::invalid_file, "\"c\" is not in the vocabulary", [&] {
    Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})", "t.json");
  });
  const Tokenizer t = Tokenizer::from_json(tiny(""), "t.json");
  expect_error("tok.decode_out_of_range", Status::invalid_token, "token id 3 is not in the vocabulary", [&] {
    const std::int32_t ids[] = {0, 3};
    t.decode(ids);
  });
  expect_error("tok.encode_invalid_utf8", Status::invalid_argument, "not valid UTF-8 (byte 1)", [&] { t.encode("a\xC0\xAF"); });
}

// =============================================================================================
TEST_CASE("the C ABI refuses NULL, foreign and stale handles and wrong-size structs with a message", "[bad][capi]") {
  gdn_model* m = nullptr;
  REQUIRE(gdn_model_load(test::fixture_model(tied).c_str(), nullptr, &m) == GDN_STATUS_OK);
  gdn_context_params cp = gdn_context_default_params();
  cp.max_sequences = 1;
  cp.max_context = 64;
  cp.threads = 1;
  gdn_context* c = nullptr;
  REQUIRE(gdn_context_create(m, &cp, &c) == GDN_STATUS_OK);
  gdn_batch* b = nullptr;
  REQUIRE(gdn_batch_init(1, 8, &b) == GDN_STATUS_OK);
  gdn_seq_id s = 0;
  std::int64_t n = 0;

  expect_c_error("capi.null_context", GDN_STATUS_INVALID_ARGUMENT, "gdn_context_step: context is NULL",
                 [&] { return gdn_context_step(nullptr, b); });
  expect_c_error("capi.null_output", GDN_STATUS_INVALID_ARGUMENT, "gdn_seq_create: out_seq is NULL",
                 [&] { return gdn_seq_create(c, nullptr); });
  expect_c_error("capi.null_path", GDN_STATUS_INVALID_ARGUMENT, "gdn_model_load: path is NULL",
                 [&] { return gdn_model_load(nullptr, nullptr, &m); });
  expect_c_error("capi.foreign_handle", GDN_STATUS_INVALID_ARGUMENT, "batch is not a live batch handle",
                 [&] { return gdn_context_step(c, reinterpret_cast<gdn_batch*>(m)); });
  expect_c_error("capi.wrong_size_struct", GDN_STATUS_INVALID_ARGUMENT,
                 "wrong-size parameter struct: gdn_context_params.size is 8", [&] {
                   gdn_context_params bad = cp;
                   bad.size = 8;
                   gdn_context* out = nullptr;
                   return gdn_context_create(m, &bad, &out);
                 });
  expect_c_error("capi.wrong_size_output_struct", GDN_STATUS_INVALID_ARGUMENT, "gdn_model_config.size is 4", [&] {
    gdn_model_config cfg;
    cfg.size = 4;
    return gdn_model_get_config(m, &cfg);
  });
  REQUIRE(gdn_seq_create(c, &s) == GDN_STATUS_OK);
  REQUIRE(gdn_seq_free(c, s) == GDN_STATUS_OK);
  expect_c_error("capi.stale_sequence", GDN_STATUS_INVALID_SEQUENCE, "gdn_seq_length: sequence_length: sequence id",
                 [&] { return gdn_seq_length(c, s, &n); });
  const gdn_token tok = 1;
  REQUIRE(gdn_batch_add(b, s, &tok, 1, GDN_LOGITS_LAST, 0, nullptr) == GDN_STATUS_OK);
  expect_c_error("capi.step_freed_sequence", GDN_STATUS_INVALID_SEQUENCE, "gdn_context_step: step: sequence id",
                 [&] { return gdn_context_step(c, b); });
  expect_c_error("capi.batch_unknown_flags", GDN_STATUS_INVALID_ARGUMENT, "flags 128 has bits this libgdn",
                 [&] { return gdn_batch_add(b, s, &tok, 1, GDN_LOGITS_LAST, 1u << 7, nullptr); });
  expect_c_error("capi.negative_token_count", GDN_STATUS_INVALID_ARGUMENT, "n_tokens is -1",
                 [&] { return gdn_batch_add(b, s, &tok, -1, GDN_LOGITS_LAST, 0, nullptr); });
  expect_c_error("capi.lm_head_quant_unknown", GDN_STATUS_INVALID_ARGUMENT, "lm_head_quant 7 is not a gdn_lm_head_quant", [&] {
    gdn_model_params mp = gdn_model_default_params();
    mp.quant = GDN_QUANT_Q4_0;
    mp.lm_head_quant = static_cast<gdn_lm_head_quant>(7);
    gdn_model* out = nullptr;
    return gdn_model_load(test::fixture_model(tied).c_str(), &mp, &out);
  });
  {
    TempDir d;
    fs::copy(test::fixture_model(tied), d.path / "m", fs::copy_options::recursive);
    write_bytes(d.path / "m" / "model.safetensors", std::vector<std::byte>(3));
    gdn_model* bad = nullptr;
    expect_c_error("capi.load_invalid_file", GDN_STATUS_INVALID_FILE, "gdn_model_load: ", [&] {
      return gdn_model_load((d.path / "m").string().c_str(), nullptr, &bad);
    });
    CHECK_THAT(gdn_last_error(), Catch::Contains("invalid safetensors file"));
    CHECK(bad == nullptr);
  }
  gdn_batch_free(b);
  gdn_context_free(c);
  gdn_model_free(m);
}

// =============================================================================================
TEST_CASE("docs/reliability.md lists every case of this file with its status", "[bad][docs]") {
  const std::string src = read_text(fs::path(GDN_SOURCE_DIR) / "tests" / "test_bad_inputs.cpp");
  const std::string doc = read_text(fs::path(GDN_SOURCE_DIR) / "docs" / "reliability.md");
  REQUIRE(!doc.empty());
  const std::regex call(R"re(expect_(?:c_)?(?:error|refused)\(\s*"([a-z0-9_.]+)",\s*(?:Status::|GDN_STATUS_)([A-Za-z_]+))re");
  std::set<std::string> ids;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), call); it != std::sregex_iterator(); ++it) {
    const std::string id = (*it)[1];
    std::string status = (*it)[2];
    for (auto& ch : status) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    INFO("case " << id << " (" << status << ")");
    CHECK(ids.insert(id).second);  // ids are unique
    // Its catalogue row, a line starting "| `id` | status |".
    const auto row = doc.find("\n| `" + id + "` |");
    REQUIRE(row != std::string::npos);
    const std::string line = doc.substr(row + 1, doc.find('\n', row + 1) - row - 1);
    CHECK_THAT(line, Catch::Contains("| " + status + " |"));
  }
  CHECK(ids.size() >= 40);
}
