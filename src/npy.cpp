#include "gdn/io/npy.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

namespace gdn::io {

void write_npy(const std::string& path, std::span<const float> data, const std::vector<std::int64_t>& shape) {
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) dims += fmt::format("{}{}", shape[i], shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(Status::io_error, fmt::format("cannot write '{}'", tmp));
    const char magic[] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    out.write(magic, 8);
    const auto len = static_cast<std::uint16_t>(header.size());
    const char len_le[] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
    out.write(len_le, 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size_bytes()));
    if (!out.flush()) {
      std::remove(tmp.c_str());
      throw Error(Status::io_error, fmt::format("writing '{}' failed", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error(Status::io_error, fmt::format("cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
  }
}

}  // namespace gdn::io
