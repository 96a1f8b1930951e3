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
  m.check_usable("snapshot");
  const auto& sl = m.slot_for(seq, "snapshot");
  const int s = handle_index(seq);
  std::unique_ptr<StateCopy> state;
  m.guarded([&] { state = m.backend->save_slot(s); });  // first: a failure leaves no snapshot behind
  std::size_t i = 0;
  while (i < m.snapshots.size() && m.snapshots[i].live) ++i;
  if (i == m.snapshots.size()) m.snapshots.emplace_back();
  Impl::Snapshot& snap = m.snapshots[i];
  snap.live = true;
  snap.length = sl.length;
  snap.mtp_length = sl.mtp_length;
  snap.state = std::move(state);
  snap.pages = m.page_tables[static_cast<std::size_t>(s)];
  for (const auto page : snap.pages) m.pages.retain(page);
  return make_handle(static_cast<int>(i), snap.generation);
}

void Context::free_snapshot(SnapshotId id) {
  Impl& m = *impl_;
  Impl::Snapshot& snap = m.snapshot_for(id, "free_snapshot");
  for (const auto page : snap.pages) m.pages.release(page);
  snap.pages.clear();
  snap.state.reset();
  snap.live = false;
  ++snap.generation;
}

void Context::restore(SeqId seq, SnapshotId id) {
  Impl& m = *impl_;
  m.check_usable("restore");
  auto& sl = m.slot_for(seq, "restore");
  const Impl::Snapshot& snap = m.snapshot_for(id, "restore");
  const int s = handle_index(seq);
  m.guarded([&] { m.backend->restore_slot(s, *snap.state); });
  // Retain first: restoring a sequence from a snapshot of itself must not free shared pages.
  for (const auto page : snap.pages) m.pages.retain(page);
  m.release_pages(s);
  m.page_tables[static_cast<std::size_t>(s)] = snap.pages;  // capacity was reserved up front
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
  try {
    m.guarded([&] { m.backend->copy_slot(s_from, s); });
  } catch (...) {
    sl = Impl::Slot{.generation = sl.generation};
    throw;
  }
  m.page_tables[static_cast<std::size_t>(s)] = m.page_tables[static_cast<std::size_t>(s_from)];
  for (const auto page : m.page_tables[static_cast<std::size_t>(s)]) m.pages.retain(page);
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
  m.check_usable("save_sequence");
  const auto& sl = m.slot_for(seq, "save_sequence");
  const int s = handle_index(seq);
  const StateLayout& l = m.backend->layout();
  StateFileHeader h;
  h.fingerprint = model_fingerprint(*m.model);
  h.state_dtype = l.state_dtype;
  h.kv_dtype = l.kv_dtype;
  h.length = sl.length;
  h.mtp_length = sl.mtp_length;
  h.gdn_layers = l.gdn_layers;
  h.conv_floats = l.conv_floats;
  h.recurrent_elements = l.recurrent_elements;
  h.kv_layers = l.kv_layers;
  h.kv_dim = l.kv_dim;
  h.kv_positions = m.covered_positions(sl);
  std::vector<float> conv(static_cast<std::size_t>(l.gdn_layers * l.conv_floats));
  std::vector<std::byte> rec(static_cast<std::size_t>(l.recurrent_bytes_per_slot()));
  m.guarded([&] { m.backend->read_slot(s, conv.data(), rec.data()); });
  // KV laid out [layer][key|value][position][kv_head][head_dim], independent of the page size.
  const int hd = m.c.head_dim, Hkv = m.c.num_key_value_heads, ps = m.p.kv_page_size;
  std::vector<float> kv(static_cast<std::size_t>(l.kv_layers * 2 * h.kv_positions * h.kv_dim));
  std::vector<float> page_buf(static_cast<std::size_t>(l.kv_page_floats()));
  const auto& table = m.page_tables[static_cast<std::size_t>(s)];
  for (std::int64_t pg = 0; pg * ps < h.kv_positions && l.kv_layers > 0; ++pg) {
    m.guarded([&] { m.backend->read_kv_page(table[static_cast<std::size_t>(pg)], page_buf.data()); });
    for (int layer = 0; layer < l.kv_layers; ++layer)
      for (int which = 0; which < 2; ++which)
        for (int g = 0; g < Hkv; ++g)
          for (std::int64_t pos = pg * ps; pos < std::min<std::int64_t>(h.kv_positions, (pg + 1) * ps); ++pos) {
            const float* src = page_buf.data() + (((static_cast<std::int64_t>(layer) * 2 + which) * Hkv + g) * ps + pos % ps) * hd;
            std::copy_n(src, hd, kv.data() + (((static_cast<std::int64_t>(layer) * 2 + which) * h.kv_positions + pos) * Hkv + g) * hd);
          }
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
  m.check_usable("load_sequence");
  const io::MappedFile file(path);
  const StateFileHeader h = parse_state_file(file.bytes(), path);
  const StateLayout& l = m.backend->layout();
  // Compatibility with this model and context, before any state is touched.
  const auto mismatch = [&](const std::string& why) {
    throw Error(Status::invalid_argument, fmt::format("load_sequence: '{}' does not fit this context: {}", path, why));
  };
  if (h.fingerprint != model_fingerprint(*m.model)) mismatch("it was saved from a different model");
  if (h.state_dtype != l.state_dtype)
    mismatch(fmt::format("its state dtype is {}, the context's is {}", dtype_name(h.state_dtype), dtype_name(l.state_dtype)));
  // A cached KV written at bf16 continues exactly only in a bf16 cache, and a float32 one would be
  // rounded: either way the continuation would match neither cold run.
  if (h.kv_layers > 0 && h.kv_dtype != l.kv_dtype)
    mismatch(fmt::format("its KV cache dtype is {}, the context's is {}", dtype_name(h.kv_dtype), dtype_name(l.kv_dtype)));
  if (h.gdn_layers != l.gdn_layers || h.conv_floats != l.conv_floats || h.recurrent_elements != l.recurrent_elements ||
      h.kv_layers != l.kv_layers || h.kv_dim != l.kv_dim)
    mismatch("its shapes differ");
  if (std::max(h.length, h.mtp_length) > m.p.max_context)
    throw Error(Status::context_overflow, fmt::format("load_sequence: '{}' holds {} positions; max_context is {}", path,
                                                      std::max(h.length, h.mtp_length), m.p.max_context));
  const std::int64_t n_pages = h.kv_layers > 0 ? ceil_div(h.kv_positions, m.p.kv_page_size) : 0;
  if (n_pages > m.pages.free_pages())
    throw Error(Status::out_of_capacity, fmt::format("load_sequence: needs {} KV pages, {} free", n_pages, m.pages.free_pages()));
  const int s = m.acquire_slot("load_sequence");
  auto& sl = m.slots[static_cast<std::size_t>(s)];
  const std::byte* base = file.bytes().data();
  // The file's sections are not aligned for float; copy the conv section out.
  std::vector<float> conv(static_cast<std::size_t>(h.conv.bytes / sizeof(float)));
  std::memcpy(conv.data(), base + h.conv.offset, h.conv.bytes);
  const int hd = m.c.head_dim, Hkv = m.c.num_key_value_heads, ps = m.p.kv_page_size;
  try {
    m.guarded([&] { m.backend->write_slot(s, conv.data(), base + h.recurrent.offset); });
    m.prepare_pages(s, 0, h.kv_positions);
    const auto& table = m.page_tables[static_cast<std::size_t>(s)];
    std::vector<float> page_buf(static_cast<std::size_t>(l.kv_page_floats()));
    for (std::int64_t pg = 0; pg < n_pages; ++pg) {
      std::fill(page_buf.begin(), page_buf.end(), 0.0f);
      for (int layer = 0; layer < l.kv_layers; ++layer)
        for (int which = 0; which < 2; ++which)
          for (int g = 0; g < Hkv; ++g)
            for (std::int64_t pos = pg * ps; pos < std::min<std::int64_t>(h.kv_positions, (pg + 1) * ps); ++pos) {
              float* dst = page_buf.data() + (((static_cast<std::int64_t>(layer) * 2 + which) * Hkv + g) * ps + pos % ps) * hd;
              std::memcpy(dst,
                          base + h.kv.offset +
                              (((static_cast<std::int64_t>(layer) * 2 + which) * h.kv_positions + pos) * Hkv + g) * hd * 4,
                          static_cast<std::size_t>(hd) * sizeof(float));
            }
      m.guarded([&] { m.backend->write_kv_page(table[static_cast<std::size_t>(pg)], page_buf.data()); });
    }
  } catch (...) {
    m.release_pages(s);
    sl = Impl::Slot{.generation = sl.generation};
    throw;
  }
  sl.length = h.length;
  sl.mtp_length = h.mtp_length;
  return make_handle(s, sl.generation);
}

}  // namespace gdn
