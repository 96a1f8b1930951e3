// libFuzzer target: the safetensors header parser (8-byte length, JSON header, data offsets) on
// arbitrary bytes. A defect must come back as gdn::Error(invalid_file); anything else (a crash, a
// sanitizer report, another exception) is a bug. What the parser accepts is checked against the
// promises of include/gdn/io/safetensors.hpp: every tensor lies inside the data section, spans
// exactly numel × dtype bytes, and no two non-empty tensors overlap.

#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_check.hpp"
#include "gdn/core/error.hpp"
#include "gdn/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  gdn::io::SafetensorsHeader h;
  try {
    h = gdn::io::parse_safetensors_header(file, "fuzz.safetensors");
  } catch (const gdn::Error& e) {
    GDN_FUZZ_CHECK(e.status() == gdn::Status::invalid_file);
    return 0;
  }
  GDN_FUZZ_CHECK(h.data_offset >= 8 && h.data_offset <= size);
  const std::uint64_t data_size = size - h.data_offset;
  std::uint64_t covered = 0;  // end of the furthest non-empty tensor so far (tensors are in offset order)
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const auto& t = h.tensors[i];
    GDN_FUZZ_CHECK(t.begin <= t.end && t.end <= data_size);
    GDN_FUZZ_CHECK(t.rank >= 0 && t.rank <= gdn::TensorView::max_rank);
    std::uint64_t bytes = gdn::dtype_size(t.dtype);
    for (int d = 0; d < t.rank; ++d) {
      GDN_FUZZ_CHECK(t.shape[static_cast<std::size_t>(d)] >= 0);
      GDN_FUZZ_CHECK(!__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(t.shape[static_cast<std::size_t>(d)]), &bytes));
    }
    GDN_FUZZ_CHECK(t.end - t.begin == bytes);
    if (i > 0) GDN_FUZZ_CHECK(h.tensors[i - 1].begin <= t.begin);
    if (t.end > t.begin) {
      GDN_FUZZ_CHECK(t.begin >= covered);
      covered = t.end;
    }
  }
  return 0;
}
