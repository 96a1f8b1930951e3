#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include <sys/mman.h>

#include <fmt/format.h>

#include "gdn/core/error.hpp"

#include "gdn_state.hpp"
#include "kv_store.hpp"

namespace gdn::cpu {
namespace {

template <typename T>
void allocate(std::vector<T>& v, std::int64_t n, T value, const char* what) {
  try {
    v.assign(static_cast<std::size_t>(n), value);
  } catch (const std::bad_alloc&) {
    throw Error(Status::out_of_capacity, fmt::format("cannot allocate {} bytes of host memory for the {}",
                                                     n * static_cast<std::int64_t>(sizeof(T)), what));
  }
}

// Best effort: the 2 MiB-aligned part of [p, p + n) into transparent huge pages (before any write:
// pages already faulted in stay 4 KiB).
void advise_huge_pages(std::byte* p, std::size_t n) {
  constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
  const auto a = (reinterpret_cast<std::uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const auto e = (reinterpret_cast<std::uintptr_t>(p) + n) & ~(huge - 1);
  if (a < e) (void)::madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
}

// A zeroed buffer the decode steps stream (the KV cache, the GDN recurrent state): advised into
// huge pages, then committed, so that a context that was created can run.
std::unique_ptr<std::byte[]> zeroed_streamed_buffer(std::int64_t bytes, const char* what) {
  std::unique_ptr<std::byte[]> p(new (std::nothrow) std::byte[static_cast<std::size_t>(bytes)]);
  if (!p && bytes > 0)
    throw Error(Status::out_of_capacity, fmt::format("cannot allocate {} bytes of host memory for the {}", bytes, what));
  advise_huge_pages(p.get(), static_cast<std::size_t>(bytes));
  std::memset(p.get(), 0, static_cast<std::size_t>(bytes));
  return p;
}

}  // namespace

KvStore::KvStore(std::int64_t pages, int page_size, int layers, int kv_heads, int head_dim, DType dtype)
    : page_size_(page_size), kv_heads_(kv_heads), head_dim_(head_dim), dtype_(dtype), pages_(pages) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Error(Status::invalid_argument, fmt::format("the CPU KV cache holds F32 or BF16, not {}", dtype_name(dtype)));
  page_elements_ = static_cast<std::int64_t>(layers) * 2 * kv_heads * page_size * head_dim;
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(pages, page_bytes(), &bytes))
    throw Error(Status::out_of_capacity,
                fmt::format("a KV cache of {} pages of {} elements cannot be addressed", pages, page_elements_));
  data_ = zeroed_streamed_buffer(bytes, "KV cache");
}

void KvStore::read_page(std::int32_t page, float* out) const noexcept {
  if (dtype_ == DType::f32) {
    std::memcpy(out, page_base(page), static_cast<std::size_t>(page_bytes()));
    return;
  }
  const auto* in = reinterpret_cast<const bf16*>(page_base(page));
  for (std::int64_t i = 0; i < page_elements_; ++i) out[i] = to_float(in[i]);
}

void KvStore::write_page(std::int32_t page, const float* in) noexcept {
  if (dtype_ == DType::f32) {
    std::memcpy(page_base(page), in, static_cast<std::size_t>(page_bytes()));
    return;
  }
  auto* out = reinterpret_cast<bf16*>(page_base(page));
  for (std::int64_t i = 0; i < page_elements_; ++i) out[i] = to_bf16(in[i]);
}

GdnStatePool::GdnStatePool(const ModelConfig& c, int slots, DType state_dtype) : state_dtype_(state_dtype) {
  layers_ = c.count_layers(LayerKind::linear_attention);
  conv_floats_ = static_cast<std::int64_t>(c.linear_conv_kernel_dim - 1) * c.gdn_conv_dim();
  recurrent_elems_ = static_cast<std::int64_t>(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim;
  allocate(conv_, slots * layers_ * conv_floats_, 0.0f, "GDN conv state");
  recurrent_ = zeroed_streamed_buffer(slots * layers_ * recurrent_elems_ * static_cast<std::int64_t>(dtype_size(state_dtype)),
                                     "GDN recurrent state");
}

void GdnStatePool::clear(int slot) noexcept {
  std::fill_n(conv(slot, 0), layers_ * conv_floats_, 0.0f);
  std::fill_n(recurrent(slot, 0), layers_ * recurrent_elems_ * static_cast<std::int64_t>(dtype_size(state_dtype_)),
              std::byte{0});
}

}  // namespace gdn::cpu
