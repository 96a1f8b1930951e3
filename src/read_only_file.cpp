#include "read_only_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

namespace gdn::detail {

ReadOnlyFile::ReadOnlyFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(Status::io_error, fmt::format("cannot open '{}': {}", path_, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(Status::io_error, fmt::format("'{}' is not a regular file", path_));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() { ::close(fd_); }

void ReadOnlyFile::read(std::byte* dst, std::uint64_t n, std::uint64_t at) const {
  std::uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(Status::io_error, fmt::format("cannot read '{}': {}", path_, r < 0 ? std::strerror(errno) : "short read"));
    done += static_cast<std::uint64_t>(r);
  }
}

}  // namespace gdn::detail
