// libFuzzer target: the packed weight image's header (gdn/model/packed_image.hpp) on arbitrary
// bytes. Each input is parsed as it is (so the checksum check itself is fuzzed) and with its header
// CRC recomputed (so mutations reach the field checks behind it, as a deliberate attacker's would).
// Refusals must be gdn::Error(invalid_file). An accepted header must promise what the loader relies
// on to never misread: the file's size as stated, data after the header, and every tensor aligned,
// in order, inside the file, not overlapping the previous one, and exactly its layout's size.
//
// GDN_FUZZ_WRITE_SEEDS=DIR fuzz_packed_image writes the seeds of corpus/fuzz_packed_image to DIR
// (small valid images in both bf16 layouts, and a q4_k_m-like quantised one whose tensors are q4_k,
// q5_0 and q8_0) and exits.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <zlib.h>

#include "fuzz_check.hpp"
#include "gdn/core/error.hpp"
#include "gdn/model/packed_image.hpp"

namespace {

struct SeedTensor {
  std::string name;
  int rows, cols;
  std::string encoding;  // empty: the layout's
};

bool quantised(const std::string& e) { return e == "q8_0" || e == "q5_0" || e == "q4_0" || e == "q4_k"; }

void write_seed(const std::string& path, const std::string& layout, const std::vector<SeedTensor>& ts) {
  gdn::PackedImageHeader h;
  h.layout = layout;
  h.layout_version = gdn::packed_layout_version(layout);
  if (quantised(layout)) {
    h.weight_encoding = layout;
    h.quant_block = 32;
  }
  h.fingerprint = "0123abcd-4567ef01-2000";
  h.writer = "fuzz seed";
  for (const auto& t : ts) {
    const std::string e = t.encoding.empty() ? layout : t.encoding;
    h.tensors.push_back({t.name, t.rows, t.cols, 0, gdn::packed_layout_elements(e, t.rows, t.cols) * 2, e});
  }
  std::string file = gdn::encode_packed_image_header(h);
  file.resize(h.file_bytes, '\x01');
  std::ofstream(path, std::ios::binary) << file;
}

void write_seeds(const std::string& dir) {
  write_seed(dir + "/empty.gdnimg", "panels", {});
  write_seed(dir + "/two_panels.gdnimg", "panels", {{"model.layers.0.mlp.up_proj.weight", 33, 17}, {"lm_head.weight", 2, 3}});
  write_seed(dir + "/amx_tiles.gdnimg", "amx_tiles", {{"model.layers.0.linear_attn.in_proj_a.weight", 6, 48}});
  write_seed(dir + "/q4_k_m.gdnimg", "q4_k",
             {{"model.layers.0.mlp.up_proj.weight", 8, 256, ""},
              {"model.layers.0.mlp.down_proj.weight", 8, 40, "q8_0"},
              {"model.layers.1.mlp.down_proj.weight", 8, 40, "q5_0"}});
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("GDN_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parse = [](const std::vector<std::byte>& bytes, gdn::PackedImageHeader& h) {
    try {
      h = gdn::parse_packed_image_header(bytes, "fuzz.gdnimg");
      return true;
    } catch (const gdn::Error& e) {
      GDN_FUZZ_CHECK(e.status() == gdn::Status::invalid_file);
      return false;
    }
  };
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  gdn::PackedImageHeader h;
  bool ok = parse(bytes, h);
  if (!ok && size >= 20) {
    // The same bytes with the header's CRC recomputed (where the length field puts it).
    std::uint32_t n = 0;
    for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<std::uint32_t>(bytes[12 + static_cast<std::size_t>(i)]);
    if (static_cast<std::uint64_t>(n) + 20 <= size) {
      const auto crc = static_cast<std::uint32_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), 16 + n));
      for (int i = 0; i < 4; ++i) bytes[16 + n + static_cast<std::size_t>(i)] = static_cast<std::byte>((crc >> (8 * i)) & 0xff);
      ok = parse(bytes, h);
    }
  }
  if (!ok) return 0;
  GDN_FUZZ_CHECK(h.file_bytes == size);
  GDN_FUZZ_CHECK(h.data_offset >= 20 && h.data_offset <= size && h.data_offset % gdn::PackedImageHeader::alignment == 0);
  GDN_FUZZ_CHECK(gdn::packed_layout_version(h.layout) == h.layout_version);
  // bf16 in one of the kernels' layouts, or a quantised encoding whose layout it is (q5_0 is only
  // ever a tensor's encoding, never an image's).
  const bool quant = h.weight_encoding != "bf16";
  GDN_FUZZ_CHECK(quant ? h.layout == h.weight_encoding && quantised(h.layout) && h.layout != "q5_0" && h.quant_block == 32
                       : h.quant_block == 0 && !quantised(h.layout));
  std::uint64_t end = h.data_offset;
  for (const auto& t : h.tensors) {
    GDN_FUZZ_CHECK(quant ? quantised(t.encoding) : t.encoding == h.layout);
    GDN_FUZZ_CHECK(t.offset % gdn::PackedImageHeader::alignment == 0 && t.offset >= end);
    GDN_FUZZ_CHECK(t.offset <= size && t.bytes <= size - t.offset);
    GDN_FUZZ_CHECK(t.bytes == gdn::packed_layout_elements(t.encoding, t.rows, t.cols) * 2);
    end = t.offset + t.bytes;
  }
  return 0;
}
