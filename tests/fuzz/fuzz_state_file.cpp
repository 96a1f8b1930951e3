// libFuzzer target: the sequence-state file (Context::save_sequence's format) on arbitrary bytes.
// Each input is parsed twice: as it is (so the checksum check itself is fuzzed) and with its
// trailing CRC-32 recomputed (so mutations reach the header and section checks behind it, as a
// deliberate attacker's would). A file that parses is then loaded into a live context of the
// qwen35_cond_mtp fixture and stepped once: an accepted file must give a sequence whose lengths fit
// max_context and that holds exactly the KV pages its length needs.
//
// GDN_FUZZ_WRITE_SEEDS=DIR fuzz_state_file writes the seed files of corpus/fuzz_state_file to DIR
// (real saved sequences of that fixture) and exits.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <zlib.h>

#include "fuzz_check.hpp"
#include "gdn/gdn.hpp"
#include "gdn/state/state_file.hpp"

namespace {

struct Env {
  std::shared_ptr<const gdn::Model> model;
  std::unique_ptr<gdn::Context> ctx;
  int fd = -1;
  std::string path;  // /proc/self/fd/N of an in-memory file
};
Env* env = nullptr;

gdn::ContextParams params() {
  gdn::ContextParams p;
  p.max_sequences = 2;
  p.max_context = 96;
  p.kv_page_size = 16;
  p.threads = 1;
  return p;
}

void write_seeds(const std::string& dir) {
  gdn::Context ctx(env->model, params());
  const auto save = [&](gdn::SeqId s, const std::string& name) { ctx.save_sequence(s, dir + "/" + name); };
  const gdn::SeqId empty = ctx.create_sequence();
  save(empty, "empty.gdnstate");
  const gdn::SeqId s = ctx.create_sequence();
  gdn::Batch b;
  b.add(s, std::vector<gdn::Token>{1, 2, 3, 4, 5}, gdn::LogitsFor::none);
  ctx.step(b);
  save(s, "five_tokens.gdnstate");
  b.clear();
  b.add(s, std::vector<gdn::Token>{7, 8}, gdn::LogitsFor::none);
  std::vector<float> hidden(static_cast<std::size_t>(2 * env->model->config().hidden_size), 0.5f);
  ctx.step_mtp(b, hidden);
  save(s, "five_tokens_two_mtp.gdnstate");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  env = new Env;
  env->model = gdn::Model::load(std::string(GDN_FIXTURES_DIR) + "/models/qwen35_cond_mtp");
  env->ctx = std::make_unique<gdn::Context>(env->model, params());
  if (const char* dir = std::getenv("GDN_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  env->fd = ::memfd_create("gdn_fuzz_state", MFD_CLOEXEC);
  GDN_FUZZ_CHECK(env->fd >= 0);
  env->path = "/proc/self/fd/" + std::to_string(env->fd);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parse = [](const std::vector<std::byte>& bytes, gdn::StateFileHeader& h) {
    try {
      h = gdn::parse_state_file(bytes, "fuzz.gdnstate");
      return true;
    } catch (const gdn::Error& e) {
      GDN_FUZZ_CHECK(e.status() == gdn::Status::invalid_file);
      return false;
    }
  };
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  gdn::StateFileHeader h;
  parse(bytes, h);
  if (size < 20) return 0;
  // The same bytes with a valid checksum.
  const std::uint32_t crc = static_cast<std::uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(size - 4)));
  for (int i = 0; i < 4; ++i) bytes[size - 4 + static_cast<std::size_t>(i)] = static_cast<std::byte>((crc >> (8 * i)) & 0xff);
  if (!parse(bytes, h)) return 0;
  for (const auto* s : {&h.conv, &h.recurrent, &h.kv}) GDN_FUZZ_CHECK(s->offset <= size - 4 && s->bytes <= size - 4 - s->offset);
  GDN_FUZZ_CHECK(h.length >= 0 && h.mtp_length >= 0);

  // Load it into the context.
  GDN_FUZZ_CHECK(::ftruncate(env->fd, 0) == 0);
  GDN_FUZZ_CHECK(::pwrite(env->fd, bytes.data(), size, 0) == static_cast<ssize_t>(size));
  gdn::Context& ctx = *env->ctx;
  const std::int64_t free_before = ctx.kv_free_pages();
  gdn::SeqId s = 0;
  try {
    s = ctx.load_sequence(env->path);
  } catch (const gdn::Error& e) {
    const auto st = e.status();
    GDN_FUZZ_CHECK(st == gdn::Status::invalid_file || st == gdn::Status::invalid_argument ||
                   st == gdn::Status::context_overflow || st == gdn::Status::out_of_capacity);
    GDN_FUZZ_CHECK(ctx.live_sequences() == 0 && ctx.kv_free_pages() == free_before);  // nothing left behind
    return 0;
  }
  const std::int64_t len = ctx.sequence_length(s), mtp = ctx.mtp_length(s);
  GDN_FUZZ_CHECK(len == h.length && mtp == h.mtp_length);
  GDN_FUZZ_CHECK(len <= ctx.params().max_context && mtp <= ctx.params().max_context);
  const std::int64_t ps = ctx.params().kv_page_size;
  GDN_FUZZ_CHECK(free_before - ctx.kv_free_pages() == (std::max(len, mtp) + ps - 1) / ps);
  if (len < ctx.params().max_context) {
    gdn::Batch b;
    b.add(s, gdn::Token{3}, gdn::LogitsFor::last);
    ctx.step(b);
  }
  ctx.free_sequence(s);
  GDN_FUZZ_CHECK(ctx.kv_free_pages() == free_before);
  return 0;
}
