#pragma once
// Little-endian integers and zlib's CRC-32 over any length: the byte-level pieces shared by the
// library's own file headers (state files, packed weight images). Private to src/.

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gdn::detail {

// crc32 continued over n bytes; zlib takes a uInt length, so long ranges go in 1 GiB chunks.
// Start from crc32_initial().
inline std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::uint64_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<std::uint64_t>(n, 1u << 30));
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}
inline std::uint32_t crc32_initial() { return static_cast<std::uint32_t>(crc32(0L, Z_NULL, 0)); }
inline std::uint32_t crc32_of(const void* data, std::uint64_t n) { return crc32_update(crc32_initial(), data, n); }

inline void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint32_t>(p[i]);
  return v;
}

}  // namespace gdn::detail
