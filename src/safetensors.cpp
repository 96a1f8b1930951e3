#include "gdn/io/safetensors.hpp"


#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/core/error.hpp"
#include "read_only_file.hpp"

namespace gdn {

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::i8: return "I8";
    case DType::i16: return "I16";
    case DType::f64: return "F64";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += fmt::format("{}{}", i ? ", " : "", t.dim(i));
  return s + "]";
}

}  // namespace gdn

namespace gdn::io {
namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, before allocating anything.
constexpr std::uint64_t max_header_bytes = 100'000'000;

[[noreturn]] void bad(std::string_view what, const std::string& why) {
  throw Error(Status::invalid_file, fmt::format("{}: invalid safetensors file: {}", what, why));
}

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

std::uint64_t as_u64(const json& v, std::string_view what, const std::string& field) {
  if (!v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return v.get<std::uint64_t>();
    // Containers by type only: dump() recurses, and a deeply nested value would overflow the stack.
    bad(what, fmt::format("{} must be a non-negative integer, got {}", field,
                          v.is_structured() ? std::string("an ") + v.type_name() : v.dump().substr(0, 64)));
  }
  return v.get<std::uint64_t>();
}

}  // namespace

DType parse_dtype(std::string_view name, std::string_view what) {
  static constexpr std::pair<std::string_view, DType> table[] = {
      {"F32", DType::f32}, {"F16", DType::f16},  {"BF16", DType::bf16}, {"I32", DType::i32},
      {"I64", DType::i64}, {"U8", DType::u8},    {"I8", DType::i8},     {"I16", DType::i16},
      {"F64", DType::f64}, {"BOOL", DType::boolean}};
  for (const auto& [n, t] : table)
    if (n == name) return t;
  bad(what, fmt::format("unknown dtype '{}'", name));
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view what) {
  return parse_safetensors_header(file, file.size(), what);
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> head, std::uint64_t file_size, std::string_view what) {
  if (file_size < 8 || head.size() < 8)
    bad(what, fmt::format("file is {} bytes, shorter than the 8-byte header length", file_size));
  const std::uint64_t n = read_le64(head.data());
  if (n > max_header_bytes) bad(what, fmt::format("header length {} exceeds the {} byte limit", n, max_header_bytes));
  if (n > file_size - 8) bad(what, fmt::format("header length {} runs past the end of the {}-byte file", n, file_size));
  if (n > head.size() - 8) throw Error(Status::internal, fmt::format("{}: safetensors header passed without its JSON", what));
  const char* text = reinterpret_cast<const char*>(head.data() + 8);

  // Duplicate top-level names would silently shadow each other in a JSON object; detect them.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && duplicate.empty()) {
      auto key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = std::move(key);
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text, text + n, on_event);
  } catch (const json::exception& e) {
    bad(what, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!duplicate.empty()) bad(what, fmt::format("tensor '{}' appears twice in the header", duplicate));
  if (!doc.is_object()) bad(what, "header is not a JSON object");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const std::uint64_t data_size = file_size - h.data_offset;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(what, "__metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad(what, fmt::format("__metadata__ value '{}' is not a string", m.key()));
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) bad(what, fmt::format("entry '{}' is not an object", name));
    SafetensorsEntry e;
    e.name = name;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad(what, fmt::format("tensor '{}' has no dtype string", name));
    e.dtype = parse_dtype(dt->get<std::string>(), what);
    const auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array()) bad(what, fmt::format("tensor '{}' has no shape array", name));
    if (shape->size() > TensorView::max_rank)
      bad(what, fmt::format("tensor '{}' has rank {}, above the supported {}", name, shape->size(), TensorView::max_rank));
    e.rank = static_cast<int>(shape->size());
    std::uint64_t bytes = dtype_size(e.dtype);
    for (std::size_t i = 0; i < shape->size(); ++i) {
      const std::uint64_t d = as_u64((*shape)[i], what, fmt::format("shape[{}] of '{}'", i, name));
      if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          __builtin_mul_overflow(bytes, d, &bytes))
        bad(what, fmt::format("the size of tensor '{}' overflows 64 bits", name));
      e.shape[i] = static_cast<std::int64_t>(d);
    }
    const auto offs = v.find("data_offsets");
    if (offs == v.end() || !offs->is_array() || offs->size() != 2)
      bad(what, fmt::format("tensor '{}' needs data_offsets [begin, end]", name));
    e.begin = as_u64((*offs)[0], what, fmt::format("data_offsets[0] of '{}'", name));
    e.end = as_u64((*offs)[1], what, fmt::format("data_offsets[1] of '{}'", name));
    if (e.begin > e.end) bad(what, fmt::format("tensor '{}' has begin {} > end {}", name, e.begin, e.end));
    if (e.end > data_size)
      bad(what, fmt::format("tensor '{}' ends at byte {} but the data section holds only {} bytes (truncated file?)",
                            name, e.end, data_size));
    if (e.end - e.begin != bytes)
      bad(what, fmt::format("tensor '{}' spans {} bytes but {} of shape {} needs {}", name, e.end - e.begin,
                            dtype_name(e.dtype), shape->dump(), bytes));
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Compare each tensor with the furthest-reaching non-empty one before it, not just its neighbour:
  // an empty tensor between two overlapping ones must not hide the overlap.
  const SafetensorsEntry* reach = nullptr;
  for (const auto& c : h.tensors) {
    if (c.end == c.begin) continue;
    if (reach != nullptr && c.begin < reach->end)
      bad(what, fmt::format("tensors '{}' and '{}' overlap in the data section", reach->name, c.name));
    if (reach == nullptr || c.end > reach->end) reach = &c;
  }
  return h;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const detail::ReadOnlyFile file(path);
  // Lengths past the limit or the file are refused by the parser; only a plausible one is read.
  const auto head = file.head(8, [](std::span<const std::byte> h) {
    const std::uint64_t n = read_le64(h.data());
    return n <= max_header_bytes ? 8 + n : 0;
  });
  return parse_safetensors_header(head, file.size(), path);
}

CheckpointFiles checkpoint_files(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw Error(Status::io_error, fmt::format("'{}' is not a directory", dir));
  const fs::path index = root / "model.safetensors.index.json";
  CheckpointFiles out;
  if (fs::exists(index)) {
    out.index_path = index.string();
    std::ifstream in(index);
    if (!in) throw Error(Status::io_error, fmt::format("cannot read '{}'", index.string()));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw Error(Status::invalid_file, fmt::format("{}: not valid JSON ({})", index.string(), e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(Status::invalid_file, fmt::format("{}: missing the 'weight_map' object", index.string()));
    std::set<std::string> unique;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw Error(Status::invalid_file, fmt::format("{}: weight_map['{}'] is not a file name", index.string(), it.key()));
      const std::string shard = it.value().get<std::string>();
      // Shards must be plain file names inside the checkpoint directory.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw Error(Status::invalid_file, fmt::format("{}: shard name '{}' is not a file in the directory", index.string(), shard));
      out.weight_map[it.key()] = shard;
      if (unique.insert(shard).second) out.shards.push_back(shard);
    }
  } else if (fs::exists(root / "model.safetensors")) {
    out.shards.push_back("model.safetensors");
  } else {
    throw Error(Status::io_error,
                fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json", dir));
  }
  std::sort(out.shards.begin(), out.shards.end());
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path, /*huge_pages=*/true) {
  header_ = parse_safetensors_header(file_.bytes(), path);
  for (std::size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const SafetensorsEntry& e) const {
  TensorView t;
  t.dtype = e.dtype;
  t.rank = e.rank;
  t.shape = e.shape;
  t.data = file_.bytes().data() + header_.data_offset + e.begin;
  return t;
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const CheckpointFiles files = checkpoint_files(dir);
  const std::vector<std::string>& shard_names = files.shards;
  const auto& weight_map = files.weight_map;
  const fs::path index(files.index_path);
  for (const auto& s : shard_names) {
    shards_.push_back(std::make_unique<SafetensorsFile>((root / s).string()));
    const std::size_t k = shards_.size() - 1;
    for (const auto& e : shards_[k]->header().tensors) {
      const auto [it, fresh] = tensors_.emplace(e.name, std::make_pair(k, &e));
      if (!fresh)
        throw Error(Status::invalid_file, fmt::format("tensor '{}' appears in both '{}' and '{}'", e.name,
                                                      shards_[it->second.first]->path(), shards_[k]->path()));
    }
  }
  for (const auto& [name, shard] : weight_map) {
    const auto it = tensors_.find(name);
    if (it == tensors_.end() || fs::path(shards_[it->second.first]->path()).filename() != shard)
      throw Error(Status::invalid_file,
                  fmt::format("{}: index lists '{}' in '{}', which does not hold it", index.string(), name, shard));
  }
}

bool Checkpoint::contains(std::string_view name) const { return tensors_.count(std::string(name)) != 0; }

TensorView Checkpoint::find(std::string_view name) const {
  const auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) return {};
  return shards_[it->second.first]->view(*it->second.second);
}

TensorView Checkpoint::get(std::string_view name) const {
  TensorView t = find(name);
  if (t.empty() && !contains(name))
    throw Error(Status::missing_tensor, fmt::format("{}: tensor '{}' is missing from the checkpoint", dir_, name));
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [n, _] : tensors_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace gdn::io
