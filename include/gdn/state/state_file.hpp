#pragma once
// The on-disk form of one sequence's state (Context::save_sequence / load_sequence).
//
//   "GDNSEQ\0\0"  u32 version  u32 N  N bytes of JSON header  sections...  u32 CRC-32
//
// The JSON header names the model fingerprint, state dtype, lengths and shapes, and lists each
// section (conv, recurrent, kv) with its offset and size. The CRC-32 (zlib) covers every byte
// before it. parse_state_file() validates all of this on untrusted bytes before anything is used.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "gdn/core/dtype.hpp"

namespace gdn {

class Model;

struct StateFileSection {
  std::uint64_t offset = 0;  // from the start of the file
  std::uint64_t bytes = 0;
};

struct StateFileHeader {
  static constexpr std::uint32_t version = 1;
  std::string fingerprint;  // model_fingerprint() of the model that wrote it
  DType state_dtype = DType::f32;
  // The KV dtype of the context that wrote it (the kv section is float32 either way, holding the
  // stored values exactly). Files from before this field read as F32.
  DType kv_dtype = DType::f32;
  std::int64_t length = 0, mtp_length = 0;
  std::int64_t gdn_layers = 0, conv_floats = 0, recurrent_elements = 0;  // per GDN layer
  std::int64_t kv_layers = 0, kv_dim = 0, kv_positions = 0;            // kv_dim = kv heads × head dim
  StateFileSection conv, recurrent, kv;
};

// Identifies a model's numerics: architecture, every shape, and a CRC of the start of the
// embedding and lm_head (cheap, yet two different checkpoints of one shape differ).
std::string model_fingerprint(const Model& model);

// Serialises header + sections; `conv`, `recurrent`, `kv` must have the sizes the header states.
std::string encode_state_file(StateFileHeader header, std::span<const std::byte> conv, std::span<const std::byte> recurrent,
                              std::span<const std::byte> kv);

// Validates magic, version, header fields, section bounds and the checksum. Throws
// gdn::Error(invalid_file) naming the defect.
StateFileHeader parse_state_file(std::span<const std::byte> file, std::string_view what);

}  // namespace gdn
