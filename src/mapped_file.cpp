#include "gdn/io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

namespace gdn::io {

MappedFile::MappedFile(const std::string& path, bool huge_pages) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(Status::io_error, fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(Status::io_error, fmt::format("'{}' is not a regular file", path));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  constexpr std::size_t huge = std::size_t{2} << 20;
  void* at = nullptr;
  if (huge_pages && size_ >= huge) {
    // Reserve an aligned range, then map the file over its aligned part (MAP_FIXED replaces the
    // reservation) and give the slack back.
    void* r = ::mmap(nullptr, size_ + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r != MAP_FAILED) {
      const auto base = reinterpret_cast<std::uintptr_t>(r);
      const std::uintptr_t aligned = (base + huge - 1) / huge * huge;
      if (aligned > base) ::munmap(r, aligned - base);
      const std::uintptr_t end = base + size_ + huge, used = (aligned + size_ + 4095) / 4096 * 4096;
      if (end > used) ::munmap(reinterpret_cast<void*>(used), end - used);
      at = reinterpret_cast<void*>(aligned);
    }
  }
  if (size_ > 0) {
    void* p = ::mmap(at, size_, PROT_READ, MAP_PRIVATE | (at != nullptr ? MAP_FIXED : 0), fd, 0);
    if (p == MAP_FAILED && at != nullptr) ::munmap(at, size_);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(Status::io_error, fmt::format("cannot map '{}': {}", path, std::strerror(err)));
    }
    data_ = static_cast<const std::byte*>(p);
    if (huge_pages) (void)::madvise(p, size_, MADV_HUGEPAGE);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace gdn::io
