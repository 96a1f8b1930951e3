// The safetensors reader and checkpoint loader on good and bad bytes: every defect is a clear
// gdn::Error naming what is wrong, never a crash.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "gdn/core/error.hpp"
#include "gdn/io/safetensors.hpp"
#include "gdn/model/model.hpp"
#include "test_util.hpp"

using namespace gdn;
namespace fs = std::filesystem;

namespace {

std::vector<std::byte> make_file(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> f(8 + header.size() + data_bytes, std::byte{0});
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(f.data() + 8, header.data(), header.size());
  return f;
}

// Expects parse to fail with invalid_file and a message containing `needle`.
void expect_bad(const std::vector<std::byte>& f, const std::string& needle) {
  try {
    io::parse_safetensors_header(f, "test.safetensors");
    FAIL("accepted a bad file; expected: " << needle);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.status() == Status::invalid_file);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fs::path("gdn_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() { static int c = 0; return c; }
};

void write_bytes(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<std::byte> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

void copy_fixture(const std::string& name, const fs::path& to) {
  fs::copy(test::fixture_model(name), to, fs::copy_options::recursive);
}

template <typename F>
Status status_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.status();
  }
  return Status::ok;
}

}  // namespace

TEST_CASE("a well-formed header parses with dtypes, shapes and offsets", "[safetensors]") {
  const auto f = make_file(R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                           20);
  const auto h = io::parse_safetensors_header(f, "t");
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "a");  // sorted by offset
  CHECK(h.tensors[1].dtype == DType::bf16);
  CHECK(h.tensors[1].shape[1] == 3);
  CHECK(h.metadata.at("format") == "pt");
}

TEST_CASE("malformed safetensors headers are rejected with a precise message", "[safetensors]") {
  expect_bad(std::vector<std::byte>(5), "shorter than the 8-byte header length");
  auto f = make_file("{}", 0);
  f[0] = std::byte{0xff};
  expect_bad(f, "runs past the end");
  auto huge = make_file("{}", 0);
  huge[4] = std::byte{0x7f};
  expect_bad(huge, "exceeds");
  expect_bad(make_file("{not json", 0), "not valid JSON");
  expect_bad(make_file("[1,2]", 0), "not a JSON object");
  expect_bad(make_file(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1), "unknown dtype 'Q4'");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})", 8), "needs 16");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), "truncated");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "begin 8 > end 0");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
             "overlap");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
             "appears twice");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8), "overflows");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8), "non-negative");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4), "rank 9");
  expect_bad(make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "no dtype");
  expect_bad(make_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), "no shape");
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[1]}})", 4), "data_offsets");
  expect_bad(make_file(R"({"__metadata__":{"k":1}})", 0), "not a string");
}

TEST_CASE("checkpoint loader errors name the file and tensor", "[loader]") {
  std::string msg;
  SECTION("missing directory") {
    CHECK(status_of([] { Model::load("/nonexistent/gdn/model"); }, &msg) == Status::io_error);
  }
  SECTION("directory without weights") {
    TempDir d;
    fs::copy_file(fs::path(test::fixture_model("qwen35_tied")) / "config.json", d.path / "config.json");
    CHECK(status_of([&] { Model::load(d.path.string()); }, &msg) == Status::io_error);
    CHECK(msg.find("model.safetensors") != std::string::npos);
  }
  SECTION("truncated safetensors file") {
    TempDir d;
    copy_fixture("qwen35_tied", d.path / "m");
    auto bytes = read_bytes(d.path / "m" / "model.safetensors");
    bytes.resize(bytes.size() - 100);
    write_bytes(d.path / "m" / "model.safetensors", bytes);
    CHECK(status_of([&] { Model::load((d.path / "m").string()); }, &msg) == Status::invalid_file);
    CHECK(msg.find("truncated") != std::string::npos);
  }
  SECTION("a tensor missing from a shard") {
    TempDir d;
    copy_fixture("qwen35_cond_mtp", d.path / "m");
    // Drop one shard entirely: the index still lists its tensors.
    fs::path shard;
    for (const auto& e : fs::directory_iterator(d.path / "m"))
      if (e.path().filename().string().find("00002-of") != std::string::npos) shard = e.path();
    REQUIRE(!shard.empty());
    fs::remove(shard);
    CHECK(status_of([&] { Model::load((d.path / "m").string()); }, &msg) == Status::io_error);
    CHECK(msg.find("00002") != std::string::npos);
  }
  SECTION("shape not matching the config") {
    TempDir d;
    copy_fixture("qwen35_tied", d.path / "m");
    // Claim a larger intermediate size than the tensors have.
    std::ifstream in(d.path / "m" / "config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const auto at = cfg.find("\"intermediate_size\": 128");
    REQUIRE(at != std::string::npos);
    cfg.replace(at, std::string("\"intermediate_size\": 128").size(), "\"intermediate_size\": 256");
    std::ofstream(d.path / "m" / "config.json") << cfg;
    CHECK(status_of([&] { Model::load((d.path / "m").string()); }, &msg) == Status::tensor_mismatch);
    CHECK(msg.find("mlp.gate_proj.weight") != std::string::npos);
    CHECK(msg.find("[256, 64]") != std::string::npos);
  }
  SECTION("missing tensor") {
    TempDir d;
    copy_fixture("qwen35_tied", d.path / "m");
    // Rename a tensor in the header (same length keeps offsets valid).
    auto bytes = read_bytes(d.path / "m" / "model.safetensors");
    std::string s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    const auto at = s.find("layers.0.linear_attn.A_log");
    REQUIRE(at != std::string::npos);
    bytes[at + std::string("layers.0.linear_attn.").size()] = std::byte{'X'};
    write_bytes(d.path / "m" / "model.safetensors", bytes);
    CHECK(status_of([&] { Model::load((d.path / "m").string()); }, &msg) == Status::missing_tensor);
    CHECK(msg.find("model.layers.0.linear_attn.A_log") != std::string::npos);
  }
  SECTION("wrong dtype") {
    TempDir d;
    copy_fixture("qwen35_tied", d.path / "m");
    auto bytes = read_bytes(d.path / "m" / "model.safetensors");
    std::string s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    // Relabel BF16 as I16 for the first tensor that has it: same size, not a float type.
    const auto at = s.find("\"BF16\"");
    REQUIRE(at != std::string::npos);
    std::memcpy(bytes.data() + at, "\"I16\" ", 6);
    write_bytes(d.path / "m" / "model.safetensors", bytes);
    CHECK(status_of([&] { Model::load((d.path / "m").string()); }, &msg) == Status::tensor_mismatch);
    CHECK(msg.find("I16") != std::string::npos);
  }
}

TEST_CASE("vision tensors are not required and not bound", "[loader]") {
  auto m = Model::load(test::fixture_model("qwen35_cond_mtp_single"));
  io::Checkpoint ck(test::fixture_model("qwen35_cond_mtp_single"));
  bool has_visual = false;
  for (const auto& n : ck.names()) has_visual = has_visual || n.rfind("model.visual.", 0) == 0;
  CHECK(has_visual);
  CHECK(m->weights().prefix == "model.language_model.");
}
