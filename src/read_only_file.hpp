#pragma once
// A regular file opened for positioned reads: what the header readers (safetensors, packed
// weight images) and the checkpoint fingerprint share. Private to src/.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gdn::detail {

class ReadOnlyFile {
 public:
  // Throws io_error naming the path when it cannot be opened or is not a regular file.
  explicit ReadOnlyFile(std::string path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::uint64_t size() const noexcept { return size_; }

  // Exactly n bytes at offset `at` (retrying short reads and EINTR); io_error on a short file.
  void read(std::byte* dst, std::uint64_t n, std::uint64_t at) const;

  // The bytes a header parser needs: the first `prefix` bytes (fewer when the file is shorter),
  // extended to `total(prefix bytes)` bytes when that is larger and fits in the file. `total`
  // returns 0 for an implausible length, which the parser then refuses with its own message:
  // nothing is allocated from an untrusted length beyond the file's size and the caller's limit.
  template <class Total>
  std::vector<std::byte> head(std::uint64_t prefix, Total total) const {
    std::vector<std::byte> out(static_cast<std::size_t>(prefix < size_ ? prefix : size_));
    read(out.data(), out.size(), 0);
    if (out.size() == prefix) {
      const std::uint64_t n = total(std::span<const std::byte>(out));
      if (n > prefix && n <= size_) {
        out.resize(static_cast<std::size_t>(n));
        read(out.data() + prefix, n - prefix, prefix);
      }
    }
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace gdn::detail
