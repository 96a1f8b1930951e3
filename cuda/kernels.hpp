#pragma once
// The CUDA backend's kernels, as host-callable launchers. Each takes device pointers, explicit
// row strides (in elements), a stream, and returns cudaError_t (cudaErrorInvalidValue for arguments
// it refuses, before anything is launched). None allocates, synchronises or copies to the host, so
// every launcher may be captured in a CUDA graph. Activations and weights are bf16; accumulation,
// the GDN recurrent state and everything numerical in between are float32.
//
// Row sets. A step's rows are the tokens of all its sequences back to back; cu_seqlens[s] is the
// first row of sequence s and cu_seqlens[num_seqs] the total (like FlashInfer's qo_indptr). Kernels
// that process whole sequences are launched over a grid sized by the longest one (max_seqlen) and
// skip the blocks past each sequence's end, so sequences of any mix of lengths go in one launch.
//
// State pools. Per-sequence state (conv history, GDN state, KV pages) lives in pools indexed by
// slot; slots[s] is sequence s's slot. Offsets into pools are 64-bit throughout.
//
// The reference for every kernel is the CPU implementation in include/gdn/layers/; docs/cuda.md
// lists the kernels, their launch shapes, and what has (not yet) been verified on a device.

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

// Under the CPU emulator (GDN_CUDA_EMULATE, see emulate.hpp) every name of the CUDA backend lives in
// the inline namespace gdn::cuda::emulated, so the emulated and the real kernels can never be
// mistaken for each other at link time.
#if defined(GDN_CUDA_EMULATE)
#define GDN_CUDA_NAMESPACE_BEGIN \
  namespace gdn::cuda {          \
  inline namespace emulated {
#define GDN_CUDA_NAMESPACE_END \
  }                            \
  }
#else
#define GDN_CUDA_NAMESPACE_BEGIN namespace gdn::cuda {
#define GDN_CUDA_NAMESPACE_END }
#endif

GDN_CUDA_NAMESPACE_BEGIN

using bf16 = __nv_bfloat16;

// Number of usable CUDA devices (0 when there is no driver or no device), and the runtime's reason
// when there is none.
int device_count() noexcept;
const char* unavailable_reason() noexcept;

// ---------------------------------------------------------------------------------------------
// Causal depthwise conv1d + SiLU (conv1d.cuh), for the qkv channels of a GDN layer.
//   out[t][c] = silu(Σ_j w[c][j]·u[t−K+1+j][c]),  u = [history ; x],  j = K−1 the current token.
// The history is the last K−1 raw inputs, oldest first: [K−1][channels] per slot, bf16 (the raw
// inputs are bf16 projections, so keeping them in bf16 loses nothing).
struct Conv1dParams {
  const bf16* x = nullptr;  // [rows][ld_x], channel c of row r at x[r·ld_x + c]
  std::int64_t ld_x = 0;
  const bf16* weight = nullptr;  // [channels][K] (the checkpoint's conv1d.weight [C, 1, K])
  bf16* out = nullptr;           // [rows][ld_out]
  std::int64_t ld_out = 0;
  bf16* state = nullptr;  // pool: slot i's history at state + i·state_slot_stride
  std::int64_t state_slot_stride = 0;
  const std::int32_t* slots = nullptr;       // [num_seqs]
  const std::int32_t* cu_seqlens = nullptr;  // [num_seqs + 1]
  // update only, optional: the history after each token t of sequence s, for rollback, at
  // snapshots + slots[s]·snapshot_seq_stride + t·snapshot_token_stride ([K−1][channels] each), for
  // the sequences whose snapshot_record[s] is non-zero (every sequence when snapshot_record is null).
  bf16* snapshots = nullptr;
  std::int64_t snapshot_seq_stride = 0, snapshot_token_stride = 0;
  const std::int32_t* snapshot_record = nullptr;
  int num_seqs = 0;
  int channels = 0;
  int kernel_size = 4;  // K; 4 is the only one compiled (every Qwen3.5/3.6/Next checkpoint)
};
// Prefill: sequences of any length; blocks of 64 tokens × 128 channels.
cudaError_t causal_conv1d_prefill(const Conv1dParams& p, int max_seqlen, cudaStream_t stream);
// Decode / MTP verify: at most `max_tokens` (≤ 16) tokens per sequence, one block per 128 channels
// of each sequence; writes snapshots when p.snapshots is set.
cudaError_t causal_conv1d_update(const Conv1dParams& p, int max_tokens, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// The gated delta rule of a GDN layer (gdn_recurrent.cuh, gdn_chunked.cuh), with the gating and the
// q/k L2 normalisation fused in. Per value head h (key head h / (Hv/Hk)) and token t:
//   q ← q/‖q‖·dk^−½, k ← k/‖k‖ (‖x‖ = sqrt(Σx² + 1e−6)),  g = neg_exp_A[h]·softplus(a + dt_bias[h]),
//   β = sigmoid(b);  S ← e^g·S;  u = β(v − Sᵀk);  S ← S + k uᵀ;  o = Sᵀq.
// S is dk×dv float32, key-major (S[i][j] at i·dv + j), per slot [Hv][dk][dv]. dk ≤ 128.
struct GdnParams {
  const bf16* q = nullptr;  // conv output: key head kh of row r at q + r·ld_q + kh·dk
  const bf16* k = nullptr;
  const bf16* v = nullptr;  // value head h at v + r·ld_v + h·dv
  std::int64_t ld_q = 0, ld_k = 0, ld_v = 0;
  const bf16* a = nullptr;  // raw in_proj_a / in_proj_b outputs: head h of row r at a[r·ld_a + h]
  const bf16* b = nullptr;
  std::int64_t ld_a = 0, ld_b = 0;
  const float* neg_exp_A = nullptr;  // [Hv]: −exp(A_log), float32 as the CPU backend precomputes it
  const float* dt_bias = nullptr;    // [Hv]
  float* state = nullptr;            // pool: slot i's [Hv][dk][dv] at state + i·state_slot_stride
  std::int64_t state_slot_stride = 0;
  const std::int32_t* slots = nullptr;
  const std::int32_t* cu_seqlens = nullptr;
  int num_seqs = 0;
  bf16* out = nullptr;  // value head h of row r at out + r·ld_out + h·dv
  std::int64_t ld_out = 0;
  // gdn_recurrent only, optional: the state after token t of sequence s (all heads, [Hv][dk][dv])
  // at snapshots + slots[s]·snapshot_seq_stride + t·snapshot_token_stride, for exact MTP rollback,
  // for the sequences whose snapshot_record[s] is non-zero (all when null).
  float* snapshots = nullptr;
  std::int64_t snapshot_seq_stride = 0, snapshot_token_stride = 0;
  const std::int32_t* snapshot_record = nullptr;
  int num_k_heads = 0, num_v_heads = 0, dk = 0, dv = 0;
};
// Fused recurrent form: token by token, the state read once and written once per launch (plus
// the snapshots). For decode and MTP verify (1..4 tokens per sequence); correct for any length.
cudaError_t gdn_recurrent(const GdnParams& p, int max_tokens, cudaStream_t stream);
// Chunked WY/UT form (chunk 64) for prefill; needs gdn_chunked_workspace_bytes(rows, Hv) bytes of
// device memory (rows = cu_seqlens[num_seqs]); the workspace may be reused once the call's work on
// the stream has completed.
std::size_t gdn_chunked_workspace_bytes(std::int64_t rows, int num_v_heads);
cudaError_t gdn_chunked(const GdnParams& p, int max_seqlen, float* workspace, cudaStream_t stream);

// Rollback after MTP verification: for each sequence s with keep[s] ≥ 1, copies its snapshot
// keep[s]−1 (at snapshots + slots[s]·seq_stride + (keep[s]−1)·token_stride, as gdn_recurrent and
// causal_conv1d_update write them) over its slot in the pool; with to_snapshots, the other way
// (the slot's state into that snapshot: a step's start state). Sizes and strides in bytes; bytes,
// strides and pointers must be multiples of 16.
struct SnapshotSelect {
  void* pool = nullptr;
  std::int64_t slot_stride_bytes = 0;
  const std::int32_t* slots = nullptr;
  void* snapshots = nullptr;
  std::int64_t seq_stride_bytes = 0, token_stride_bytes = 0;
  const std::int32_t* keep = nullptr;  // [num_seqs], tokens accepted (0: leave the slot as it is)
  std::int64_t bytes = 0;              // per slot
  int num_seqs = 0;
  bool to_snapshots = false;
};
cudaError_t select_snapshots(const SnapshotSelect& p, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Gated attention over a paged KV cache (attention.cuh).
//
// Paged KV layout: element d of head `head`, position-in-page `row`, of the key (kv = 0) or value
// (kv = 1) block of page `page` is at
//   data + page·page_stride + kv·kv_stride + head·head_stride + row·row_stride + d.
// The CPU pool's layout ([page][layer][k|v][kv_head][row][head_dim]) is this with data offset to
// the layer. Sequence s owns pages page_indices[page_indptr[s] .. page_indptr[s+1]); position p is
// in its page p / page_size at row p % page_size. kv_lens[s] counts the positions held after this
// step's tokens are appended; a step's tokens are the last positions: row t of a sequence with n
// rows is at position kv_lens[s] − n + t, and attends to positions 0 ..= that.
struct PagedKv {
  bf16* data = nullptr;
  std::int64_t page_stride = 0, kv_stride = 0, head_stride = 0, row_stride = 0;
  int page_size = 0;
  const std::int32_t* page_indptr = nullptr;
  const std::int32_t* page_indices = nullptr;
  const std::int32_t* kv_lens = nullptr;
};

// q/k zero-centred RMSNorm per head, partial NeoX RoPE on the first rotary_dim dims, and the append
// of this step's keys and values to the cache, in one pass over the projections.
struct AttnPrepareParams {
  const bf16* q_gate = nullptr;  // q_proj output: head h of row r: query at q_gate + r·ld_q + 2h·hd, gate after it
  std::int64_t ld_q = 0;
  const bf16* k = nullptr;  // kv head g of row r at k + r·ld_k + g·hd
  const bf16* v = nullptr;
  std::int64_t ld_k = 0, ld_v = 0;
  const float* q_norm_scale = nullptr;  // [hd]: 1 + q_norm.weight
  const float* k_norm_scale = nullptr;  // [hd]: 1 + k_norm.weight
  const float* inv_freq = nullptr;      // [rotary_dim/2]: theta^(−2i/rotary_dim), as the CPU backend (rope_inverse_frequencies)
  int rotary_dim = 0;
  float eps = 1e-6f;
  bf16* q_out = nullptr;  // [rows][ld_q_out]: head h at h·hd
  std::int64_t ld_q_out = 0;
  PagedKv kv;
  const std::int32_t* cu_seqlens = nullptr;
  int num_seqs = 0, rows = 0;
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
};
cudaError_t attention_prepare(const AttnPrepareParams& p, cudaStream_t stream);

// softmax(q·Kᵀ·scale) V per query head (GQA: query head h reads kv head h / (Hq/Hkv)), causal, then
// multiplied by sigmoid(gate) and written as bf16.
struct AttnParams {
  const bf16* q = nullptr;  // [rows][ld_q]: head h at h·hd (attention_prepare's q_out)
  std::int64_t ld_q = 0;
  const bf16* gate = nullptr;  // head h of row r at gate + r·ld_gate + h·gate_head_stride
  std::int64_t ld_gate = 0, gate_head_stride = 0;
  bf16* out = nullptr;  // [rows][ld_out]: head h at h·hd
  std::int64_t ld_out = 0;
  PagedKv kv;
  const std::int32_t* cu_seqlens = nullptr;
  int num_seqs = 0, rows = 0;
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;  // head_dim 32, 64, 128 or 256
  float scale = 0.0f;                                   // 1/sqrt(head_dim)
};
// Decode (flash-decoding): each (row, query head)'s positions split into runs of split_len
// positions, one block each (splits of them, the most any row needs), merged by a second kernel.
// Both are fixed for a context (from its max_context), so the call can sit in a graph while the
// lengths change, and a row's result is the same whatever else is in the batch. 1 split skips the
// merge. The workspace holds the partial results.
int attention_decode_split_len(int max_kv_len) noexcept;
int attention_decode_splits(int max_kv_len, int split_len) noexcept;
std::size_t attention_decode_workspace_bytes(int rows, int num_q_heads, int head_dim, int splits) noexcept;
cudaError_t attention_decode(const AttnParams& p, int splits, int split_len, float* workspace, cudaStream_t stream);
// Prefill: tiles of 16 query rows of one head against 32-position key tiles, online softmax.
cudaError_t attention_prefill(const AttnParams& p, int max_q_len, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Projections of a few rows (gemv.cuh): y[r][o] = Σ_i x[r][i]·w[o][i], bf16 in, float32 sums,
// bf16 or float32 out. Batch-invariant (an element of y does not depend on the other rows); reads
// each weight once per 8 rows, so it is meant for decode and MTP verification (the CUDA backend
// uses it up to 16 rows and cuBLASLt above).
struct GemvParams {
  const bf16* x = nullptr;  // [rows][ldx]
  std::int64_t ldx = 0;
  const bf16* w = nullptr;  // [out][ldw]
  std::int64_t ldw = 0;
  void* y = nullptr;        // [rows][ldy], float when f32_out
  std::int64_t ldy = 0;
  bool f32_out = false;
  int rows = 0, in = 0, out = 0;
};
cudaError_t gemv(const GemvParams& p, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Norms and element-wise kernels (norm.cuh).

// y = s·rsqrt(mean(s²) + eps)·(weight + weight_offset) per row of n, s = x, or with a residual
// s = bf16(x + residual), written back to residual first (the fused add of the residual stream).
// weight_offset = 1 gives the zero-centred Qwen3_5RMSNorm from the raw checkpoint weight; 0 takes
// the weight as is (a precomputed 1 + w, or a plain RMSNorm). y may alias x.
cudaError_t rmsnorm(const bf16* x, std::int64_t ld_x, bf16* residual, std::int64_t ld_residual, const float* weight,
                    float weight_offset, bf16* y, std::int64_t ld_y, int rows, int n, float eps, cudaStream_t stream);
// The GDN output norm, per head of head_dim: y = x·rsqrt(mean(x²) + eps)·w·silu(z). y may alias x.
cudaError_t rmsnorm_gated(const bf16* x, std::int64_t ld_x, const bf16* z, std::int64_t ld_z, const float* weight,
                          bf16* y, std::int64_t ld_y, int rows, int heads, int head_dim, float eps, cudaStream_t stream);
// out = silu(gate)·up, gate at in + r·ld_in + i, up at in + r·ld_in + up_offset + i, i < n.
cudaError_t swiglu(const bf16* in, std::int64_t ld_in, std::int64_t up_offset, bf16* out, std::int64_t ld_out, int rows,
                   int n, cudaStream_t stream);
// Partial NeoX RoPE in place: head h of row r at x + r·ld_x + h·head_stride, rotated at position
// positions[r] over its first rotary_dim dims (dim i pairs with i + rotary_dim/2).
cudaError_t rope_neox(bf16* x, std::int64_t ld_x, std::int64_t head_stride, int heads, int rotary_dim,
                      const std::int32_t* positions, const float* inv_freq, int rows, cudaStream_t stream);
// out[r] = table[tokens[r]] (n elements per row).
cudaError_t embedding_gather(const bf16* table, std::int64_t ld_table, const std::int32_t* tokens, bf16* out,
                             std::int64_t ld_out, int rows, int n, cudaStream_t stream);
// p[i] = scale·u_i with u_i uniform in [−1, 1) from a hash of (seed, i): random weights for benchmarks.
cudaError_t fill_random_bf16(bf16* p, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Sampling on the device (sampling.cuh), one 1024-thread block per row, with the semantics of
// gdn::Sampler::distribution (runtime/sampling.hpp) without penalties: temperature ≤ 0 is greedy
// (argmax, lowest index on ties); otherwise weights exp((l − max)/T), top-k (ties broken by lower
// index), then top-p (the smallest most-likely prefix whose mass, renormalised over the top-k set,
// reaches top_p) and min-p (weight ≥ min_p·max weight), and one draw with uniforms[r]: the first
// kept token, in vocabulary order, at which the cumulative kept mass exceeds u.
// The top-p/min-p cut is searched among the 1024 most likely tokens; when it lies beyond them
// (a very flat distribution with top_k = 0 or > 1024), the row keeps those 1024 and flags[r] = 1.
constexpr int kSampleMaxCandidates = 1024;
struct SampleParams {
  const float* logits = nullptr;  // [rows][ld_logits]
  std::int64_t ld_logits = 0;
  int rows = 0, vocab = 0;
  const float* temperature = nullptr;  // [rows]
  const std::int32_t* top_k = nullptr;  // [rows], 0: off
  const float* top_p = nullptr;         // [rows], 1: off
  const float* min_p = nullptr;         // [rows], 0: off
  const float* uniforms = nullptr;      // [rows], in [0, 1)
  std::int32_t* tokens = nullptr;       // [rows]
  float* probs = nullptr;               // optional [rows][ld_probs]: the distribution drawn from
  std::int64_t ld_probs = 0;
  std::int32_t* flags = nullptr;  // optional [rows]
};
cudaError_t sample(const SampleParams& p, cudaStream_t stream);
// Greedy only: tokens[r] = argmax of row r (lowest index on ties).
cudaError_t argmax(const float* logits, std::int64_t ld_logits, int rows, int vocab, std::int32_t* tokens,
                   cudaStream_t stream);

GDN_CUDA_NAMESPACE_END
