// Packing a model's projections into the order its projection kernel reads them, at load (see
// cpu::pack_weight_image for why), and ModelWeights::projections().

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "gdn/backend/cpu/linear.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/io/safetensors.hpp"
#include "gdn/model/weights.hpp"

namespace gdn {
namespace {

void add_layer(const DecoderLayerWeights& l, std::vector<const LinearWeight*>& out) {
  for (const LinearWeight* w : {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b, &l.gdn.in_proj_a,
                                &l.gdn.in_proj_qkvz, &l.gdn.in_proj_ba, &l.gdn.out_proj, &l.attn.q_proj, &l.attn.k_proj,
                                &l.attn.v_proj, &l.attn.o_proj, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj})
    if (!w->w.empty()) out.push_back(w);
}

// Drops this process's page-table entries for the whole pages of bytes [lo, hi) when they lie
// inside one of the checkpoint's mappings; the file's pages stay in the page cache. Never applied
// to memory outside the mappings (a realigned copy would be zeroed by MADV_DONTNEED).
void release_mapped_pages(std::uintptr_t lo, std::uintptr_t hi, const io::Checkpoint& ckpt) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t i = 0; i < ckpt.shard_count(); ++i) {
    const auto bytes = ckpt.shard_bytes(i);
    const auto m0 = reinterpret_cast<std::uintptr_t>(bytes.data()), m1 = m0 + bytes.size();
    if (lo < m0 || hi > m1) continue;
    const std::uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    if (a < b) (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
    return;
  }
}

}  // namespace

std::vector<const LinearWeight*> ModelWeights::projections(bool include_mtp) const {
  std::vector<const LinearWeight*> out;
  for (const auto& l : layers) add_layer(l, out);
  out.push_back(&lm_head);
  if (mtp && include_mtp) {
    out.push_back(&mtp->fc);
    add_layer(mtp->layer, out);
  }
  return out;
}

std::vector<LinearWeight*> ModelWeights::projections(bool include_mtp) {
  std::vector<LinearWeight*> out;
  for (const LinearWeight* p : std::as_const(*this).projections(include_mtp)) out.push_back(const_cast<LinearWeight*>(p));
  return out;
}

std::size_t pack_weights_for_cpu(ModelWeights& w, const io::Checkpoint& ckpt,
                                 const std::function<void(std::size_t, std::size_t)>& progress) {
  const cpu::WeightImage layout = cpu::weight_image_layout(cpu::linear_kernel());
  if (layout == cpu::WeightImage::none) return 0;
  std::vector<LinearWeight*> todo;
  std::size_t elements = 0;
  for (LinearWeight* p : w.projections())
    if (p->w.dtype == DType::bf16) {
      todo.push_back(p);
      elements += cpu::weight_image_elements(layout, p->out(), p->in());
    }
  if (todo.empty()) return 0;
  w.packed = AnonymousMemory(elements * sizeof(std::uint16_t));
  auto* base = reinterpret_cast<std::uint16_t*>(w.packed.data());
  std::size_t offset = 0;
  for (LinearWeight* p : todo) {
    p->image = base + offset;
    p->image_layout = layout;
    offset += cpu::weight_image_elements(layout, p->out(), p->in());
  }
  // Copying is bound by reading the checkpoint (page faults, or the disk on a cold cache), so a
  // pool of threads, alive only for the load, splits each tensor by blocks of 32 rows.
  ThreadPool pool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  std::size_t done = 0, total = 0;
  for (LinearWeight* p : todo) total += p->w.nbytes();
  if (progress) progress(0, total);
  for (LinearWeight* p : todo) {
    auto* image = const_cast<std::uint16_t*>(p->image);
    const auto data = reinterpret_cast<std::uintptr_t>(p->w.data);
    const std::int64_t out = p->out(), row_bytes = p->in() * 2;
    // Each range's source pages are let go as soon as it is packed, so the peak is the packed
    // copy plus a few ranges, not plus the largest tensor (a 248k-row lm_head is 0.5 GB at 0.8B).
    // The embedding lookup (a tied lm_head) re-faults the few rows it reads from the page cache.
    pool.parallel_for((out + 31) / 32, 64, [&](std::int64_t b0, std::int64_t b1, int) {
      cpu::pack_weight_image(layout, p->w, b0 * 32, std::min(out, b1 * 32), image);
      const std::int64_t r0 = b0 * 32, r1 = std::min(out, b1 * 32);
      release_mapped_pages(data + static_cast<std::uintptr_t>(r0 * row_bytes), data + static_cast<std::uintptr_t>(r1 * row_bytes), ckpt);
    });
    done += p->w.nbytes();
    if (progress) progress(done, total);
  }
  return elements * sizeof(std::uint16_t);
}

}  // namespace gdn
