#pragma once
// The packed weight image: a checkpoint's bf16 projections in the order the CPU projection kernel
// reads them (AVX-512 panels or AMX tiles), written once by `gdn pack` (write_packed_image) and
// memory-mapped by every later load (WeightPlacement::image): no anonymous copy, no pass over the
// checkpoint at load, one copy in the page cache shared by every process that maps it.
//
// File layout (little-endian):
//   "GDNPACK\0"  u32 format version  u32 N  N bytes of JSON  u32 CRC-32 of everything before it
//   zero padding to data_offset, then each tensor's image at its offset (4096-aligned)
// The JSON names the weight encoding ("bf16", "q8_0", "q4_0" or "q4_k", in blocks of quant_block), the
// kernel layout and its version, the checkpoint's fingerprint, the file's size, and every tensor
// with its shape, offset, byte count and encoding. A quantised image's tensors may differ in
// encoding (the lm_head at q8_0 in a q4_0 image, ModelParams::lm_head_quant; q4_k_m's q8_0 and q5_0
// tensors in its q4_k image); the loader refuses a
// tensor whose encoding is not the one it asked for. An image written before tensors had an
// encoding has its header's for every tensor.
//
// The CRC covers the header only: a image's data is as large as the weights, and checking it would
// cost the pass over it that mapping avoids. What the header does guarantee is that the image is
// read exactly as written: a stale image (the checkpoint's headers, sizes or sampled data changed),
// a foreign one (another checkpoint, another kernel layout or layout version, an encoding this
// libgdn does not know), a truncated one (shorter than its header says) or a corrupt header is
// refused with a message naming which, and the loader falls back to the checkpoint.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gdn/model/model.hpp"

namespace gdn {

namespace io { class Checkpoint; }

struct PackedImageTensor {
  std::string name;        // the checkpoint tensor it holds (lm_head of a tied model: the embedding)
  std::int64_t rows = 0;   // out
  std::int64_t cols = 0;   // in
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  // Its layout: the header's for a bf16 image; "q8_0", "q5_0", "q4_0" or "q4_k" in a quantised one
  // (the lm_head's, and q4_k_m's, may differ from the header's).
  std::string encoding;
};

struct PackedImageHeader {
  static constexpr std::uint32_t format_version = 1;
  static constexpr std::uint64_t alignment = 4096;  // of data_offset and of every tensor's offset
  std::string weight_encoding = "bf16";  // "bf16" (the checkpoint's values), "q8_0", "q4_0", "q4_k" (the projections')
  std::int64_t quant_block = 0;          // elements per quantisation block (0 for bf16)
  std::string layout;                    // "panels" (AVX-512), "amx_tiles" (AMX), or the quantised encoding
  std::int64_t layout_version = 0;
  std::string fingerprint;               // checkpoint_fingerprint() of the checkpoint it was packed from
  std::string writer;                    // the libgdn that wrote it (informational)
  std::uint64_t file_bytes = 0;          // the whole file
  std::uint64_t data_offset = 0;
  std::vector<PackedImageTensor> tensors;
};

// The header's bytes (up to data_offset, padding included); fills data_offset, the tensors' offsets
// (in order, aligned) and file_bytes from the tensors' byte counts.
std::string encode_packed_image_header(PackedImageHeader& header);

// Validates magic, version, the header's length and CRC, every field, the layout, each tensor's
// byte count against its shape, ranges inside the file, alignment and overlaps, and the file's
// size (`file` is the whole file, e.g. its mapping). Throws gdn::Error(invalid_file) naming the
// defect. It does not check that the image fits a checkpoint (see the loader).
PackedImageHeader parse_packed_image_header(std::span<const std::byte> file, std::string_view what);
// The same from the file's first bytes (at least through the header's CRC) and its size.
PackedImageHeader parse_packed_image_header(std::span<const std::byte> head, std::uint64_t file_size, std::string_view what);
// Reads and validates the header of the image at `path` (the data is neither mapped nor read).
PackedImageHeader read_packed_image_header(const std::string& path);

// uint16 elements of a [rows, cols] bf16 weight's image in `layout` (0 for an unknown layout).
std::uint64_t packed_layout_elements(std::string_view layout, std::int64_t rows, std::int64_t cols) noexcept;
// The version of a layout's element order this libgdn reads (0: unknown layout).
std::int64_t packed_layout_version(std::string_view layout) noexcept;

// Identifies the checkpoint an image was packed from: a CRC-32 of every shard's name, size and
// safetensors header, and one of 4 KiB at the start, middle and end of each of `tensors` (cheap at
// every load; a checkpoint rewritten with other values, shapes or files differs).
std::string checkpoint_fingerprint(const io::Checkpoint& ckpt, std::span<const std::string> tensors);
// The same read from the files of the checkpoint directory `dir` (a few small reads; nothing mapped).
std::string checkpoint_fingerprint(const std::string& dir, std::span<const std::string> tensors);

// Where `gdn pack DIR` writes the image for this process's projection kernel, and where loading
// looks for it: DIR/gdn-packed.<layout>.gdnimg. Empty when the kernel reads weights in place.
std::string default_packed_image_path(const std::string& model_dir);
// The image of the checkpoint quantised as `quant` (read by every CPU kernel), with the lm_head in
// the format lm_head gives: DIR/gdn-packed.<quant>.gdnimg for the automatic format (q8_0 under
// q4_0), DIR/gdn-packed.<quant>.lm_head-<format>.gdnimg for another (e.g. every projection at q4_0:
// gdn-packed.q4_0.lm_head-q4_0.gdnimg), so each policy has its own file; none: the one above.
std::string default_packed_image_path(const std::string& model_dir, WeightQuant quant,
                                      LmHeadQuant lm_head = LmHeadQuant::automatic);

struct PackImageOptions {
  std::string out;          // empty: default_packed_image_path(model_dir, quant, lm_head_quant)
  std::string layout;       // empty: this process's kernel's ("panels" or "amx_tiles"), or the quant's
  WeightQuant quant = WeightQuant::none;  // q8_0 / q4_0: the quantised image (layout and encoding "q8_0" / "q4_0")
  LmHeadQuant lm_head_quant = LmHeadQuant::automatic;  // the lm_head's format under quant (ModelParams::lm_head_quant)
  int threads = 0;          // 0: up to 8, one per hardware thread
  std::function<void(std::size_t, std::size_t)> progress;  // (done, total) bytes of weights
};

struct PackImageResult {
  std::string path;
  std::string layout;
  std::uint64_t file_bytes = 0;      // the image's size
  std::uint64_t written_bytes = 0;   // bytes of blocks written (blocks of all-zero weights are left as holes)
  std::size_t tensors = 0;
  // Tensors per encoding, in the order each first appears (one entry unless the policy mixes them:
  // a quantised lm_head's own format, q4_k_m's q8_0 and q5_0 tensors).
  std::vector<std::pair<std::string, std::size_t>> encodings;
  double seconds = 0.0;
};

// Writes the packed image of the checkpoint in `model_dir` (reads it in place; the file is written
// to a temporary name, flushed, then renamed, so a crash leaves no half-written image under the
// final name). Throws gdn::Error (unsupported_model when the layout is none, io_error on a write
// failure, the load's errors for a bad checkpoint).
PackImageResult write_packed_image(const std::string& model_dir, const PackImageOptions& options = {});

}  // namespace gdn
