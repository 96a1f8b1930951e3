#include "attention.cuh"

GDN_CUDA_NAMESPACE_BEGIN
namespace {

// Runtime head_dim → template. Only the head dims of the supported models (256) and of the test
// fixtures (32), plus the two in between, are compiled.
template <typename F>
cudaError_t dispatch_head_dim(int hd, F&& f) {
  switch (hd) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return cudaErrorInvalidValue;
  }
}

// Vector loads of hd/32 bf16 need every row start aligned to that many elements.
bool vec_ok(const void* p, std::int64_t ld, int hd) {
  const int v = hd / 32;
  return p != nullptr && detail::aligned(p, 2 * static_cast<std::size_t>(v)) && ld % v == 0;
}

bool kv_ok(const PagedKv& kv, int hd) {
  const int v = hd / 32;
  return kv.data != nullptr && kv.page_indptr != nullptr && kv.page_indices != nullptr && kv.kv_lens != nullptr &&
         kv.page_size > 0 && detail::aligned(kv.data, 2 * static_cast<std::size_t>(v)) && kv.page_stride % v == 0 &&
         kv.kv_stride % v == 0 && kv.head_stride % v == 0 && kv.row_stride % v == 0 && kv.row_stride >= hd;
}

bool heads_ok(int hq, int hkv) { return hkv > 0 && hq >= hkv && hq % hkv == 0; }

bool attn_ok(const AttnParams& p) {
  return heads_ok(p.num_q_heads, p.num_kv_heads) && p.cu_seqlens != nullptr && p.num_seqs >= 0 && p.rows >= 0 &&
         p.gate != nullptr && p.out != nullptr && vec_ok(p.q, p.ld_q, p.head_dim) && kv_ok(p.kv, p.head_dim) &&
         p.scale > 0.0f;
}

}  // namespace

cudaError_t attention_prepare(const AttnPrepareParams& p, cudaStream_t stream) {
  const int hd = p.head_dim;
  if (!heads_ok(p.num_q_heads, p.num_kv_heads) || p.cu_seqlens == nullptr || p.num_seqs < 1 || p.rows < 0 ||
      !vec_ok(p.q_gate, p.ld_q, hd) || !vec_ok(p.k, p.ld_k, hd) || !vec_ok(p.v, p.ld_v, hd) ||
      !vec_ok(p.q_out, p.ld_q_out, hd) || !kv_ok(p.kv, hd) || p.q_norm_scale == nullptr || p.k_norm_scale == nullptr ||
      p.rotary_dim < 0 || p.rotary_dim > hd || p.rotary_dim % 2 != 0 || (p.rotary_dim > 0 && p.inv_freq == nullptr))
    return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows),
                  static_cast<unsigned>(detail::ceil_div(p.num_q_heads + p.num_kv_heads, kernels::kPrepWarps)));
  return dispatch_head_dim(hd, [&](auto HD) {
    return detail::launch(kernels::attention_prepare_kernel<decltype(HD)::value>, grid, dim3(kernels::kPrepWarps * 32), 0,
                          stream, p);
  });
}

int attention_decode_split_len(int max_kv_len) noexcept {
  // At least 256 positions a split (shorter ones cost more in merging than they gain), at most 64
  // splits, in whole runs of 16 positions (4 warps × 4).
  const int len = detail::imax(256, detail::ceil_div(detail::imax(max_kv_len, 1), 64));
  return detail::ceil_div(len, 16) * 16;
}

int attention_decode_splits(int max_kv_len, int split_len) noexcept {
  return detail::imax(1, detail::ceil_div(detail::imax(max_kv_len, 1), detail::imax(split_len, 1)));
}

std::size_t attention_decode_workspace_bytes(int rows, int num_q_heads, int head_dim, int splits) noexcept {
  if (splits <= 1) return 0;
  const std::size_t parts = static_cast<std::size_t>(rows) * static_cast<std::size_t>(num_q_heads) * static_cast<std::size_t>(splits);
  return parts * (static_cast<std::size_t>(head_dim) + 1) * sizeof(float);
}

cudaError_t attention_decode(const AttnParams& p, int splits, int split_len, float* workspace, cudaStream_t stream) {
  if (!attn_ok(p) || splits < 1 || split_len < 1 || (splits > 1 && workspace == nullptr)) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.num_seqs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.num_q_heads), static_cast<unsigned>(p.rows));
  return dispatch_head_dim(p.head_dim, [&](auto HD) {
    constexpr int hd = decltype(HD)::value;
    cudaError_t e =
        detail::launch(kernels::attention_decode_kernel<hd>, grid, dim3(kernels::kDecodeWarps * 32), 0, stream, p, splits,
                       split_len, workspace);
    if (e != cudaSuccess || splits == 1) return e;
    return detail::launch(kernels::attention_combine_kernel<hd>,
                          dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.num_q_heads)), dim3(hd), 0, stream, p,
                          splits, static_cast<const float*>(workspace));
  });
}

cudaError_t attention_prefill(const AttnParams& p, int max_q_len, cudaStream_t stream) {
  if (!attn_ok(p) || max_q_len < 0) return cudaErrorInvalidValue;
  if (max_q_len == 0 || p.num_seqs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(max_q_len, kernels::kPrefillRows)),
                  static_cast<unsigned>(p.num_q_heads), static_cast<unsigned>(p.num_seqs));
  return dispatch_head_dim(p.head_dim, [&](auto HD) {
    constexpr int hd = decltype(HD)::value;
    return detail::launch(kernels::attention_prefill_kernel<hd>, grid, dim3(kernels::kPrefillThreads),
                          kernels::prefill_smem_floats<hd>() * sizeof(float), stream, p);
  });
}

GDN_CUDA_NAMESPACE_END
