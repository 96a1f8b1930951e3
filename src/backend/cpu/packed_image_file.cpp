// Writing a packed weight image (gdn/model/packed_image.hpp): the checkpoint read in place, each
// bf16 projection packed by the kernel's own packing code straight into a shared mapping of the
// output file, blocks of all-zero weights left as holes (a sparse test checkpoint gives a sparse
// image), then the header, a flush and an atomic rename.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/io/safetensors.hpp"
#include "gdn/model/model.hpp"
#include "gdn/model/packed_image.hpp"

#include "../../model_internals.hpp"
#include "prepared_weights.hpp"

namespace gdn {
namespace {

// Whether n bytes at p are all zero (a test checkpoint's holes; real weights stop at the first word).
bool all_zero(const std::byte* p, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v;
    std::memcpy(&v, p + i, 8);
    if (v != 0) return false;
  }
  for (; i < n; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

cpu::WeightImage layout_named(const std::string& name) {
  if (name == "panels") return cpu::WeightImage::panels;
  if (name == "amx_tiles") return cpu::WeightImage::amx_tiles;
  if (name == "q8_0") return cpu::WeightImage::q8_0;
  if (name == "q4_0") return cpu::WeightImage::q4_0;
  if (name == "q4_k") return cpu::WeightImage::q4_k;
  throw Error(Status::invalid_argument, fmt::format("packed image layout '{}' is not panels, amx_tiles, q8_0, q4_0 or q4_k", name));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string default_packed_image_path(const std::string& model_dir) {
  const cpu::WeightImage layout = cpu::weight_image_layout(cpu::linear_kernel());
  if (layout == cpu::WeightImage::none) return {};
  return (std::filesystem::path(model_dir) / fmt::format("gdn-packed.{}.gdnimg", cpu::weight_image_name(layout))).string();
}

std::string default_packed_image_path(const std::string& model_dir, WeightQuant quant, LmHeadQuant lm_head) {
  const WeightQuant lm = lm_head_weight_quant(quant, lm_head);
  if (quant == WeightQuant::none) return default_packed_image_path(model_dir);
  // The automatic lm_head format keeps the name images had before the lm_head had its own format.
  const std::string policy =
      lm == lm_head_weight_quant(quant, LmHeadQuant::automatic) ? std::string() : fmt::format(".lm_head-{}", weight_quant_name(lm));
  return (std::filesystem::path(model_dir) / fmt::format("gdn-packed.{}{}.gdnimg", weight_quant_name(quant), policy)).string();
}

PackImageResult write_packed_image(const std::string& model_dir, const PackImageOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  ModelParams quant_params;
  quant_params.quant = options.quant;
  quant_params.lm_head_quant = options.lm_head_quant;
  const cpu::WeightImage layout = options.layout.empty() ? cpu::load_layout(quant_params) : layout_named(options.layout);
  if (options.quant != WeightQuant::none && layout != cpu::load_layout(quant_params))
    throw Error(Status::invalid_argument, fmt::format("--layout {} does not go with --quant {}", options.layout, weight_quant_name(options.quant)));
  // --layout q8_0 / q4_0 / q4_k alone is that quant.
  if (quant_params.quant == WeightQuant::none) {
    if (layout == cpu::WeightImage::q8_0) quant_params.quant = WeightQuant::q8_0;
    if (layout == cpu::WeightImage::q4_0) quant_params.quant = WeightQuant::q4_0;
    if (layout == cpu::WeightImage::q4_k) quant_params.quant = WeightQuant::q4_k;
  }
  // A bf16 image has one layout; a quantised one the policy's lm_head format. (load_layouts throws
  // for an lm_head format without a quant.)
  const cpu::ImageLayouts quant_layouts = cpu::load_layouts(quant_params);
  const cpu::ImageLayouts layouts = cpu::is_quantized(layout) ? quant_layouts : cpu::ImageLayouts{layout, layout};
  if (layout == cpu::WeightImage::none)
    throw Error(Status::unsupported_model,
                fmt::format("this CPU's projection kernel ({}) reads the weights in place; there is no packed image to write "
                            "(--layout panels or amx_tiles writes one for another machine)",
                            cpu::linear_kernel_name()));
  ModelParams mp;
  mp.weights = WeightPlacement::in_place;
  const auto model = Model::load(model_dir, mp);
  const auto prepared = cpu::prepare_weights(*model);
  const io::Checkpoint& ckpt = detail::ModelInternals::checkpoint(*model);
  const std::vector<std::string> names = cpu::projection_names(*prepared, ckpt);

  PackedImageHeader h;
  h.layout = cpu::weight_image_name(layout);
  h.layout_version = packed_layout_version(h.layout);
  if (cpu::is_quantized(layout)) {
    h.weight_encoding = h.layout;
    h.quant_block = 32;
  }
  h.writer = "libgdn 0.1.0";
  std::vector<const cpu::Linear*> todo;
  std::vector<cpu::WeightImage> todo_layouts;
  std::vector<std::string> todo_names;
  std::size_t k = 0;
  for (const cpu::Linear* p : prepared->projections()) {
    const std::string& name = names[k++];
    if (p->w->dtype != DType::bf16) continue;
    if (name.empty())
      throw Error(Status::unsupported_model,
                  fmt::format("{}: a projection's data is not aligned in its file (libgdn reads a copy), so an image cannot "
                              "name it",
                              model_dir));
    const cpu::WeightImage tl = cpu::layout_of(*prepared, p, layouts);
    todo.push_back(p);
    todo_layouts.push_back(tl);
    todo_names.push_back(name);
    h.tensors.push_back(
        {name, p->out(), p->in(), 0, cpu::weight_image_elements(tl, p->out(), p->in()) * 2, cpu::weight_image_name(tl)});
  }
  if (todo.empty()) throw Error(Status::unsupported_model, fmt::format("{}: the model has no bf16 projections to pack", model_dir));
  h.fingerprint = checkpoint_fingerprint(ckpt, todo_names);
  const std::string header = encode_packed_image_header(h);

  PackImageResult result;
  result.path = !options.out.empty()          ? options.out
                : cpu::is_quantized(layout) ? default_packed_image_path(model_dir, quant_params.quant, options.lm_head_quant)
                                            : default_packed_image_path(model_dir);
  if (result.path.empty())
    result.path = (std::filesystem::path(model_dir) / fmt::format("gdn-packed.{}.gdnimg", h.layout)).string();
  result.layout = h.layout;
  result.file_bytes = h.file_bytes;
  result.tensors = todo.size();
  for (const auto& t : h.tensors) {
    auto it = std::find_if(result.encodings.begin(), result.encodings.end(), [&](const auto& e) { return e.first == t.encoding; });
    if (it == result.encodings.end()) result.encodings.emplace_back(t.encoding, 1);
    else ++it->second;
  }
  const std::string tmp = result.path + ".tmp." + std::to_string(::getpid());
  Fd fd{::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (fd.fd < 0) throw Error(Status::io_error, fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
  struct Cleanup {
    const std::string& path;
    bool keep = false;
    ~Cleanup() {
      if (!keep) std::remove(path.c_str());
    }
  } cleanup{tmp};
  if (::ftruncate(fd.fd, static_cast<off_t>(h.file_bytes)) != 0)
    throw Error(Status::io_error, fmt::format("cannot size '{}' to {} bytes: {}", tmp, h.file_bytes, std::strerror(errno)));
  void* map = ::mmap(nullptr, h.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (map == MAP_FAILED) throw Error(Status::io_error, fmt::format("cannot map '{}': {}", tmp, std::strerror(errno)));
  struct Unmap {
    void* p;
    std::size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, h.file_bytes};
  auto* out = static_cast<std::byte*>(map);

  ThreadPool pool(options.threads > 0 ? options.threads
                                      : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  std::size_t total = 0, done = 0;
  for (const auto* p : todo) total += p->w->nbytes();
  if (options.progress) options.progress(0, total);
  std::atomic<std::uint64_t> written{0};
  // The checkpoint's pages of a tensor once packed (its mapping is read-only: they are read again
  // from the page cache or the file if anything needs them).
  const auto release = [&](std::uintptr_t at, std::size_t n) {
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    for (std::size_t s = 0; s < ckpt.shard_count(); ++s) {
      const auto bytes = ckpt.shard_bytes(s);
      const auto m0 = reinterpret_cast<std::uintptr_t>(bytes.data()), m1 = m0 + bytes.size();
      if (at < m0 || at + n > m1) continue;
      const std::uintptr_t a = (at + page - 1) / page * page, b = (at + n) / page * page;
      if (a < b) (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
      return;
    }
  };
  for (std::size_t i = 0; i < todo.size(); ++i) {
    const cpu::Linear& p = *todo[i];
    auto* image = reinterpret_cast<std::uint16_t*>(out + h.tensors[i].offset);
    const std::int64_t rows = p.out(), row_bytes = p.in() * 2;
    const std::uint64_t block_bytes = h.tensors[i].bytes / static_cast<std::uint64_t>((rows + 31) / 32);
    pool.parallel_for((rows + 31) / 32, 16, [&](std::int64_t b0, std::int64_t b1, int) {
      for (std::int64_t b = b0; b < b1; ++b) {
        const std::int64_t r0 = b * 32, r1 = std::min(rows, r0 + 32);
        // A block of zero weights packs to zeros (quantised: scales 0, so every value is 0 whatever
        // its integers, as in the file's hole): leave the hole.
        if (all_zero(p.w->data + r0 * row_bytes, static_cast<std::size_t>((r1 - r0) * row_bytes))) continue;
        cpu::pack_weight_image(todo_layouts[i], *p.w, r0, r1, image);
        written += block_bytes;
      }
    });
    // Drop this process's mappings of what was just read and written: the written pages stay in the
    // page cache (dirty until written back), so the peak is a tensor, not the image.
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto lo = (reinterpret_cast<std::uintptr_t>(image) + page - 1) / page * page;
    const auto hi = (reinterpret_cast<std::uintptr_t>(image) + h.tensors[i].bytes) / page * page;
    if (lo < hi) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    release(reinterpret_cast<std::uintptr_t>(p.w->data), p.w->nbytes());
    done += p.w->nbytes();
    if (options.progress) options.progress(done, total);
  }
  std::memcpy(out, header.data(), header.size());
  if (::msync(map, h.file_bytes, MS_SYNC) != 0 || ::fsync(fd.fd) != 0)
    throw Error(Status::io_error, fmt::format("cannot write '{}': {}", tmp, std::strerror(errno)));
  if (std::rename(tmp.c_str(), result.path.c_str()) != 0)
    throw Error(Status::io_error, fmt::format("cannot rename '{}' to '{}': {}", tmp, result.path, std::strerror(errno)));
  cleanup.keep = true;
  const std::string dir = std::filesystem::path(result.path).parent_path().string();
  Fd dfd{::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dfd.fd >= 0) (void)::fsync(dfd.fd);
  result.written_bytes = written.load() + header.size();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace gdn
