// The packed weight image's header (gdn/model/packed_image.hpp): encoding, the validating parser
// (fuzzed by tests/fuzz/fuzz_packed_image.cpp), and the checkpoint fingerprint.

#include "gdn/model/packed_image.hpp"


#include <algorithm>
#include <array>
#include <memory>
#include <unordered_map>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "gdn/core/error.hpp"
#include "gdn/io/safetensors.hpp"
#include "binary_io.hpp"
#include "read_only_file.hpp"

namespace gdn {
namespace {

constexpr char magic[8] = {'G', 'D', 'N', 'P', 'A', 'C', 'K', 0};
constexpr std::uint64_t fixed_bytes = 16;          // magic, version, N
constexpr std::uint64_t max_json = 64u << 20;      // a header of 64 MB is far beyond any model's

using detail::get_u32;
using detail::put_u32;

std::uint64_t round_up(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b * b; }

[[noreturn]] void bad(std::string_view what, const std::string& why) {
  throw Error(Status::invalid_file, fmt::format("{}: invalid packed weight image: {}", what, why));
}

// A scalar for a message: never dump() an untrusted container (it recurses).
std::string describe(const nlohmann::json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  std::string s = v.dump();
  return s.size() > 64 ? s.substr(0, 61) + "..." : s;
}

}  // namespace

std::uint64_t packed_layout_elements(std::string_view layout, std::int64_t rows, std::int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return 0;
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  // The same as cpu::weight_image_elements (test_packed_image checks that they agree).
  if (layout == "panels") return (r + 31) / 32 * ((c + 1) / 2) * 64;
  if (layout == "amx_tiles") return round_up(r, 32) * round_up(c, 32);
  // Quantised tiles of 32 rows × 32 columns: 1024 + 64 bytes (q8_0), 640 + 64 (q5_0), 512 + 64
  // (q4_0, q4_k), and q4_k's 128 bytes per 32 rows and super-block of 8 tiles; see cpu/quant.hpp.
  if (layout == "q8_0") return round_up(r, 32) / 32 * (round_up(c, 32) / 32) * 544;
  if (layout == "q5_0") return round_up(r, 32) / 32 * (round_up(c, 32) / 32) * 352;
  if (layout == "q4_0") return round_up(r, 32) / 32 * (round_up(c, 32) / 32) * 288;
  if (layout == "q4_k") return round_up(r, 32) / 32 * ((round_up(c, 32) / 32) * 288 + round_up(c, 256) / 256 * 64);
  return 0;
}

std::int64_t packed_layout_version(std::string_view layout) noexcept {
  if (layout == "panels" || layout == "amx_tiles" || layout == "q8_0" || layout == "q4_0" || layout == "q4_k") return 1;
  return 0;
}

std::string encode_packed_image_header(PackedImageHeader& h) {
  const auto json_of = [&] {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : h.tensors)
      tensors.push_back({{"name", t.name},
                         {"rows", t.rows},
                         {"cols", t.cols},
                         {"offset", t.offset},
                         {"bytes", t.bytes},
                         {"encoding", t.encoding.empty() ? h.layout : t.encoding}});
    const nlohmann::json j = {{"format", "libgdn packed weight image"},
                              {"weight_encoding", h.weight_encoding},
                              {"quant_block", h.quant_block},
                              {"layout", h.layout},
                              {"layout_version", h.layout_version},
                              {"fingerprint", h.fingerprint},
                              {"writer", h.writer},
                              {"file_bytes", h.file_bytes},
                              {"data_offset", h.data_offset},
                              {"tensors", tensors}};
    return j.dump();
  };
  // The offsets depend on the header's length, which depends on their digits: lay the data out after
  // a header sized with room to spare, then pad the JSON to that size.
  const auto layout_after = [&](std::uint64_t header_end) {
    h.data_offset = round_up(header_end, PackedImageHeader::alignment);
    std::uint64_t at = h.data_offset;
    for (auto& t : h.tensors) {
      t.offset = at;
      at = round_up(at + t.bytes, PackedImageHeader::alignment);
    }
    h.file_bytes = h.tensors.empty() ? h.data_offset : h.tensors.back().offset + h.tensors.back().bytes;
  };
  layout_after(0);
  std::string text = json_of();
  const std::uint64_t room = text.size() + 256 + 32 * h.tensors.size();
  layout_after(fixed_bytes + room + 4);
  text = json_of();
  if (text.size() > room) throw Error(Status::internal, "encode_packed_image_header: the header outgrew its room");
  text.resize(static_cast<std::size_t>(room), ' ');
  std::string out(magic, 8);
  put_u32(out, PackedImageHeader::format_version);
  put_u32(out, static_cast<std::uint32_t>(text.size()));
  out += text;
  put_u32(out, detail::crc32_of(out.data(), out.size()));
  out.resize(static_cast<std::size_t>(h.data_offset), '\0');
  return out;
}

PackedImageHeader parse_packed_image_header(std::span<const std::byte> file, std::string_view what) {
  return parse_packed_image_header(file, file.size(), what);
}

PackedImageHeader read_packed_image_header(const std::string& path) {
  const detail::ReadOnlyFile file(path);
  const auto head = file.head(fixed_bytes, [](std::span<const std::byte> h) {
    const std::uint64_t n = get_u32(h.data() + 12);
    return n <= max_json ? fixed_bytes + n + 4 : 0;
  });
  return parse_packed_image_header(head, file.size(), path);
}

PackedImageHeader parse_packed_image_header(std::span<const std::byte> file, std::uint64_t file_size, std::string_view what) {
  if (file.size() < fixed_bytes + 4) bad(what, fmt::format("{} bytes is too short for a header", file_size));
  if (std::memcmp(file.data(), magic, 8) != 0) bad(what, "wrong magic (not a libgdn packed weight image)");
  const std::uint32_t version = get_u32(file.data() + 8);
  if (version != PackedImageHeader::format_version)
    bad(what, fmt::format("format version {} is not the supported {} (written by another libgdn: run gdn pack again)", version,
                          PackedImageHeader::format_version));
  const std::uint64_t n = get_u32(file.data() + 12);
  if (n > max_json || fixed_bytes + n + 4 > file_size)
    bad(what, fmt::format("header length {} runs past the end of the {}-byte file (truncated?)", n, file_size));
  if (fixed_bytes + n + 4 > file.size()) throw Error(Status::internal, fmt::format("{}: image header passed without its JSON", what));
  const std::uint32_t stored = get_u32(file.data() + fixed_bytes + n);
  if (detail::crc32_of(file.data(), fixed_bytes + n) != stored) bad(what, "header checksum mismatch (corrupted)");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(reinterpret_cast<const char*>(file.data() + fixed_bytes),
                              reinterpret_cast<const char*>(file.data() + fixed_bytes + n));
  } catch (const nlohmann::json::exception& e) {
    bad(what, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!j.is_object()) bad(what, "header is not a JSON object");
  const auto field = [&](const nlohmann::json& obj, const char* key) -> const nlohmann::json& {
    const auto it = obj.find(key);
    if (it == obj.end()) bad(what, fmt::format("header field '{}' is missing", key));
    return *it;
  };
  const auto text = [&](const nlohmann::json& obj, const char* key) {
    const auto& v = field(obj, key);
    if (!v.is_string()) bad(what, fmt::format("header field '{}' must be a string, got {}", key, describe(v)));
    return v.get<std::string>();
  };
  const auto count = [&](const nlohmann::json& obj, const char* key) -> std::uint64_t {
    const auto& v = field(obj, key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
      bad(what, fmt::format("header field '{}' must be a non-negative integer, got {}", key, describe(v)));
    return v.get<std::uint64_t>();
  };

  PackedImageHeader h;
  h.weight_encoding = text(j, "weight_encoding");
  h.quant_block = static_cast<std::int64_t>(std::min<std::uint64_t>(count(j, "quant_block"), 1u << 30));
  // An image's layout is one a quant names; its tensors may also hold q5_0 (q4_k_m's format for
  // rows of partial super-blocks).
  const auto quant_name = [](const std::string& e) { return e == "q8_0" || e == "q4_0" || e == "q4_k"; };
  const auto tensor_quant_name = [&](const std::string& e) { return quant_name(e) || e == "q5_0"; };
  const bool quantized = quant_name(h.weight_encoding);
  if (h.weight_encoding != "bf16" && !quantized)
    bad(what, fmt::format("weight encoding '{}' is not one this libgdn reads (bf16, q8_0, q4_0, q4_k)", h.weight_encoding.substr(0, 64)));
  if (!quantized && h.quant_block != 0) bad(what, fmt::format("quant_block {} given for the bf16 encoding (0 expected)", h.quant_block));
  if (quantized && h.quant_block != 32)
    bad(what, fmt::format("quant_block {} for the {} encoding (32 expected)", h.quant_block, h.weight_encoding));
  h.layout = text(j, "layout");
  // A quantised encoding has its own layout (every kernel reads it); bf16 has the kernels'.
  if (quantized != quant_name(h.layout) || (quantized && h.layout != h.weight_encoding))
    bad(what, fmt::format("layout '{}' does not go with the {} encoding", h.layout.substr(0, 64), h.weight_encoding));
  h.layout_version = static_cast<std::int64_t>(std::min<std::uint64_t>(count(j, "layout_version"), 1u << 30));
  if (packed_layout_version(h.layout) == 0)
    bad(what, fmt::format("layout '{}' is not one this libgdn reads (panels, amx_tiles, q8_0, q4_0, q4_k)", h.layout.substr(0, 64)));
  if (h.layout_version != packed_layout_version(h.layout))
    bad(what, fmt::format("layout {} version {} is not the version {} this libgdn reads (run gdn pack again)", h.layout,
                          h.layout_version, packed_layout_version(h.layout)));
  h.fingerprint = text(j, "fingerprint");
  h.writer = text(j, "writer");
  h.file_bytes = count(j, "file_bytes");
  h.data_offset = count(j, "data_offset");
  if (h.file_bytes != file_size)
    bad(what, fmt::format("the header says the image is {} bytes but the file has {} ({})", h.file_bytes, file_size,
                          h.file_bytes > file_size ? "truncated" : "extra bytes at its end"));
  if (h.data_offset < fixed_bytes + n + 4 || h.data_offset > h.file_bytes || h.data_offset % PackedImageHeader::alignment != 0)
    bad(what, fmt::format("data_offset {} is not an aligned offset between the header and the end of the file", h.data_offset));

  const auto& tensors = field(j, "tensors");
  if (!tensors.is_array()) bad(what, "header field 'tensors' must be a list");
  std::set<std::string> names;
  std::uint64_t end_of_previous = h.data_offset;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& e = tensors[i];
    if (!e.is_object()) bad(what, fmt::format("tensors[{}] is not an object", i));
    PackedImageTensor t;
    t.name = text(e, "name");
    const std::uint64_t rows = count(e, "rows"), cols = count(e, "cols");
    t.offset = count(e, "offset");
    t.bytes = count(e, "bytes");
    // Absent in images written before tensors had their own encoding: the header's.
    t.encoding = e.contains("encoding") ? text(e, "encoding") : h.layout;
    if (quantized ? !tensor_quant_name(t.encoding) : t.encoding != h.layout)
      bad(what, fmt::format("tensor '{}' has encoding '{}', which a {} image cannot hold", t.name, t.encoding.substr(0, 64),
                            h.layout));
    if (rows == 0 || cols == 0 || rows > (1u << 30) || cols > (1u << 30))
      bad(what, fmt::format("tensor '{}' has shape [{}, {}]; each size must be in [1, 2^30]", t.name, rows, cols));
    t.rows = static_cast<std::int64_t>(rows);
    t.cols = static_cast<std::int64_t>(cols);
    if (!names.insert(t.name).second) bad(what, fmt::format("tensor '{}' appears twice", t.name));
    const std::uint64_t need = packed_layout_elements(t.encoding, t.rows, t.cols) * 2;
    if (t.bytes != need)
      bad(what, fmt::format("tensor '{}' has {} bytes but its {} image of [{}, {}] needs {}", t.name, t.bytes, t.encoding, t.rows,
                            t.cols, need));
    // In order, aligned, inside the file, not overlapping (each starts at or after the previous end).
    if (t.offset % PackedImageHeader::alignment != 0 || t.offset < end_of_previous || t.offset > h.file_bytes ||
        t.bytes > h.file_bytes - t.offset)
      bad(what, fmt::format("tensor '{}' at [{}, +{}) is misaligned, out of order or outside the {}-byte file", t.name, t.offset,
                            t.bytes, h.file_bytes));
    end_of_previous = t.offset + t.bytes;
    h.tensors.push_back(std::move(t));
  }
  return h;
}

// The fingerprint's two CRCs, fed shard by shard and sample by sample (the same bytes in the same
// order whether they come from a mapping or from reads).
class Fingerprint {
 public:
  void shard(const std::string& name, std::uint64_t size, std::span<const std::byte> header) {
    files_ = detail::crc32_update(files_, name.data(), name.size());
    files_ = detail::crc32_update(files_, &size, sizeof size);
    files_ = detail::crc32_update(files_, header.data(), header.size());
    total_ += size;
  }
  // The byte ranges of a tensor of n bytes that are sampled: 4 KiB at its start, middle and end.
  static std::array<std::pair<std::uint64_t, std::uint64_t>, 3> samples(std::uint64_t n) {
    constexpr std::uint64_t s = 4096;
    std::array<std::pair<std::uint64_t, std::uint64_t>, 3> out{};
    const std::uint64_t at[3] = {0, n / 2 > s / 2 ? n / 2 - s / 2 : 0, n > s ? n - s : 0};
    for (int i = 0; i < 3; ++i) out[static_cast<std::size_t>(i)] = {at[i], std::min(s, n - at[i])};
    return out;
  }
  void data(std::span<const std::byte> bytes) { data_ = detail::crc32_update(data_, bytes.data(), bytes.size()); }
  std::string str() const { return fmt::format("{:08x}-{:08x}-{:x}", files_, data_, total_); }

 private:
  std::uint32_t files_ = detail::crc32_initial(), data_ = files_;
  std::uint64_t total_ = 0;
};

std::string checkpoint_fingerprint(const io::Checkpoint& ckpt, std::span<const std::string> tensors) {
  Fingerprint f;
  for (std::size_t i = 0; i < ckpt.shard_count(); ++i) {
    const auto bytes = ckpt.shard_bytes(i);
    f.shard(std::filesystem::path(ckpt.shard(i).path()).filename().string(), bytes.size(),
            bytes.first(static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), ckpt.shard(i).header().data_offset))));
  }
  for (const auto& name : tensors) {
    const TensorView t = ckpt.find(name);
    if (t.empty()) continue;
    for (const auto& [at, n] : Fingerprint::samples(t.nbytes())) f.data({t.data + at, static_cast<std::size_t>(n)});
  }
  return f.str();
}

std::string checkpoint_fingerprint(const std::string& dir, std::span<const std::string> tensors) {
  Fingerprint f;
  struct Shard {
    detail::ReadOnlyFile file;
    io::SafetensorsHeader header;
  };
  std::vector<std::unique_ptr<Shard>> shards;
  std::unordered_map<std::string, std::pair<const Shard*, const io::SafetensorsEntry*>> where;
  for (const auto& name : io::checkpoint_files(dir).shards) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    auto s = std::unique_ptr<Shard>(new Shard{detail::ReadOnlyFile(path), io::read_safetensors_header(path)});
    std::vector<std::byte> head(static_cast<std::size_t>(s->header.data_offset));
    s->file.read(head.data(), head.size(), 0);
    f.shard(name, s->file.size(), head);
    for (const auto& e : s->header.tensors) where.emplace(e.name, std::make_pair(s.get(), &e));
    shards.push_back(std::move(s));
  }
  std::vector<std::byte> buf;
  for (const auto& name : tensors) {
    const auto it = where.find(name);
    if (it == where.end()) continue;
    const auto& [s, e] = it->second;
    for (const auto& [at, n] : Fingerprint::samples(e->end - e->begin)) {
      buf.resize(static_cast<std::size_t>(n));
      s->file.read(buf.data(), n, s->header.data_offset + e->begin + at);
      f.data(buf);
    }
  }
  return f.str();
}

}  // namespace gdn
