// Exact state control: snapshots (GDN state copied, KV pages shared copy-on-write), forks, MTP
// truncation, and saving a sequence to a file.

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <fcntl.h>

#include "context_impl.hpp"
#include "gdn/io/mapped_file.hpp"
#include "gdn/state/state_file.hpp"

namespace gdn {
namespace {

using Impl = Context::Impl;

std::int64_t recurrent_bytes(const GdnStatePool& pool) {
  return pool.recurrent_elements() * static_cast<std::int64_t>(dtype_size(pool.state_dtype()));
}

// Copies slot `s`'s GDN state out to / in from flat buffers covering all GDN layers.
void save_gdn(GdnStatePool& pool, int s, std::vector<float>& conv, std::vector<std::byte>& rec, int layers) {
  conv.resize(static_cast<std::size_t>(layers * pool.conv_floats()));
  rec.resize(static_cast<std::size_t>(layers * recurrent_bytes(pool)));
  if (layers == 0) return;
  std::copy_n(pool.conv(s, 0), conv.size(), conv.data());
  std::copy_n(pool.recurrent(s, 0), rec.size(), rec.data());
}

void load_gdn(GdnStatePool& pool, int s, const float* conv, const std::byte* rec, int layers) {
  if (layers == 0) return;
  std::copy_n(conv, layers * pool.conv_floats(), pool.conv(s, 0));
  std::copy_n(rec, layers * recurrent_bytes(pool), pool.recurrent(s, 0));
}

int gdn_layers(const ModelConfig& c) { return c.count_layers(LayerKind::linear_attention); }

}  // namespace

Impl::Snapshot& Impl::snapshot_for(SnapshotId id, const char* what) {
  const int i = handle_index(id);
  if (i < 0 || i >= static_cast<int>(snapshots.size()) || !snapshots[static_cast<std::size_t>(i)].live ||
      snapshots[static_cast<std::size_t>(i)].generation != handle_generation(id))
    throw Error(Status::invalid_argument, fmt::format("{}: snapshot id {:#x} is not a live snapshot of this context", what, id));
  return snapshots[static_cast<std::size_t>(i)];
}

SnapshotId Context::snapshot(SeqId seq) {
  Impl& m = *impl_;
  const auto& sl = m.slot_for(seq, "snapshot");
  const int s = handle_index(seq);
  std::size_t i = 0;
  while (i < m.snapshots.size() && m.snapshots[i].live) ++i;
  if (i == m.snapshots.size()) m.snapshots.emplace_back();
  Impl::Snapshot& snap = m.snapshots[i];
  snap.live = true;
  snap.length = sl.length;
  snap.mtp_length = sl.mtp_length;
  save_gdn(m.gdn_state, s, snap.conv, snap.recurrent, gdn_layers(m.c));
  snap.pages = m.page_tables[static_cast<std::size_t>(s)];
  for (const auto page : snap.pages) m.kv.retain(page);
  return make_handle(static_cast<int>(i), snap.generation);
}

void Context::free_snapshot(SnapshotId id) {
  Impl& m = *impl_;
  Impl::Snapshot& snap = m.snapshot_for(id, "free_snapshot");
  for (const auto page : snap.pages) m.kv.release(page);
  snap.pages.clear();
  snap.live = false;
  ++snap.generation;
}

void Context::restore(SeqId seq, SnapshotId id) {
  Impl& m = *impl_;
  auto& sl = m.slot_for(seq, "restore");
  const Impl::Snapshot& snap = m.snapshot_for(id, "restore");
  const int s = handle_index(seq);
  // Retain first: restoring a sequence from a snapshot of itself must not free shared pages.
  for (const auto page : snap.pages) m.kv.retain(page);
  m.release_pages(s);
  m.page_tables[static_cast<std::size_t>(s)] = snap.pages;  // capacity was reserved up front
  load_gdn(m.gdn_state, s, snap.conv.data(), snap.recurrent.data(), gdn_layers(m.c));
  sl.length = snap.length;
  sl.mtp_length = snap.mtp_length;
  sl.log_start = sl.log_tokens = 0;
}

SeqId Context::create_sequence_from(SnapshotId id) {
  impl_->snapshot_for(id, "create_sequence_from");
  const SeqId seq = create_sequence();
  restore(seq, id);
  return seq;
}

SeqId Context::fork_sequence(SeqId src) {
  Impl& m = *impl_;
  const auto& from = m.slot_for(src, "fork_sequence");
  const int s_from = handle_index(src);
  const int s = m.acquire_slot("fork_sequence");
  auto& sl = m.slots[static_cast<std::size_t>(s)];
  sl.length = from.length;
  sl.mtp_length = from.mtp_length;
  const int layers = gdn_layers(m.c);
  if (layers > 0) {
    std::copy_n(m.gdn_state.conv(s_from, 0), layers * m.gdn_state.conv_floats(), m.gdn_state.conv(s, 0));
    std::copy_n(m.gdn_state.recurrent(s_from, 0), layers * recurrent_bytes(m.gdn_state), m.gdn_state.recurrent(s, 0));
  }
  m.page_tables[static_cast<std::size_t>(s)] = m.page_tables[static_cast<std::size_t>(s_from)];
  for (const auto page : m.page_tables[static_cast<std::size_t>(s)]) m.kv.retain(page);
  return make_handle(s, sl.generation);
}

void Context::truncate_mtp(SeqId seq, std::int64_t mtp_length) {
  Impl& m = *impl_;
  auto& sl = m.slot_for(seq, "truncate_mtp");
  if (mtp_length < 0 || mtp_length > sl.mtp_length)
    throw Error(Status::invalid_argument,
                fmt::format("truncate_mtp: length {} is outside [0, {}]", mtp_length, sl.mtp_length));
  sl.mtp_length = mtp_length;
  m.release_pages_from(handle_index(seq), ceil_div(m.covered_positions(sl), m.p.kv_page_size));
}

void Context::save_sequence(SeqId seq, const std::string& path) const {
  Impl& m = *impl_;
  const auto& sl = m.slot_for(seq, "save_sequence");
  const int s = handle_index(seq);
  StateFileHeader h;
  h.fingerprint = model_fingerprint(*m.model);
  h.state_dtype = m.gdn_state.state_dtype();
  h.length = sl.length;
  h.mtp_length = sl.mtp_length;
  h.gdn_layers = gdn_layers(m.c);
  h.conv_floats = m.gdn_state.conv_floats();
  h.recurrent_elements = m.gdn_state.recurrent_elements();
  const int kv_layers = m.kv.capacity() > 0 ? m.c.count_layers(LayerKind::full_attention) + (m.mtp_kv_layer >= 0 ? 1 : 0) : 0;
  h.kv_layers = kv_layers;
  h.kv_dim = m.c.attn_kv_dim();
  h.kv_positions = m.covered_positions(sl);
  std::vector<float> conv;
  std::vector<std::byte> rec;
  save_gdn(m.gdn_state, s, conv, rec, static_cast<int>(h.gdn_layers));
  // KV laid out [layer][key|value][position][kv_head][head_dim], independent of the page size.
  const int hd = m.c.head_dim, Hkv = m.c.num_key_value_heads, ps = m.p.kv_page_size;
  std::vector<float> kv(static_cast<std::size_t>(kv_layers * 2 * h.kv_positions * h.kv_dim));
  const auto& table = m.page_tables[static_cast<std::size_t>(s)];
  for (int l = 0; l < kv_layers; ++l)
    for (int which = 0; which < 2; ++which)
      for (std::int64_t pos = 0; pos < h.kv_positions; ++pos)
        for (int g = 0; g < Hkv; ++g) {
          const std::int32_t page = table[static_cast<std::size_t>(pos / ps)];
          const float* src = (which == 0 ? m.kv.keys(page, l, g) : m.kv.values(page, l, g)) + (pos % ps) * hd;
          std::copy_n(src, hd, kv.data() + (((static_cast<std::int64_t>(l) * 2 + which) * h.kv_positions + pos) * Hkv + g) * hd);
        }
  const std::string bytes = encode_state_file(h, std::as_bytes(std::span(conv)), rec, std::as_bytes(std::span(kv)));
  // Atomic: write a temporary file in the same directory, flush it to disk, then rename.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(Status::io_error, fmt::format("save_sequence: cannot create '{}'", tmp));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) break;
    done += static_cast<std::size_t>(w);
  }
  const bool ok = done == bytes.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(Status::io_error, fmt::format("save_sequence: writing '{}' failed", path));
  }
}

SeqId Context::load_sequence(const std::string& path) {
  Impl& m = *impl_;
  const io::MappedFile file(path);
  const StateFileHeader h = parse_state_file(file.bytes(), path);
  // Compatibility with this model and context, before any state is touched.
  const auto mismatch = [&](const std::string& why) {
    throw Error(Status::invalid_argument, fmt::format("load_sequence: '{}' does not fit this context: {}", path, why));
  };
  if (h.fingerprint != model_fingerprint(*m.model)) mismatch("it was saved from a different model");
  if (h.state_dtype != m.gdn_state.state_dtype())
    mismatch(fmt::format("its state dtype is {}, the context's is {}", dtype_name(h.state_dtype), dtype_name(m.gdn_state.state_dtype())));
  const int kv_layers = m.kv.capacity() > 0 ? m.c.count_layers(LayerKind::full_attention) + (m.mtp_kv_layer >= 0 ? 1 : 0) : 0;
  if (h.gdn_layers != gdn_layers(m.c) || h.conv_floats != m.gdn_state.conv_floats() ||
      h.recurrent_elements != m.gdn_state.recurrent_elements() || h.kv_layers != kv_layers || h.kv_dim != m.c.attn_kv_dim())
    mismatch("its shapes differ");
  if (std::max(h.length, h.mtp_length) > m.p.max_context)
    throw Error(Status::context_overflow, fmt::format("load_sequence: '{}' holds {} positions; max_context is {}", path,
                                                      std::max(h.length, h.mtp_length), m.p.max_context));
  const std::int64_t pages = kv_layers > 0 ? ceil_div(h.kv_positions, m.p.kv_page_size) : 0;
  if (pages > m.kv.free_pages())
    throw Error(Status::out_of_capacity, fmt::format("load_sequence: needs {} KV pages, {} free", pages, m.kv.free_pages()));
  const int s = m.acquire_slot("load_sequence");
  auto& sl = m.slots[static_cast<std::size_t>(s)];
  const std::byte* base = file.bytes().data();
  load_gdn(m.gdn_state, s, reinterpret_cast<const float*>(base + h.conv.offset), base + h.recurrent.offset,
           static_cast<int>(h.gdn_layers));
  m.prepare_pages(s, 0, h.kv_positions);
  const int hd = m.c.head_dim, Hkv = m.c.num_key_value_heads, ps = m.p.kv_page_size;
  const float* kv = reinterpret_cast<const float*>(base + h.kv.offset);
  const auto& table = m.page_tables[static_cast<std::size_t>(s)];
  for (int l = 0; l < kv_layers; ++l)
    for (int which = 0; which < 2; ++which)
      for (std::int64_t pos = 0; pos < h.kv_positions; ++pos)
        for (int g = 0; g < Hkv; ++g) {
          const std::int32_t page = table[static_cast<std::size_t>(pos / ps)];
          float* dst = (which == 0 ? m.kv.keys(page, l, g) : m.kv.values(page, l, g)) + (pos % ps) * hd;
          std::memcpy(dst, kv + (((static_cast<std::int64_t>(l) * 2 + which) * h.kv_positions + pos) * Hkv + g) * hd,
                      static_cast<std::size_t>(hd) * sizeof(float));
        }
  sl.length = h.length;
  sl.mtp_length = h.mtp_length;
  return make_handle(s, sl.generation);
}

}  // namespace gdn
