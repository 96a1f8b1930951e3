#pragma once
// Rewriting checkpoints for tests: read every tensor of a checkpoint directory into memory, edit
// them, write them back as one model.safetensors. Used to make deliberately broken copies of the
// fixtures (a norm with its +1 baked in, value heads in GGUF order, ...) in temporary directories.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gdn/core/dtype.hpp"
#include "gdn/core/error.hpp"
#include "gdn/io/safetensors.hpp"

namespace gdn::test {

struct TensorData {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (const auto d : shape) n *= d;
    return n;
  }
  std::vector<float> floats() const {
    std::vector<float> v(static_cast<std::size_t>(numel()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::f32) std::memcpy(&v[i], bytes.data() + 4 * i, 4);
      else if (dtype == DType::bf16) { bf16 h; std::memcpy(&h, bytes.data() + 2 * i, 2); v[i] = to_float(h); }
      else throw Error(Status::invalid_argument, "TensorData::floats: F32 or BF16 only");
    }
    return v;
  }
  void set_floats(const std::vector<float>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::f32) std::memcpy(bytes.data() + 4 * i, &v[i], 4);
      else if (dtype == DType::bf16) { const bf16 h = to_bf16(v[i]); std::memcpy(bytes.data() + 2 * i, &h, 2); }
      else throw Error(Status::invalid_argument, "TensorData::set_floats: F32 or BF16 only");
    }
  }
  template <typename F>
  void map_floats(F&& f) {
    auto v = floats();
    for (auto& x : v) x = f(x);
    set_floats(v);
  }
};

using TensorMap = std::map<std::string, TensorData>;

inline TensorMap read_tensors(const std::string& dir) {
  io::Checkpoint ck(dir);
  TensorMap out;
  for (const auto& name : ck.names()) {
    const TensorView t = ck.get(name);
    TensorData d;
    d.dtype = t.dtype;
    d.shape.assign(t.shape.begin(), t.shape.begin() + t.rank);
    d.bytes.assign(t.data, t.data + t.nbytes());
    out.emplace(name, std::move(d));
  }
  return out;
}

inline void write_safetensors(const std::string& path, const TensorMap& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text += ' ';
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!out) throw Error(Status::io_error, "cannot write " + path);
}

// A scratch directory removed when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int serial = 0;
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = std::filesystem::temp_directory_path() /
            ("gdn_test_" + tag + "_" + std::to_string(now) + "_" + std::to_string(serial++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Writes a copy of checkpoint `src` into `dst`: the tensors given, config.json as given, and every
// other small file of `src` (tokenizer, generation config) as it is.
inline void write_checkpoint(const std::string& src, const std::string& dst, const TensorMap& tensors,
                             const nlohmann::json& config) {
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(src)) {
    const auto name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.find(".safetensors") != std::string::npos) continue;
    fs::copy_file(e.path(), fs::path(dst) / name, fs::copy_options::overwrite_existing);
  }
  std::ofstream(fs::path(dst) / "config.json") << config.dump(2);
  write_safetensors((fs::path(dst) / "model.safetensors").string(), tensors);
}

inline nlohmann::json read_config(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  return nlohmann::json::parse(in);
}

}  // namespace gdn::test
