#include "gdn/state/state_file.hpp"

#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "gdn/core/error.hpp"
#include "gdn/io/safetensors.hpp"
#include "gdn/model/model.hpp"
#include "binary_io.hpp"

namespace gdn {
namespace {

constexpr char magic[8] = {'G', 'D', 'N', 'S', 'E', 'Q', 0, 0};
constexpr std::uint64_t max_header = 1 << 20;

using detail::crc32_of;
using detail::get_u32;
using detail::put_u32;

[[noreturn]] void bad(std::string_view what, const std::string& why) {
  throw Error(Status::invalid_file, fmt::format("{}: invalid sequence state file: {}", what, why));
}

std::uint32_t crc_of_tensor_prefix(const TensorView& t) {
  return crc32_of(t.data, std::min<std::uint64_t>(t.nbytes(), 65536));
}

}  // namespace

std::string model_fingerprint(const Model& model) {
  const ModelConfig& c = model.config();
  std::string layers;
  for (const auto k : c.layer_types) layers += k == LayerKind::full_attention ? 'F' : 'L';
  const std::string shapes = fmt::format(
      "{}|{}|H{}|I{}|V{}|q{}/{}x{}|r{}|t{}|gdn{}/{}x{}/{}|k{}|mtp{}|tie{}|eps{}", c.architecture, layers, c.hidden_size,
      c.intermediate_size, c.vocab_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim,
      c.rope_theta, c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim,
      c.linear_conv_kernel_dim, model.has_mtp() ? 1 : 0, c.tie_word_embeddings ? 1 : 0, c.rms_norm_eps);
  return fmt::format("{:08x}-{:08x}-{:08x}", crc32_of(shapes.data(), shapes.size()),
                     crc_of_tensor_prefix(model.weights().embed_tokens), crc_of_tensor_prefix(model.weights().lm_head.w));
}

std::string encode_state_file(StateFileHeader h, std::span<const std::byte> conv, std::span<const std::byte> recurrent,
                              std::span<const std::byte> kv) {
  // The header holds the section offsets, which depend on the header's own length: lay the
  // sections out after a header padded to a fixed width.
  nlohmann::json j;
  const auto write_header = [&](std::uint64_t data_start) {
    h.conv = {data_start, conv.size()};
    h.recurrent = {h.conv.offset + h.conv.bytes, recurrent.size()};
    h.kv = {h.recurrent.offset + h.recurrent.bytes, kv.size()};
    j = {{"fingerprint", h.fingerprint},
         {"state_dtype", std::string(dtype_name(h.state_dtype))},
         {"kv_dtype", std::string(dtype_name(h.kv_dtype))},
         {"length", h.length},
         {"mtp_length", h.mtp_length},
         {"gdn_layers", h.gdn_layers},
         {"conv_floats", h.conv_floats},
         {"recurrent_elements", h.recurrent_elements},
         {"kv_layers", h.kv_layers},
         {"kv_dim", h.kv_dim},
         {"kv_positions", h.kv_positions},
         {"sections",
          {{"conv", {h.conv.offset, h.conv.bytes}},
           {"recurrent", {h.recurrent.offset, h.recurrent.bytes}},
           {"kv", {h.kv.offset, h.kv.bytes}}}}};
    return j.dump();
  };
  std::string text = write_header(0);
  const std::size_t padded = (text.size() + 64 + 63) / 64 * 64;  // room for the offsets' digits
  text = write_header(16 + padded);
  text.resize(padded, ' ');
  std::string out(magic, 8);
  put_u32(out, StateFileHeader::version);
  put_u32(out, static_cast<std::uint32_t>(text.size()));
  out += text;
  out.append(reinterpret_cast<const char*>(conv.data()), conv.size());
  out.append(reinterpret_cast<const char*>(recurrent.data()), recurrent.size());
  out.append(reinterpret_cast<const char*>(kv.data()), kv.size());
  put_u32(out, crc32_of(out.data(), out.size()));
  return out;
}

StateFileHeader parse_state_file(std::span<const std::byte> file, std::string_view what) {
  if (file.size() < 20) bad(what, fmt::format("{} bytes is too short", file.size()));
  if (std::memcmp(file.data(), magic, 8) != 0) bad(what, "wrong magic (not a libgdn sequence state)");
  const std::uint32_t version = get_u32(file.data() + 8);
  if (version != StateFileHeader::version)
    bad(what, fmt::format("format version {} is not the supported {}", version, StateFileHeader::version));
  const std::uint64_t n = get_u32(file.data() + 12);
  if (n > max_header || 16 + n + 4 > file.size()) bad(what, fmt::format("header length {} is out of range", n));
  const std::uint64_t body = file.size() - 4;
  const std::uint32_t stored = get_u32(file.data() + body);
  if (crc32_of(file.data(), body) != stored) bad(what, "checksum mismatch (corrupted or truncated)");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(reinterpret_cast<const char*>(file.data() + 16), reinterpret_cast<const char*>(file.data() + 16 + n));
  } catch (const nlohmann::json::exception& e) {
    bad(what, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!j.is_object()) bad(what, "header is not an object");
  StateFileHeader h;
  const auto integer = [&](const char* key) -> std::int64_t {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 0)
      bad(what, fmt::format("header field '{}' must be a non-negative integer", key));
    return j[key].get<std::int64_t>();
  };
  if (!j.contains("fingerprint") || !j["fingerprint"].is_string()) bad(what, "header field 'fingerprint' is missing");
  h.fingerprint = j["fingerprint"].get<std::string>();
  if (!j.contains("state_dtype") || !j["state_dtype"].is_string()) bad(what, "header field 'state_dtype' is missing");
  const std::string dt = j["state_dtype"].get<std::string>();
  if (dt == "F32") h.state_dtype = DType::f32;
  else if (dt == "BF16") h.state_dtype = DType::bf16;
  else bad(what, fmt::format("state_dtype '{}' is not F32 or BF16", dt));
  if (j.contains("kv_dtype")) {
    if (!j["kv_dtype"].is_string()) bad(what, "header field 'kv_dtype' is not a string");
    const std::string kd = j["kv_dtype"].get<std::string>();
    if (kd == "F32") h.kv_dtype = DType::f32;
    else if (kd == "BF16") h.kv_dtype = DType::bf16;
    else bad(what, fmt::format("kv_dtype '{}' is not F32 or BF16", kd));
  }
  h.length = integer("length");
  h.mtp_length = integer("mtp_length");
  h.gdn_layers = integer("gdn_layers");
  h.conv_floats = integer("conv_floats");
  h.recurrent_elements = integer("recurrent_elements");
  h.kv_layers = integer("kv_layers");
  h.kv_dim = integer("kv_dim");
  h.kv_positions = integer("kv_positions");
  if (!j.contains("sections") || !j["sections"].is_object()) bad(what, "header has no 'sections' object");
  const auto section = [&](const char* name, StateFileSection& out) {
    const auto& s = j["sections"];
    if (!s.contains(name) || !s[name].is_array() || s[name].size() != 2 || !s[name][0].is_number_unsigned() ||
        !s[name][1].is_number_unsigned())
      bad(what, fmt::format("section '{}' must be [offset, bytes]", name));
    out.offset = s[name][0].get<std::uint64_t>();
    out.bytes = s[name][1].get<std::uint64_t>();
    if (out.offset < 16 + n || out.offset > body || out.bytes > body - out.offset)
      bad(what, fmt::format("section '{}' [{}, +{}) lies outside the data", name, out.offset, out.bytes));
  };
  section("conv", h.conv);
  section("recurrent", h.recurrent);
  section("kv", h.kv);
  // Sizes must agree with the shapes, without overflow.
  const auto product = [&](std::initializer_list<std::int64_t> xs, const char* name) {
    std::uint64_t v = 1;
    for (const auto x : xs)
      if (__builtin_mul_overflow(v, static_cast<std::uint64_t>(x), &v)) bad(what, fmt::format("size of '{}' overflows", name));
    return v;
  };
  if (h.conv.bytes != product({h.gdn_layers, h.conv_floats, 4}, "conv"))
    bad(what, "conv section size does not match gdn_layers × conv_floats");
  if (h.recurrent.bytes != product({h.gdn_layers, h.recurrent_elements, static_cast<std::int64_t>(dtype_size(h.state_dtype))}, "recurrent"))
    bad(what, "recurrent section size does not match gdn_layers × recurrent_elements × dtype");
  if (h.kv.bytes != product({h.kv_layers, 2, h.kv_positions, h.kv_dim, 4}, "kv"))
    bad(what, "kv section size does not match kv_layers × 2 × kv_positions × kv_dim");
  // Exactly what save_sequence writes: a larger value would make load_sequence take KV pages (and
  // grow the page table) past what the sequence's length accounts for.
  if (h.kv_positions != std::max(h.length, h.mtp_length))
    bad(what, fmt::format("kv_positions {} is not the sequence's length max(length {}, mtp_length {})", h.kv_positions,
                          h.length, h.mtp_length));
  return h;
}

}  // namespace gdn
