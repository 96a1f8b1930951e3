#pragma once
// A read-only memory mapping of a whole file. Weights are used in place from the mapping, so
// loading a model costs page-table entries, not copies, and untouched tensors (vision towers,
// say) are never read from disk.

#include <cstddef>
#include <span>
#include <string>

namespace gdn::io {

class MappedFile {
 public:
  // Throws gdn::Error(io_error) naming the path when the file cannot be opened or mapped.
  // huge_pages: place the mapping at a 2 MiB-aligned address and ask for transparent huge pages
  // (MADV_HUGEPAGE), so a kernel whose page cache holds the file in large folios can map them with
  // 2 MiB entries: a sequential sweep over gigabytes then misses the TLB every 2 MiB, not every
  // 4 KiB. Best effort; the mapping is the same either way.
  explicit MappedFile(const std::string& path, bool huge_pages = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gdn::io
