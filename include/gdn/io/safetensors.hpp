#pragma once
// safetensors reader. The format is an 8-byte little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the data.
// Everything in the header is untrusted: parse_safetensors_header() checks every field, every
// size computation for overflow, every range against the file, and that no two tensors overlap,
// before any view into the data is handed out.
// Thread safety: a SafetensorsFile or Checkpoint is immutable once constructed; any thread may read it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gdn/core/tensor.hpp"
#include "gdn/io/mapped_file.hpp"

namespace gdn::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, TensorView::max_rank> shape{};
  std::uint64_t begin = 0;  // byte offsets relative to the start of the data section
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in offset order
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0;  // where the data section starts in the file
};

// Parses and validates the header of a complete safetensors file held in `file`. `what` names the
// file in error messages. Throws gdn::Error(invalid_file) on any defect.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view what);
// The same from the file's first bytes only: `head` holds at least the length field and the JSON,
// `file_size` is the whole file's (every range is checked against it).
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> head, std::uint64_t file_size, std::string_view what);
// Reads and validates only the header of the file at `path` (two reads; the data is neither mapped
// nor read). Throws gdn::Error(io_error) when it cannot be read.
SafetensorsHeader read_safetensors_header(const std::string& path);

// The files of a checkpoint directory: model.safetensors, or the shards model.safetensors.index.json
// lists (sorted, plain names inside the directory), and the index's tensor → shard map (empty
// without an index). Throws gdn::Error(io_error | invalid_file) naming the defect.
struct CheckpointFiles {
  std::vector<std::string> shards;                            // file names, sorted
  std::unordered_map<std::string, std::string> weight_map;    // tensor → shard file name
  std::string index_path;                                     // empty without an index
};
CheckpointFiles checkpoint_files(const std::string& dir);

// One memory-mapped, validated safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const SafetensorsHeader& header() const noexcept { return header_; }
  const std::string& path() const noexcept { return file_.path(); }
  std::span<const std::byte> bytes() const noexcept { return file_.bytes(); }
  // nullptr when absent.
  const SafetensorsEntry* find(std::string_view name) const;
  TensorView view(const SafetensorsEntry& e) const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, std::size_t> index_;
};

// A checkpoint directory: model.safetensors, or shards listed by model.safetensors.index.json.
// Tensor names are unique across shards (a name in two shards is an error).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);

  const std::string& dir() const noexcept { return dir_; }
  bool contains(std::string_view name) const;
  // Throws gdn::Error(missing_tensor) naming the tensor when absent.
  TensorView get(std::string_view name) const;
  // nullptr-data view when absent.
  TensorView find(std::string_view name) const;
  std::vector<std::string> names() const;
  std::size_t shard_count() const noexcept { return shards_.size(); }
  // The bytes of shard i (header and data), as mapped.
  std::span<const std::byte> shard_bytes(std::size_t i) const noexcept { return shards_[i]->bytes(); }
  const SafetensorsFile& shard(std::size_t i) const noexcept { return *shards_[i]; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::unordered_map<std::string, std::pair<std::size_t, const SafetensorsEntry*>> tensors_;
};

DType parse_dtype(std::string_view name, std::string_view what);

}  // namespace gdn::io
