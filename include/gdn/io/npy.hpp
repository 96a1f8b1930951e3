#pragma once
// Writes float32 arrays as NumPy .npy files (format 1.0), so external checks can np.load() what
// the CLI prints. The file appears atomically: written to a temporary name, then renamed.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gdn::io {

void write_npy(const std::string& path, std::span<const float> data, const std::vector<std::int64_t>& shape);

}  // namespace gdn::io
