// The CUDA backend: the model graph (gdn/layers/decoder.hpp) on one NVIDIA GPU, through the kernels
// of cuda/ (kernels.hpp) and cuBLASLt.
//
// Numbers. Weights bf16, as stored (other dtypes rounded to bf16 once at upload); activations and
// the residual stream bf16, every kernel summing in float32; the GDN recurrent state float32
// ([slot][GDN layer][Hv][dk][dv], as the CPU keeps it), the conv history bf16 (it holds raw bf16
// projection outputs, so this is exact), the KV cache bf16 ([page][layer][k|v][kv head][row][hd]:
// the CPU's page layout); logits float32.
//
// A pass. The plan's segments are put in three groups, rows reordered so each group's rows are
// contiguous (the reorder is invisible: outputs go back to their rows):
//   A  long, chunked GDN:           n ≥ the chunk threshold and not recorded
//   B  long, recurrent GDN:          the other non-recorded segments of more than 16 tokens
//   C  short (decode, MTP verify):   ≤ 16 tokens, or recorded for rollback
// A and B run the prefill conv and attention kernels, C the update conv (with per-token history
// snapshots when recorded) and the decode attention; A the chunked GDN, B and C the recurrent one
// (with per-token state snapshots when recorded). Projections of A and B rows go to cuBLASLt, of
// C rows to the batch-invariant GEMV kernel (up to 16 rows; beyond, cuBLASLt). So a decode row's
// numbers never depend on the other sequences of the pass, and an MTP verification step gives
// each token what plain decoding would. A pass made only of short segments whose shape (segment
// sizes, rollback flags, outputs) was seen before is replayed from a captured CUDA graph.
//
// Rollback. Recorded segments keep, per slot, the state at the start of the step and after every
// token (conv history and recurrent state, all GDN layers); rollback(slot, keep) copies the state
// after `keep` tokens back. Snapshots and forks are device copies; save / load go through the host.
//
// Failures. A CUDA error is a gdn::Error naming the operation. Out-of-memory when allocating is
// out_of_capacity and leaves the context usable; an error once kernels of a pass have run may have
// left state half-written, and makes usable() false.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/layers/decoder.hpp"
#include "gdn/model/model.hpp"

#include "backend/backend.hpp"
#include "gemm.hpp"
#include "kernels.hpp"
#include "model_internals.hpp"
#include "runtime.hpp"

GDN_CUDA_NAMESPACE_BEGIN
namespace {

constexpr int kShortTokens = 16;    // conv update and per-token snapshots: at most 16 tokens a step
constexpr int kGemvMaxRows = 16;    // short rows projected by the batch-invariant GEMV kernel
constexpr int kConvKernel = 4;      // the conv kernel compiled
constexpr int kMaxGdnKeyDim = 128;  // gdn_recurrent / gdn_chunked
constexpr std::size_t kMaxGraphs = 32;

Status status_of(cudaError_t e) { return e == cudaErrorMemoryAllocation ? Status::out_of_capacity : Status::internal; }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(status_of(e), fmt::format("CUDA backend: {} failed: {} (cudaError {})", what, rt::error_string(e),
                                          static_cast<int>(e)));
}

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

// One device allocation, freed on destruction.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(std::size_t bytes, const char* what) : bytes_(bytes) {
    const cudaError_t e = rt::device_alloc(&p_, bytes);
    if (e == cudaErrorMemoryAllocation) {
      std::size_t free_b = 0, total = 0;
      (void)rt::mem_get_info(&free_b, &total);
      throw Error(Status::out_of_capacity,
                  fmt::format("CUDA backend: cannot allocate {:.1f} MB of device memory for the {} ({:.1f} MB free of "
                              "{:.1f} MB); lower max_sequences, max_context or max_batch_tokens",
                              bytes / 1e6, what, free_b / 1e6, total / 1e6));
    }
    check(e, what);
  }
  ~DeviceMemory() { (void)rt::device_free(p_); }
  DeviceMemory(DeviceMemory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T = void>
  T* get() const noexcept { return static_cast<T*>(p_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

class PinnedMemory {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(std::size_t bytes) {
    check(rt::host_alloc(&p_, bytes), "allocating pinned host memory");
  }
  ~PinnedMemory() { (void)rt::host_free(p_); }
  PinnedMemory(PinnedMemory&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PinnedMemory& operator=(PinnedMemory&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  template <typename T = void>
  T* get() const noexcept { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

// Carves one allocation into aligned pieces: first count (plan), then allocate and hand out.
class Carver {
 public:
  template <typename T>
  T* take(std::size_t n) {
    const std::size_t at = used_;
    used_ += align256(n * sizeof(T));
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + at);
  }
  std::size_t used() const noexcept { return used_; }
  void start(void* base) {
    base_ = static_cast<char*>(base);
    used_ = 0;
  }

 private:
  char* base_ = nullptr;
  std::size_t used_ = 0;
};

// ---- device and configuration checks ------------------------------------------------------------

rt::DeviceInfo open_device(int device) {
  int n = 0;
  const cudaError_t e = rt::device_count(&n);
  if (e == cudaErrorInsufficientDriver)
    throw Error(Status::backend_unavailable,
                "the CUDA backend is not available: no usable NVIDIA driver (none is installed, or it is older than the "
                "CUDA runtime libgdn was built with)");
  if (e != cudaSuccess || n == 0)
    throw Error(Status::backend_unavailable,
                fmt::format("the CUDA backend is not available: no CUDA device ({})",
                            e != cudaSuccess ? rt::error_string(e) : "the driver reports none"));
  if (device < 0 || device >= n)
    throw Error(Status::backend_unavailable,
                fmt::format("the CUDA backend is not available: device {} was asked for, the machine has {}", device, n));
  check(rt::set_device(device), "selecting the device");
  rt::DeviceInfo info;
  check(rt::device_info(device, &info), "reading the device's properties");
  if (info.major < 8)
    throw Error(Status::backend_unavailable,
                fmt::format("the CUDA backend is not available on {} (compute capability {}.{}): its kernels need "
                            "bf16 and are built for sm_80 and later",
                            info.name, info.major, info.minor));
  return info;
}

void check_config(const ModelConfig& c) {
  const auto refuse = [](const std::string& why) {
    throw Error(Status::unsupported_model, fmt::format("the CUDA backend does not run this model: {}", why));
  };
  if (c.count_layers(LayerKind::linear_attention) > 0) {
    if (c.linear_conv_kernel_dim != kConvKernel)
      refuse(fmt::format("linear_conv_kernel_dim is {}; its conv kernel is compiled for {} (every Qwen3.5/3.6/Next "
                         "checkpoint)",
                         c.linear_conv_kernel_dim, kConvKernel));
    if (c.linear_key_head_dim > kMaxGdnKeyDim)
      refuse(fmt::format("linear_key_head_dim is {}; its GDN kernels hold at most {} key dims", c.linear_key_head_dim,
                         kMaxGdnKeyDim));
  }
  if (c.count_layers(LayerKind::full_attention) > 0 && c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128 &&
      c.head_dim != 256)
    refuse(fmt::format("head_dim is {}; its attention kernels are compiled for 32, 64, 128 and 256", c.head_dim));
}

// ---- weights on the device --------------------------------------------------------------------

// Rows of checkpoint tensors, in the order a device matrix holds them.
struct RowRun {
  const TensorView* t;
  std::int64_t row0, rows;
};

struct GdnW {
  const bf16* w_in = nullptr;  // [C + Vd + 2Hv][H]: qkv | z | b | a
  const bf16* conv = nullptr;  // [C][K]
  const float* neg_exp_A = nullptr;
  const float* dt_bias = nullptr;
  const float* norm = nullptr;
  const bf16* w_out = nullptr;  // [H][Vd]
};
struct AttnW {
  const bf16* w_qkv = nullptr;  // [2qd + 2kvd][H]: q_proj (q | gate per head) | k | v
  const bf16* w_o = nullptr;    // [H][qd]
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
};
struct MlpW {
  const bf16* w_gate_up = nullptr;  // [2I][H]
  const bf16* w_down = nullptr;     // [H][I]
};
struct LayerW {
  LayerKind kind = LayerKind::linear_attention;
  const float* input_norm_scale = nullptr;
  const float* post_attention_norm_scale = nullptr;
  GdnW gdn;
  AttnW attn;
  MlpW mlp;
};
struct MtpW {
  const bf16* fc = nullptr;  // [H][2H]
  const float* pre_fc_norm_embedding_scale = nullptr;
  const float* pre_fc_norm_hidden_scale = nullptr;
  const float* norm_scale = nullptr;
  LayerW layer;
};

// A model's weights on one device, shared by every context there (ModelInternals::prepared).
struct DeviceWeights {
  int device = 0;
  DeviceMemory memory;
  std::vector<LayerW> layers;
  const float* final_norm_scale = nullptr;
  const bf16* embed = nullptr;    // [V][H]
  const bf16* lm_head = nullptr;  // the embedding when tied
  const float* inv_freq = nullptr;
  std::optional<MtpW> mtp;
  std::vector<std::pair<bf16*, std::int64_t>> matrices;  // every bf16 matrix and its elements (randomize_cuda_weights)
};

// Builds DeviceWeights in two passes over the same code: the first counts bytes, the second
// (after the one allocation) converts each tensor on the host and copies it up.
class Uploader {
 public:
  Uploader(const ModelConfig& c, const std::function<void(std::size_t, std::size_t)>& progress) : c_(c), progress_(progress) {}

  void begin_copy(void* base, DeviceWeights* w) {
    weights_ = w;
    carver_.start(base);
    copying_ = true;
    staging_ = PinnedMemory(kStaging);
    if (progress_) progress_(0, total_);
  }
  std::size_t bytes() const noexcept { return carver_.used(); }

  const bf16* matrix(const std::vector<RowRun>& runs, std::int64_t in) {
    std::int64_t rows = 0;
    for (const auto& r : runs) rows += r.rows;
    bf16* dst = carver_.take<bf16>(static_cast<std::size_t>(rows * in));
    if (!copying_) {
      total_ += static_cast<std::size_t>(rows * in) * 2;
      return nullptr;
    }
    weights_->matrices.emplace_back(dst, rows * in);
    std::int64_t at = 0;
    for (const auto& r : runs) {
      const TensorView& t = *r.t;
      for (std::int64_t row = r.row0; row < r.row0 + r.rows;) {
        const std::int64_t n = std::min<std::int64_t>(r.row0 + r.rows - row, std::max<std::int64_t>(1, kStaging / 2 / in));
        auto* host = staging_.get<std::uint16_t>();
        const std::size_t elem = dtype_size(t.dtype);
        if (t.dtype == DType::bf16) std::memcpy(host, t.data + row * in * 2, static_cast<std::size_t>(n * in) * 2);
        else for (std::int64_t e = 0; e < n * in; ++e) {
          const std::byte* p = t.data + (row * in + e) * static_cast<std::int64_t>(elem);
          std::uint16_t bits = 0;
          switch (t.dtype) {
            case DType::bf16: std::memcpy(&bits, p, 2); break;
            case DType::f16: { f16 h; std::memcpy(&h, p, 2); bits = to_bf16(to_float(h)).bits; break; }
            case DType::f32: { float f; std::memcpy(&f, p, 4); bits = to_bf16(f).bits; break; }
            default: break;
          }
          host[e] = bits;
        }
        check(rt::memcpy_async(dst + at * in, host, static_cast<std::size_t>(n * in) * 2, cudaMemcpyHostToDevice, nullptr),
              "uploading the weights");
        check(rt::stream_synchronize(nullptr), "uploading the weights");
        at += n;
        row += n;
        done_ += static_cast<std::size_t>(n * in) * 2;
        if (progress_) progress_(done_, total_);
      }
    }
    return dst;
  }

  const bf16* matrix(const LinearWeight& w) { return matrix({RowRun{&w.w, 0, w.out()}}, w.in()); }

  const float* floats(const std::vector<float>& v) {
    float* dst = carver_.take<float>(v.size());
    if (copying_ && !v.empty()) {
      check(rt::memcpy_async(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice, nullptr), "uploading the weights");
      check(rt::stream_synchronize(nullptr), "uploading the weights");
    }
    return dst;
  }

 private:
  static constexpr std::int64_t kStaging = 64 << 20;
  const ModelConfig& c_;
  const std::function<void(std::size_t, std::size_t)>& progress_;
  Carver carver_;
  bool copying_ = false;
  DeviceWeights* weights_ = nullptr;
  PinnedMemory staging_;
  std::size_t total_ = 0, done_ = 0;
};

LayerW upload_layer(Uploader& u, const ModelConfig& c, const DecoderLayerWeights& l) {
  LayerW o;
  o.kind = l.kind;
  o.input_norm_scale = u.floats(l.input_norm_scale);
  o.post_attention_norm_scale = u.floats(l.post_attention_norm_scale);
  const std::int64_t H = c.hidden_size;
  if (l.kind == LayerKind::linear_attention) {
    const auto& g = l.gdn;
    if (c.gdn_layout == GdnProjectionLayout::separate) {
      o.gdn.w_in = u.matrix({{&g.in_proj_qkv.w, 0, g.in_proj_qkv.out()},
                             {&g.in_proj_z.w, 0, g.in_proj_z.out()},
                             {&g.in_proj_b.w, 0, g.in_proj_b.out()},
                             {&g.in_proj_a.w, 0, g.in_proj_a.out()}},
                            H);
    } else {
      // Qwen3-Next: rows interleaved per key-head group g as [q_g | k_g | v_g | z_g] and [b_g | a_g];
      // de-interleaved here into the separate layout, once.
      const int Hk = c.linear_num_key_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
      const int r = c.linear_num_value_heads / Hk;
      const std::int64_t group = 2LL * dk + 2LL * r * dv;
      const TensorView* qkvz = &g.in_proj_qkvz.w;
      const TensorView* ba = &g.in_proj_ba.w;
      std::vector<RowRun> runs;
      for (int part = 0; part < 6; ++part)
        for (int kg = 0; kg < Hk; ++kg) {
          switch (part) {
            case 0: runs.push_back({qkvz, kg * group, dk}); break;
            case 1: runs.push_back({qkvz, kg * group + dk, dk}); break;
            case 2: runs.push_back({qkvz, kg * group + 2 * dk, static_cast<std::int64_t>(r) * dv}); break;
            case 3: runs.push_back({qkvz, kg * group + 2 * dk + static_cast<std::int64_t>(r) * dv, static_cast<std::int64_t>(r) * dv}); break;
            case 4: runs.push_back({ba, 2LL * kg * r, r}); break;
            default: runs.push_back({ba, 2LL * kg * r + r, r}); break;
          }
        }
      o.gdn.w_in = u.matrix(runs, H);
    }
    o.gdn.conv = u.matrix({RowRun{&g.conv1d, 0, c.gdn_conv_dim()}}, c.linear_conv_kernel_dim);
    o.gdn.neg_exp_A = u.floats(g.neg_exp_A);
    o.gdn.dt_bias = u.floats(g.dt_bias);
    o.gdn.norm = u.floats(g.norm);
    o.gdn.w_out = u.matrix(g.out_proj);
  } else {
    const auto& a = l.attn;
    o.attn.w_qkv = u.matrix({{&a.q_proj.w, 0, a.q_proj.out()}, {&a.k_proj.w, 0, a.k_proj.out()}, {&a.v_proj.w, 0, a.v_proj.out()}}, H);
    o.attn.w_o = u.matrix(a.o_proj);
    o.attn.q_norm = u.floats(a.q_norm_scale);
    o.attn.k_norm = u.floats(a.k_norm_scale);
  }
  o.mlp.w_gate_up = u.matrix({{&l.mlp.gate_proj.w, 0, l.mlp.gate_proj.out()}, {&l.mlp.up_proj.w, 0, l.mlp.up_proj.out()}}, H);
  o.mlp.w_down = u.matrix(l.mlp.down_proj);
  return o;
}

void upload_all(Uploader& u, const Model& model, DeviceWeights& w) {
  const ModelConfig& c = model.config();
  const ModelWeights& mw = model.weights();
  w.layers.clear();
  for (const auto& l : mw.layers) w.layers.push_back(upload_layer(u, c, l));
  w.final_norm_scale = u.floats(mw.final_norm_scale);
  w.embed = u.matrix({RowRun{&mw.embed_tokens, 0, c.vocab_size}}, c.hidden_size);
  w.lm_head = c.tie_word_embeddings ? w.embed : u.matrix(mw.lm_head);
  std::vector<float> inv_freq(static_cast<std::size_t>(std::max(1, c.rotary_dim / 2)));
  for (int i = 0; i < c.rotary_dim / 2; ++i)
    inv_freq[static_cast<std::size_t>(i)] =
        static_cast<float>(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.rotary_dim));
  w.inv_freq = u.floats(inv_freq);
  if (mw.mtp) {
    MtpW m;
    m.fc = u.matrix(mw.mtp->fc);
    m.pre_fc_norm_embedding_scale = u.floats(mw.mtp->pre_fc_norm_embedding_scale);
    m.pre_fc_norm_hidden_scale = u.floats(mw.mtp->pre_fc_norm_hidden_scale);
    m.norm_scale = u.floats(mw.mtp->norm_scale);
    m.layer = upload_layer(u, c, mw.mtp->layer);
    w.mtp = m;
  }
}

std::shared_ptr<const DeviceWeights> device_weights(const Model& model, int device,
                                                    const std::function<void(std::size_t, std::size_t)>& progress) {
  open_device(device);
  check_config(model.config());
  auto made = detail::ModelInternals::prepared(model, fmt::format("cuda:{}", device), [&]() -> std::shared_ptr<const void> {
    auto w = std::make_shared<DeviceWeights>();
    w->device = device;
    Uploader u(model.config(), progress);
    upload_all(u, model, *w);  // counts
    w->memory = DeviceMemory(u.bytes(), "model weights");
    u.begin_copy(w->memory.get(), w.get());
    upload_all(u, model, *w);
    return w;
  });
  return std::static_pointer_cast<const DeviceWeights>(made);
}

// ---- per-context state --------------------------------------------------------------------------

struct DeviceStateCopy final : StateCopy {
  DeviceMemory conv, recurrent;
};

class CudaBackend;

// The kernel set of one pass (what layers::Decoder calls), over the backend's buffers.
class CudaPass {
 public:
  using Weights = DeviceWeights;
  using GdnWeights = GdnW;
  using AttentionWeights = AttnW;
  using MlpWeights = MlpW;

  CudaPass(CudaBackend& b, bool mtp) : b_(b), mtp_(mtp) {}
  void embed(const Weights& w);
  void norm(const float* scale);
  void add_and_norm(const float* scale);
  void add() { pending_add_ = true; }
  void outputs(const Weights& w, const float* scale);
  void mtp_input(const Weights& w, const MtpW& m);
  void mtp_fc(const MtpW& m);
  void gdn_in_proj(const GdnW& w);
  void gdn_conv(const GdnW& w, int g);
  void gdn_gates(const GdnW&) {}  // fused into the recurrence kernels
  void gdn_delta_rule(const GdnW& w, int g);
  void gdn_output(const GdnW& w);
  void attn_in_proj(const AttnW& w);
  void attn_append(const AttnW& w, int kv_layer);
  void attn_core(const AttnW& w, int kv_layer);
  void attn_output(const AttnW& w);
  void mlp_gate_up(const MlpW& w);
  void mlp_swiglu(const MlpW& w);
  void mlp_down(const MlpW& w);

 private:
  CudaBackend& b_;
  bool mtp_;
  bool pending_add_ = false;
};

// Where the pieces of one pass's plan live (int32 words), at fixed offsets so that graphs captured
// for one pass replay for every pass of the same shape.
struct PlanLayout {
  std::size_t tokens, cu_all, cu_bc, cu_c, slots, kv_lens, page_indptr, record, out_rows, logit_rows, page_indices, words;
  PlanLayout(int rows, int seqs, std::int64_t pages) {
    std::size_t at = 0;
    const auto take = [&](std::size_t n) {
      const std::size_t here = at;
      at += (n + 63) / 64 * 64;  // 256-byte aligned pieces
      return here;
    };
    tokens = take(static_cast<std::size_t>(rows));
    cu_all = take(static_cast<std::size_t>(seqs) + 1);
    cu_bc = take(static_cast<std::size_t>(seqs) + 1);
    cu_c = take(static_cast<std::size_t>(seqs) + 1);
    slots = take(static_cast<std::size_t>(seqs));
    kv_lens = take(static_cast<std::size_t>(seqs));
    page_indptr = take(static_cast<std::size_t>(seqs) + 1);
    record = take(static_cast<std::size_t>(seqs));
    out_rows = take(static_cast<std::size_t>(rows));
    logit_rows = take(static_cast<std::size_t>(rows));
    page_indices = take(static_cast<std::size_t>(std::max<std::int64_t>(pages, 1)));
    words = at;
  }
};

class CudaBackend final : public BackendInterface {
 public:
  CudaBackend(std::shared_ptr<const Model> model, const BackendParams& params)
      : model_(std::move(model)), c_(model_->config()), p_(params), info_(open_device(params.device)) {
    check_config(c_);
    if (p_.state_dtype != DType::f32)
      throw Error(Status::invalid_argument,
                  "the CUDA backend keeps the GDN recurrent state in float32 (state_dtype bf16 is CPU-only)");
    if (p_.max_rollback_tokens > kShortTokens)
      throw Error(Status::invalid_argument,
                  fmt::format("the CUDA backend keeps per-token state snapshots for rollback; max_rollback_tokens must "
                              "be at most {}, got {}",
                              kShortTokens, p_.max_rollback_tokens));
    if (p_.tiled_value_heads)
      throw Error(Status::invalid_argument, "the GGUF value-head order fault is injected by the CPU backend only");
    weights_ = device_weights(*model_, p_.device, {});
    allocate();
    check(rt::stream_create(&stream_), "creating a stream");
    if (gemm_.init() != 0) throw Error(Status::internal, "CUDA backend: cuBLASLt initialisation failed");
    layout_.state_dtype = DType::f32;
    layout_.kv_dtype = DType::bf16;
    layout_.gdn_layers = gdn_layers_;
    layout_.conv_floats = conv_per_layer_;
    layout_.recurrent_elements = rec_per_layer_;
    layout_.kv_layers = kv_layers_;
    layout_.kv_dim = c_.attn_kv_dim();
    layout_.page_size = p_.kv_page_size;
  }

  ~CudaBackend() override {
    for (auto& [key, g] : graphs_) (void)rt::graph_destroy(g.exec);
    if (stream_ != nullptr) (void)rt::stream_destroy(stream_);
  }

  const char* name() const noexcept override { return "cuda"; }
  const StateLayout& layout() const noexcept override { return layout_; }

  void forward(const PassPlan& plan, const PassOutputs& out) override;

  void clear_slot(int slot) override {
    guarded([&] {
      check(rt::memset_async(conv_slot(slot), 0, conv_slot_bytes(), stream_), "clearing a slot");
      check(rt::memset_async(rec_slot(slot), 0, rec_slot_bytes(), stream_), "clearing a slot");
      sync("clearing a slot");
    });
  }

  void copy_slot(int from, int to) override {
    guarded([&] {
      check(rt::memcpy_async(conv_slot(to), conv_slot(from), conv_slot_bytes(), cudaMemcpyDeviceToDevice, stream_), "copying a slot");
      check(rt::memcpy_async(rec_slot(to), rec_slot(from), rec_slot_bytes(), cudaMemcpyDeviceToDevice, stream_), "copying a slot");
      sync("copying a slot");
    });
  }

  void copy_kv_page(std::int32_t from, std::int32_t to) override {
    guarded([&] {
      check(rt::memcpy_async(kv_page(to), kv_page(from), kv_page_bytes(), cudaMemcpyDeviceToDevice, stream_), "copying a KV page");
      sync("copying a KV page");
    });
  }

  void rollback(int slot, std::int64_t keep) override;

  std::unique_ptr<StateCopy> save_slot(int slot) override {
    check(rt::set_device(p_.device), "selecting the device");
    auto copy = std::make_unique<DeviceStateCopy>();
    copy->conv = DeviceMemory(conv_slot_bytes(), "snapshot");  // out of memory: nothing written, still usable
    copy->recurrent = DeviceMemory(rec_slot_bytes(), "snapshot");
    guarded([&] {
      check(rt::memcpy_async(copy->conv.get(), conv_slot(slot), conv_slot_bytes(), cudaMemcpyDeviceToDevice, stream_), "taking a snapshot");
      check(rt::memcpy_async(copy->recurrent.get(), rec_slot(slot), rec_slot_bytes(), cudaMemcpyDeviceToDevice, stream_), "taking a snapshot");
      sync("taking a snapshot");
    });
    return copy;
  }

  void restore_slot(int slot, const StateCopy& copy) override {
    const auto& d = static_cast<const DeviceStateCopy&>(copy);
    guarded([&] {
      check(rt::memcpy_async(conv_slot(slot), d.conv.get(), conv_slot_bytes(), cudaMemcpyDeviceToDevice, stream_), "restoring a snapshot");
      check(rt::memcpy_async(rec_slot(slot), d.recurrent.get(), rec_slot_bytes(), cudaMemcpyDeviceToDevice, stream_), "restoring a snapshot");
      sync("restoring a snapshot");
    });
  }

  void read_slot(int slot, float* conv, std::byte* recurrent) override {
    std::vector<std::uint16_t> h(static_cast<std::size_t>(gdn_layers_ * conv_per_layer_));
    guarded([&] {
      check(rt::memcpy_async(h.data(), conv_slot(slot), h.size() * 2, cudaMemcpyDeviceToHost, stream_), "reading a slot");
      check(rt::memcpy_async(recurrent, rec_slot(slot), static_cast<std::size_t>(gdn_layers_ * rec_per_layer_) * 4,
                             cudaMemcpyDeviceToHost, stream_),
            "reading a slot");
      sync("reading a slot");
    });
    for (std::size_t i = 0; i < h.size(); ++i) conv[i] = to_float(gdn::bf16{h[i]});
  }

  void write_slot(int slot, const float* conv, const std::byte* recurrent) override {
    std::vector<std::uint16_t> h(static_cast<std::size_t>(gdn_layers_ * conv_per_layer_));
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(conv[i]).bits;
    guarded([&] {
      check(rt::memcpy_async(conv_slot(slot), h.data(), h.size() * 2, cudaMemcpyHostToDevice, stream_), "writing a slot");
      check(rt::memcpy_async(rec_slot(slot), recurrent, static_cast<std::size_t>(gdn_layers_ * rec_per_layer_) * 4,
                             cudaMemcpyHostToDevice, stream_),
            "writing a slot");
      sync("writing a slot");
    });
  }

  void read_kv_page(std::int32_t page, float* out) override {
    std::vector<std::uint16_t> h(static_cast<std::size_t>(page_elems_));
    guarded([&] {
      check(rt::memcpy_async(h.data(), kv_page(page), kv_page_bytes(), cudaMemcpyDeviceToHost, stream_), "reading a KV page");
      sync("reading a KV page");
    });
    for (std::size_t i = 0; i < h.size(); ++i) out[i] = to_float(gdn::bf16{h[i]});
  }

  void write_kv_page(std::int32_t page, const float* in) override {
    std::vector<std::uint16_t> h(static_cast<std::size_t>(page_elems_));
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(in[i]).bits;
    guarded([&] {
      check(rt::memcpy_async(kv_page(page), h.data(), kv_page_bytes(), cudaMemcpyHostToDevice, stream_), "writing a KV page");
      sync("writing a KV page");
    });
  }

  std::int64_t rollback_bytes_per_sequence() const noexcept override {
    return p_.max_rollback_tokens > 0
               ? (p_.max_rollback_tokens + 1) * static_cast<std::int64_t>(conv_slot_bytes() + rec_slot_bytes())
               : 0;
  }
  std::int64_t kv_bytes_per_token() const noexcept override {
    return kv_layers_ * 2 * static_cast<std::int64_t>(c_.attn_kv_dim()) * 2;
  }
  bool usable() const noexcept override { return usable_; }

 private:
  friend class CudaPass;

  // Runs fn; a CUDA failure inside makes the backend unusable (state may be half-written).
  template <typename F>
  void guarded(F&& fn) {
    if (!usable_) throw Error(Status::internal, "CUDA backend: unusable after an earlier device failure");
    try {
      check(rt::set_device(p_.device), "selecting the device");  // contexts on several devices may share a thread
      fn();
    } catch (const Error& e) {
      if (e.status() != Status::out_of_capacity || rt::last_error() != cudaSuccess) usable_ = false;
      throw;
    }
  }
  void sync(const char* what) { check(rt::stream_synchronize(stream_), what); }

  void allocate();
  void build_plan(const PassPlan& plan);
  void run_pass(const PassPlan& plan);
  // Copies output rows [k0, k0 + m) of the pass (and their logits) from the pinned buffers.
  void copy_outputs(const PassPlan& plan, const PassOutputs& out, int k0, int m, int logit0, int n_logit);
  std::string graph_key(const PassPlan& plan) const;

  // y[rows of this pass] = x · Wᵀ: long rows through cuBLASLt, short ones through the GEMV kernel.
  void linear(const bf16* x, std::int64_t ldx, const bf16* w, int in, int out, void* y, std::int64_t ldy, bool f32_out,
              int row0, int rows_long, int rows_short);
  void project(const bf16* x, std::int64_t ldx, const bf16* w, int in, int out, void* y, std::int64_t ldy) {
    linear(x, ldx, w, in, out, y, ldy, false, 0, rows_ab_, rows_c_);
  }
  // The paged KV view of one KV layer, for the pass's sequences from group position `first_seq`.
  PagedKv paged(int kv_layer, int first_seq) const;
  std::int32_t* plan(std::size_t offset) const { return plan_dev_ + offset; }

  // A slot's state, every GDN layer, at strides padded to 16 bytes (the snapshot copies move 16 bytes a thread).
  bf16* conv_slot(int s) const { return conv_pool_ + static_cast<std::int64_t>(s) * conv_stride_; }
  float* rec_slot(int s) const { return rec_pool_ + static_cast<std::int64_t>(s) * rec_stride_; }
  bf16* kv_page(std::int32_t p) const { return kv_pool_ + static_cast<std::int64_t>(p) * page_elems_; }
  std::size_t conv_slot_bytes() const { return static_cast<std::size_t>(conv_stride_) * 2; }
  std::size_t rec_slot_bytes() const { return static_cast<std::size_t>(rec_stride_) * 4; }
  std::size_t kv_page_bytes() const { return static_cast<std::size_t>(page_elems_) * 2; }

  std::shared_ptr<const Model> model_;
  const ModelConfig& c_;
  BackendParams p_;
  rt::DeviceInfo info_;
  std::shared_ptr<const DeviceWeights> weights_;
  cudaStream_t stream_ = nullptr;
  Gemm gemm_;
  StateLayout layout_;
  bool usable_ = true;

  // Sizes.
  std::int64_t gdn_layers_ = 0, conv_per_layer_ = 0, rec_per_layer_ = 0, kv_layers_ = 0, page_elems_ = 0;
  std::int64_t conv_stride_ = 0, rec_stride_ = 0;  // elements per slot, padded
  std::int64_t ld_proj_ = 0, ld_core_ = 0, pages_per_seq_ = 0;
  int U_ = 0, out_cap_ = 0, split_len_ = 0, splits_ = 1;

  // Device memory: state, then work buffers.
  DeviceMemory state_mem_, work_mem_;
  bf16* conv_pool_ = nullptr;
  float* rec_pool_ = nullptr;
  bf16* kv_pool_ = nullptr;
  bf16* snap_conv_ = nullptr;  // [slot][T + 1][conv slot]: the step's start, then after each token
  float* snap_rec_ = nullptr;
  bf16 *x_ = nullptr, *xn_ = nullptr, *mix_ = nullptr, *proj_ = nullptr, *conv_out_ = nullptr, *core_ = nullptr,
       *q_ = nullptr, *act_ = nullptr, *mtp_in_ = nullptr, *hid_in_ = nullptr, *hid_out_ = nullptr, *hid_logit_ = nullptr;
  float *chunk_ws_ = nullptr, *attn_ws_ = nullptr, *logits_ = nullptr;
  std::int32_t* plan_dev_ = nullptr;
  std::int32_t* small_dev_ = nullptr;  // rollback's slot and keep

  // Pinned host memory: the plan, the MTP hidden input, the outputs.
  PinnedMemory plan_host_, hid_in_host_, hid_out_host_, logits_host_, small_host_;
  std::optional<PlanLayout> plan_layout_;

  // The current pass, in the backend's row order (groups A, B, C).
  std::vector<int> order_;            // plan segment index of each group position
  std::vector<std::int64_t> seg_row_; // first row of each plan segment in the new order
  int n_a_ = 0, n_b_ = 0, n_c_ = 0, rows_a_ = 0, rows_ab_ = 0, rows_c_ = 0, rows_ = 0;
  int max_a_ = 0, max_ab_ = 0, max_bc_ = 0, max_c_ = 0;
  bool any_record_ = false;
  int n_out_ = 0, n_logit_ = 0;
  const PassPlan* plan_ = nullptr;      // the pass being run
  const PassOutputs* outputs_ = nullptr;

  struct Graph {
    rt::GraphExec exec = nullptr;
    std::uint64_t last_use = 0;
    int seen = 0;
  };
  std::map<std::string, Graph> graphs_;
  std::uint64_t pass_counter_ = 0;
};


// ---- allocation ---------------------------------------------------------------------------------

std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

void CudaBackend::allocate() {
  const ModelConfig& c = c_;
  const std::int64_t H = c.hidden_size, C = c.gdn_conv_dim(), Vd = c.gdn_value_dim(), Hv = c.linear_num_value_heads;
  const std::int64_t qd = c.attn_q_dim(), kvd = c.attn_kv_dim(), I = c.intermediate_size, V = c.vocab_size;
  gdn_layers_ = c.count_layers(LayerKind::linear_attention);
  conv_per_layer_ = static_cast<std::int64_t>(c.linear_conv_kernel_dim - 1) * C;
  rec_per_layer_ = Hv * c.linear_key_head_dim * c.linear_value_head_dim;
  conv_stride_ = round_up(gdn_layers_ * conv_per_layer_, 8);
  rec_stride_ = round_up(gdn_layers_ * rec_per_layer_, 4);
  kv_layers_ = p_.kv_pages > 0 ? c.count_layers(LayerKind::full_attention) + (model_->has_mtp() ? 1 : 0) : 0;
  page_elems_ = kv_layers_ * 2 * c.num_key_value_heads * static_cast<std::int64_t>(p_.kv_page_size) * c.head_dim;
  U_ = p_.max_pass_rows;
  out_cap_ = std::clamp(p_.max_output_rows, 1, U_);
  pages_per_seq_ = (p_.max_context + p_.kv_page_size - 1) / p_.kv_page_size;
  split_len_ = attention_decode_split_len(p_.max_context);
  splits_ = attention_decode_splits(p_.max_context, split_len_);
  ld_proj_ = round_up(std::max({C + Vd + 2 * Hv, 2 * qd + 2 * kvd, 2 * I, std::int64_t{1}}), 8);
  ld_core_ = round_up(std::max({Vd, qd, std::int64_t{1}}), 8);
  const std::int64_t T = p_.max_rollback_tokens;
  const std::size_t slots = static_cast<std::size_t>(p_.slots), u = static_cast<std::size_t>(U_);
  plan_layout_.emplace(U_, p_.slots, static_cast<std::int64_t>(p_.slots) * pages_per_seq_);

  const auto carve_state = [&](Carver& k) {
    conv_pool_ = k.take<bf16>(slots * static_cast<std::size_t>(conv_stride_));
    rec_pool_ = k.take<float>(slots * static_cast<std::size_t>(rec_stride_));
    kv_pool_ = k.take<bf16>(static_cast<std::size_t>(p_.kv_pages * page_elems_));
    snap_conv_ = T > 0 ? k.take<bf16>(slots * static_cast<std::size_t>((T + 1) * conv_stride_)) : nullptr;
    snap_rec_ = T > 0 ? k.take<float>(slots * static_cast<std::size_t>((T + 1) * rec_stride_)) : nullptr;
  };
  const auto carve_work = [&](Carver& k) {
    x_ = k.take<bf16>(u * H);
    xn_ = k.take<bf16>(u * H);
    mix_ = k.take<bf16>(u * H);
    proj_ = k.take<bf16>(u * ld_proj_);
    conv_out_ = k.take<bf16>(u * std::max<std::int64_t>(C, 1));
    core_ = k.take<bf16>(u * ld_core_);
    q_ = k.take<bf16>(u * std::max<std::int64_t>(qd, 1));
    act_ = k.take<bf16>(u * I);
    mtp_in_ = k.take<bf16>(u * 2 * H);
    hid_in_ = k.take<bf16>(u * H);
    hid_out_ = k.take<bf16>(static_cast<std::size_t>(out_cap_) * H);
    hid_logit_ = k.take<bf16>(static_cast<std::size_t>(out_cap_) * H);
    chunk_ws_ = k.take<float>(gdn_chunked_workspace_bytes(U_, static_cast<int>(Hv)) / 4 + 1);
    attn_ws_ = k.take<float>(attention_decode_workspace_bytes(U_, c.num_attention_heads, c.head_dim, splits_) / 4 + 1);
    logits_ = k.take<float>(static_cast<std::size_t>(out_cap_) * V);
    plan_dev_ = k.take<std::int32_t>(plan_layout_->words);
    small_dev_ = k.take<std::int32_t>(64);
  };
  Carver count;
  carve_state(count);
  state_mem_ = DeviceMemory(count.used(), "sequence state (GDN state, conv history, KV cache, rollback snapshots)");
  Carver state;
  state.start(state_mem_.get());
  carve_state(state);
  Carver count_work;
  carve_work(count_work);
  work_mem_ = DeviceMemory(count_work.used(), "work buffers of a pass");
  Carver work;
  work.start(work_mem_.get());
  carve_work(work);
  plan_host_ = PinnedMemory(plan_layout_->words * 4);
  hid_in_host_ = PinnedMemory(u * H * 2);
  hid_out_host_ = PinnedMemory(static_cast<std::size_t>(out_cap_) * H * 2);
  logits_host_ = PinnedMemory(static_cast<std::size_t>(out_cap_) * V * 4);
  small_host_ = PinnedMemory(64 * 4);
  // Fresh state: zero conv history and recurrent state (slots are cleared when taken, too).
  check(rt::memset_async(state_mem_.get(), 0, state_mem_.bytes(), nullptr), "clearing the state");
  check(rt::stream_synchronize(nullptr), "clearing the state");
}

PagedKv CudaBackend::paged(int kv_layer, int first_seq) const {
  const PlanLayout& L = *plan_layout_;
  PagedKv kv;
  const std::int64_t per_head = static_cast<std::int64_t>(p_.kv_page_size) * c_.head_dim;
  kv.data = kv_pool_ + static_cast<std::int64_t>(kv_layer) * 2 * c_.num_key_value_heads * per_head;
  kv.page_stride = page_elems_;
  kv.kv_stride = c_.num_key_value_heads * per_head;
  kv.head_stride = per_head;
  kv.row_stride = c_.head_dim;
  kv.page_size = p_.kv_page_size;
  kv.page_indptr = plan(L.page_indptr) + first_seq;
  kv.page_indices = plan(L.page_indices);
  kv.kv_lens = plan(L.kv_lens) + first_seq;
  return kv;
}

// ---- a pass -------------------------------------------------------------------------------------

void CudaBackend::build_plan(const PassPlan& plan) {
  const PlanLayout& L = *plan_layout_;
  const auto segs = plan.segments;
  const int short_below = std::min(p_.gdn_chunk_min_tokens, kShortTokens + 1);
  const auto group = [&](const PassSegment& s) {
    if (s.record || s.n < short_below) return 2;
    return s.n >= p_.gdn_chunk_min_tokens ? 0 : 1;
  };
  order_.clear();
  for (int g = 0; g < 3; ++g)
    for (std::size_t i = 0; i < segs.size(); ++i)
      if (group(segs[i]) == g) order_.push_back(static_cast<int>(i));
  n_a_ = n_b_ = n_c_ = rows_a_ = rows_ab_ = rows_c_ = 0;
  max_a_ = max_ab_ = max_bc_ = max_c_ = 0;
  any_record_ = false;
  std::int32_t* h = plan_host_.get<std::int32_t>();
  seg_row_.assign(segs.size(), 0);
  std::int32_t row = 0, row_bc = 0, row_c = 0, pages = 0;
  h[L.cu_all] = h[L.cu_bc] = h[L.cu_c] = 0;
  h[L.page_indptr] = 0;
  for (std::size_t k = 0; k < order_.size(); ++k) {
    const PassSegment& s = segs[static_cast<std::size_t>(order_[k])];
    const int g = group(s), n = static_cast<int>(s.n);
    seg_row_[static_cast<std::size_t>(order_[k])] = row;
    for (int t = 0; t < n; ++t) h[L.tokens + static_cast<std::size_t>(row + t)] = plan.tokens[static_cast<std::size_t>(s.row + t)];
    row += n;
    h[L.cu_all + k + 1] = row;
    if (g == 0) {
      ++n_a_;
      rows_a_ += n;
      max_a_ = std::max(max_a_, n);
    }
    if (g <= 1) {
      rows_ab_ += n;
      max_ab_ = std::max(max_ab_, n);
    }
    if (g >= 1) {
      row_bc += n;
      h[L.cu_bc + (k - static_cast<std::size_t>(n_a_)) + 1] = row_bc;
      max_bc_ = std::max(max_bc_, n);
    }
    if (g == 1) ++n_b_;
    if (g == 2) {
      ++n_c_;
      row_c += n;
      rows_c_ += n;
      h[L.cu_c + static_cast<std::size_t>(n_c_)] = row_c;
      max_c_ = std::max(max_c_, n);
    }
    h[L.slots + k] = s.slot;
    h[L.kv_lens + k] = static_cast<std::int32_t>(s.pos + s.n);
    h[L.record + k] = s.record ? 1 : 0;
    any_record_ = any_record_ || s.record;
    if (kv_layers_ > 0) {
      const auto& table = plan.page_tables[static_cast<std::size_t>(s.slot)];
      const std::int64_t need = (s.pos + s.n + p_.kv_page_size - 1) / p_.kv_page_size;
      for (std::int64_t i = 0; i < need; ++i) h[L.page_indices + static_cast<std::size_t>(pages + i)] = table[static_cast<std::size_t>(i)];
      pages += static_cast<std::int32_t>(need);
    }
    h[L.page_indptr + k + 1] = pages;
  }
  rows_ = row;
  // Outputs, in plan order: the row they read in the new order, and which of them want logits.
  n_out_ = static_cast<int>(plan.outputs.size());
  n_logit_ = 0;
  std::size_t si = 0;
  for (int k = 0; k < n_out_; ++k) {
    const PassOutput& o = plan.outputs[static_cast<std::size_t>(k)];
    while (o.row >= segs[si].row + segs[si].n) ++si;
    h[L.out_rows + static_cast<std::size_t>(k)] = static_cast<std::int32_t>(seg_row_[si] + (o.row - segs[si].row));
    // Chunk-local indices: the logit rows of output chunk [k0, k0 + out_cap) are contiguous here.
    if (o.logits) h[L.logit_rows + static_cast<std::size_t>(n_logit_++)] = k % out_cap_;
  }
  if (plan.mtp) {
    auto* hid = hid_in_host_.get<std::uint16_t>();
    const std::int64_t H = c_.hidden_size;
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const PassSegment& s = segs[static_cast<std::size_t>(order_[k])];
      const std::int64_t r0 = seg_row_[static_cast<std::size_t>(order_[k])];
      for (std::int64_t t = 0; t < s.n; ++t)
        for (std::int64_t i = 0; i < H; ++i) hid[(r0 + t) * H + i] = to_bf16(plan.hidden[(s.row + t) * H + i]).bits;
    }
  }
}

std::string CudaBackend::graph_key(const PassPlan& plan) const {
  std::string key(plan.mtp ? "m" : "s");
  for (const int i : order_) {
    const PassSegment& s = plan.segments[static_cast<std::size_t>(i)];
    key += fmt::format("{}{},", s.n, s.record ? "r" : "");
  }
  key += fmt::format("o{}l{}", n_out_, n_logit_);
  for (const auto& o : plan.outputs) key += o.logits ? '1' : '0';
  return key;
}

void CudaBackend::linear(const bf16* x, std::int64_t ldx, const bf16* w, int in, int out, void* y, std::int64_t ldy,
                         bool f32_out, int row0, int rows_long, int rows_short) {
  const std::size_t y_elem = f32_out ? 4 : 2;
  const auto run_gemm = [&](int r0, int rows) {
    if (rows == 0) return;
    GemmArgs a;
    a.x = x + static_cast<std::int64_t>(r0) * ldx;
    a.ldx = ldx;
    a.w = w;
    a.ldw = in;
    a.y = static_cast<char*>(y) + static_cast<std::int64_t>(r0) * ldy * static_cast<std::int64_t>(y_elem);
    a.ldy = ldy;
    a.out_type = f32_out ? GemmOut::float32 : GemmOut::bfloat16;
    a.rows = rows;
    a.in = in;
    a.out = out;
    const int st = gemm_.run(a, stream_);
    if (st != 0) throw Error(Status::internal, fmt::format("CUDA backend: cuBLASLt matmul {}×{}×{} failed (status {})", rows, in, out, st));
  };
  run_gemm(row0, rows_long);
  if (rows_short == 0) return;
  if (rows_short > kGemvMaxRows) return run_gemm(row0 + rows_long, rows_short);
  GemvParams g;
  g.x = x + static_cast<std::int64_t>(row0 + rows_long) * ldx;
  g.ldx = ldx;
  g.w = w;
  g.ldw = in;
  g.y = static_cast<char*>(y) + static_cast<std::int64_t>(row0 + rows_long) * ldy * static_cast<std::int64_t>(y_elem);
  g.ldy = ldy;
  g.f32_out = f32_out;
  g.rows = rows_short;
  g.in = in;
  g.out = out;
  check(gemv(g, stream_), "the projection kernel");
}

void CudaBackend::run_pass(const PassPlan& plan) {
  const PlanLayout& L = *plan_layout_;
  check(rt::memcpy_async(plan_dev_, plan_host_.get(), L.words * 4, cudaMemcpyHostToDevice, stream_), "uploading the plan");
  if (plan.mtp)
    check(rt::memcpy_async(hid_in_, hid_in_host_.get(), static_cast<std::size_t>(rows_) * c_.hidden_size * 2,
                           cudaMemcpyHostToDevice, stream_),
          "uploading the MTP input");
  CudaPass k(*this, plan.mtp);
  if (plan.mtp) layers::Decoder<CudaPass>::forward_mtp(k, *weights_, c_);
  else layers::Decoder<CudaPass>::forward(k, *weights_, c_);
}

void CudaBackend::forward(const PassPlan& plan, const PassOutputs& out) {
  guarded([&] {
    build_plan(plan);
    plan_ = &plan;
    outputs_ = &out;
    ++pass_counter_;
    const bool graphable = p_.cuda_graphs && n_a_ == 0 && n_b_ == 0 && n_out_ <= out_cap_;
    if (graphable) {
      const std::string key = graph_key(plan);
      Graph& g = graphs_[key];
      g.last_use = pass_counter_;
      if (g.exec == nullptr && ++g.seen >= 2) {
        // Seen before: capture this one and replay it from now on.
        check(rt::capture_begin(stream_), "capturing a CUDA graph");
        try {
          run_pass(plan);
        } catch (...) {
          rt::GraphExec junk = nullptr;
          (void)rt::capture_end(stream_, &junk);
          (void)rt::graph_destroy(junk);
          throw;
        }
        check(rt::capture_end(stream_, &g.exec), "capturing a CUDA graph");
      }
      if (g.exec != nullptr) check(rt::graph_launch(g.exec, stream_), "launching a CUDA graph");
      else run_pass(plan);
      if (graphs_.size() > kMaxGraphs) {  // forget the least recently used shape
        auto lru = graphs_.begin();
        for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
          if (it->second.last_use < lru->second.last_use) lru = it;
        (void)rt::graph_destroy(lru->second.exec);
        graphs_.erase(lru);
      }
    } else {
      run_pass(plan);
    }
    sync("running a pass");
    if (n_out_ <= out_cap_) copy_outputs(plan, out, 0, n_out_, 0, n_logit_);
    plan_ = nullptr;
    outputs_ = nullptr;
  });
}

void CudaBackend::copy_outputs(const PassPlan& plan, const PassOutputs& out, int k0, int m, int logit0, int n_logit) {
  const std::int64_t H = c_.hidden_size, V = c_.vocab_size;
  const auto* hid = hid_out_host_.get<std::uint16_t>();
  const float* logits = logits_host_.get<float>();
  int j = 0;
  for (int k = 0; k < m; ++k) {
    const PassOutput& o = plan.outputs[static_cast<std::size_t>(k0 + k)];
    float* dst = out.hidden + o.out_row * H;
    for (std::int64_t i = 0; i < H; ++i) dst[i] = to_float(gdn::bf16{hid[k * H + i]});
    if (o.logits) {
      std::memcpy(out.logits + o.out_row * V, logits + static_cast<std::int64_t>(j) * V, static_cast<std::size_t>(V) * 4);
      ++j;
    }
  }
  (void)logit0;
  (void)n_logit;
}

void CudaBackend::rollback(int slot, std::int64_t keep) {
  guarded([&] {
    auto* h = small_host_.get<std::int32_t>();
    h[0] = slot;
    h[1] = static_cast<std::int32_t>(keep + 1);  // entry keep: the state after `keep` tokens (0: the start)
    check(rt::memcpy_async(small_dev_, h, 8, cudaMemcpyHostToDevice, stream_), "rolling back");
    const std::int64_t T1 = p_.max_rollback_tokens + 1;
    SnapshotSelect sel;
    sel.slots = small_dev_;
    sel.keep = small_dev_ + 1;
    sel.num_seqs = 1;
    sel.pool = conv_pool_;
    sel.slot_stride_bytes = static_cast<std::int64_t>(conv_slot_bytes());
    sel.snapshots = snap_conv_;
    sel.token_stride_bytes = static_cast<std::int64_t>(conv_slot_bytes());
    sel.seq_stride_bytes = T1 * sel.token_stride_bytes;
    sel.bytes = static_cast<std::int64_t>(conv_slot_bytes());
    check(select_snapshots(sel, stream_), "rolling back the conv history");
    sel.pool = rec_pool_;
    sel.slot_stride_bytes = static_cast<std::int64_t>(rec_slot_bytes());
    sel.snapshots = snap_rec_;
    sel.token_stride_bytes = static_cast<std::int64_t>(rec_slot_bytes());
    sel.seq_stride_bytes = T1 * sel.token_stride_bytes;
    sel.bytes = static_cast<std::int64_t>(rec_slot_bytes());
    check(select_snapshots(sel, stream_), "rolling back the recurrent state");
    sync("rolling back");
  });
}

// ---- the kernel set ---------------------------------------------------------------------------

void CudaPass::embed(const Weights& w) {
  CudaBackend& b = b_;
  const PlanLayout& L = *b.plan_layout_;
  const int H = b.c_.hidden_size;
  check(embedding_gather(w.embed, H, b.plan(L.tokens), b.x_, H, b.rows_, H, b.stream_), "embedding_gather");
  if (!mtp_ && b.any_record_ && b.gdn_layers_ > 0) {
    // The recorded sequences' state at the start of the step: snapshot entry 0 of their slots.
    const std::int64_t T1 = b.p_.max_rollback_tokens + 1;
    SnapshotSelect sel;
    sel.slots = b.plan(L.slots);
    sel.keep = b.plan(L.record);
    sel.num_seqs = static_cast<int>(b.order_.size());
    sel.to_snapshots = true;
    sel.pool = b.conv_pool_;
    sel.slot_stride_bytes = sel.token_stride_bytes = sel.bytes = static_cast<std::int64_t>(b.conv_slot_bytes());
    sel.snapshots = b.snap_conv_;
    sel.seq_stride_bytes = T1 * sel.token_stride_bytes;
    check(select_snapshots(sel, b.stream_), "saving the step's start state");
    sel.pool = b.rec_pool_;
    sel.slot_stride_bytes = sel.token_stride_bytes = sel.bytes = static_cast<std::int64_t>(b.rec_slot_bytes());
    sel.snapshots = b.snap_rec_;
    sel.seq_stride_bytes = T1 * sel.token_stride_bytes;
    check(select_snapshots(sel, b.stream_), "saving the step's start state");
  }
}

void CudaPass::norm(const float* scale) {
  const int H = b_.c_.hidden_size;
  check(rmsnorm(b_.x_, H, nullptr, 0, scale, 0.0f, b_.xn_, H, b_.rows_, H, b_.c_.rms_norm_eps, b_.stream_), "rmsnorm");
}

void CudaPass::add_and_norm(const float* scale) {
  const int H = b_.c_.hidden_size;
  // x ← bf16(x + out) and xn ← rms_norm(x), in one kernel.
  check(rmsnorm(b_.mix_, H, b_.x_, H, scale, 0.0f, b_.xn_, H, b_.rows_, H, b_.c_.rms_norm_eps, b_.stream_), "rmsnorm");
  pending_add_ = false;
}

void CudaPass::outputs(const Weights& w, const float* scale) {
  CudaBackend& b = b_;
  const PlanLayout& L = *b.plan_layout_;
  const int H = b.c_.hidden_size, V = b.c_.vocab_size;
  // The last residual add is fused into the final norm.
  if (pending_add_) check(rmsnorm(b.mix_, H, b.x_, H, scale, 0.0f, b.xn_, H, b.rows_, H, b.c_.rms_norm_eps, b.stream_), "rmsnorm");
  else check(rmsnorm(b.x_, H, nullptr, 0, scale, 0.0f, b.xn_, H, b.rows_, H, b.c_.rms_norm_eps, b.stream_), "rmsnorm");
  pending_add_ = false;
  const auto& outs = b.plan_->outputs;
  int logit_at = 0;
  for (int k0 = 0; k0 < b.n_out_; k0 += b.out_cap_) {
    const int m = std::min(b.out_cap_, b.n_out_ - k0);
    int n_logit = 0;
    bool all = true;
    for (int k = k0; k < k0 + m; ++k) {
      n_logit += outs[static_cast<std::size_t>(k)].logits ? 1 : 0;
      all = all && outs[static_cast<std::size_t>(k)].logits;
    }
    check(embedding_gather(b.xn_, H, b.plan(L.out_rows) + k0, b.hid_out_, H, m, H, b.stream_), "gathering the output rows");
    check(rt::memcpy_async(b.hid_out_host_.get(), b.hid_out_, static_cast<std::size_t>(m) * H * 2, cudaMemcpyDeviceToHost,
                           b.stream_),
          "copying the hidden states out");
    if (n_logit > 0) {
      const bf16* src = b.hid_out_;
      if (!all) {
        check(embedding_gather(b.hid_out_, H, b.plan(L.logit_rows) + logit_at, b.hid_logit_, H, n_logit, H, b.stream_),
              "gathering the logit rows");
        src = b.hid_logit_;
      }
      b.linear(src, H, w.lm_head, H, V, b.logits_, V, true, 0, n_logit > kGemvMaxRows ? n_logit : 0,
               n_logit > kGemvMaxRows ? 0 : n_logit);
      check(rt::memcpy_async(b.logits_host_.get(), b.logits_, static_cast<std::size_t>(n_logit) * V * 4, cudaMemcpyDeviceToHost,
                             b.stream_),
            "copying the logits out");
    }
    if (b.n_out_ > b.out_cap_) {
      // More outputs than one buffer holds (never in a graph): hand each chunk over as it is done.
      b.sync("copying the outputs");
      b.copy_outputs(*b.plan_, *b.outputs_, k0, m, logit_at, n_logit);
    }
    logit_at += n_logit;
  }
}

void CudaPass::mtp_input(const Weights& w, const MtpW& m) {
  CudaBackend& b = b_;
  const PlanLayout& L = *b.plan_layout_;
  const int H = b.c_.hidden_size;
  const float eps = b.c_.rms_norm_eps;
  // [rms_norm(embed(x)) ; rms_norm(hidden)], embedding first.
  check(embedding_gather(w.embed, H, b.plan(L.tokens), b.xn_, H, b.rows_, H, b.stream_), "embedding_gather");
  check(rmsnorm(b.xn_, H, nullptr, 0, m.pre_fc_norm_embedding_scale, 0.0f, b.mtp_in_, 2 * H, b.rows_, H, eps, b.stream_), "rmsnorm");
  check(rmsnorm(b.hid_in_, H, nullptr, 0, m.pre_fc_norm_hidden_scale, 0.0f, b.mtp_in_ + H, 2 * H, b.rows_, H, eps, b.stream_),
        "rmsnorm");
}

void CudaPass::mtp_fc(const MtpW& m) {
  const int H = b_.c_.hidden_size;
  b_.project(b_.mtp_in_, 2 * H, m.fc, 2 * H, H, b_.x_, H);
}

void CudaPass::gdn_in_proj(const GdnW& w) {
  const ModelConfig& c = b_.c_;
  const int out = static_cast<int>(c.gdn_conv_dim() + c.gdn_value_dim() + 2 * c.linear_num_value_heads);
  b_.project(b_.xn_, c.hidden_size, w.w_in, c.hidden_size, out, b_.proj_, b_.ld_proj_);
}

void CudaPass::gdn_conv(const GdnW& w, int g) {
  CudaBackend& b = b_;
  const PlanLayout& L = *b.plan_layout_;
  const std::int64_t C = b.c_.gdn_conv_dim();
  Conv1dParams p;
  p.weight = w.conv;
  p.state = b.conv_pool_ + g * b.conv_per_layer_;
  p.state_slot_stride = b.conv_stride_;
  p.channels = static_cast<int>(C);
  p.kernel_size = b.c_.linear_conv_kernel_dim;
  p.ld_x = b.ld_proj_;
  p.ld_out = C;
  if (b.n_a_ + b.n_b_ > 0) {
    Conv1dParams q = p;
    q.x = b.proj_;
    q.out = b.conv_out_;
    q.slots = b.plan(L.slots);
    q.cu_seqlens = b.plan(L.cu_all);
    q.num_seqs = b.n_a_ + b.n_b_;
    check(causal_conv1d_prefill(q, b.max_ab_, b.stream_), "causal_conv1d_prefill");
  }
  if (b.n_c_ > 0) {
    const int first = b.n_a_ + b.n_b_;
    Conv1dParams q = p;
    q.x = b.proj_ + static_cast<std::int64_t>(b.rows_ab_) * b.ld_proj_;
    q.out = b.conv_out_ + static_cast<std::int64_t>(b.rows_ab_) * C;
    q.slots = b.plan(L.slots) + first;
    q.cu_seqlens = b.plan(L.cu_c);
    q.num_seqs = b.n_c_;
    if (!mtp_ && b.any_record_) {
      q.snapshots = b.snap_conv_ + g * b.conv_per_layer_ + b.conv_stride_;  // entry 1: after the first token
      q.snapshot_token_stride = b.conv_stride_;
      q.snapshot_seq_stride = (b.p_.max_rollback_tokens + 1) * b.conv_stride_;
      q.snapshot_record = b.plan(L.record) + first;
    }
    check(causal_conv1d_update(q, b.max_c_, b.stream_), "causal_conv1d_update");
  }
}

void CudaPass::gdn_delta_rule(const GdnW& w, int g) {
  CudaBackend& b = b_;
  const PlanLayout& L = *b.plan_layout_;
  const ModelConfig& c = b.c_;
  const std::int64_t C = c.gdn_conv_dim(), Vd = c.gdn_value_dim(), Kd = c.gdn_key_dim(), Hv = c.linear_num_value_heads;
  const auto params = [&](int row0) {
    GdnParams p;
    p.q = b.conv_out_ + row0 * C;
    p.k = p.q + Kd;
    p.v = p.q + 2 * Kd;
    p.ld_q = p.ld_k = p.ld_v = C;
    p.b = b.proj_ + static_cast<std::int64_t>(row0) * b.ld_proj_ + C + Vd;
    p.a = p.b + Hv;
    p.ld_a = p.ld_b = b.ld_proj_;
    p.neg_exp_A = w.neg_exp_A;
    p.dt_bias = w.dt_bias;
    p.state = b.rec_pool_ + g * b.rec_per_layer_;
    p.state_slot_stride = b.rec_stride_;
    p.out = b.core_ + static_cast<std::int64_t>(row0) * b.ld_core_;
    p.ld_out = b.ld_core_;
    p.num_k_heads = c.linear_num_key_heads;
    p.num_v_heads = c.linear_num_value_heads;
    p.dk = c.linear_key_head_dim;
    p.dv = c.linear_value_head_dim;
    return p;
  };
  if (b.n_a_ > 0) {
    GdnParams p = params(0);
    p.slots = b.plan(L.slots);
    p.cu_seqlens = b.plan(L.cu_all);
    p.num_seqs = b.n_a_;
    check(gdn_chunked(p, b.max_a_, b.chunk_ws_, b.stream_), "gdn_chunked");
  }
  if (b.n_b_ + b.n_c_ > 0) {
    GdnParams p = params(b.rows_a_);
    p.slots = b.plan(L.slots) + b.n_a_;
    p.cu_seqlens = b.plan(L.cu_bc);
    p.num_seqs = b.n_b_ + b.n_c_;
    if (b.any_record_) {
      p.snapshots = b.snap_rec_ + g * b.rec_per_layer_ + b.rec_stride_;  // entry 1: after the first token
      p.snapshot_token_stride = b.rec_stride_;
      p.snapshot_seq_stride = (b.p_.max_rollback_tokens + 1) * b.rec_stride_;
      p.snapshot_record = b.plan(L.record) + b.n_a_;
    }
    check(gdn_recurrent(p, b.max_bc_, b.stream_), "gdn_recurrent");
  }
}

void CudaPass::gdn_output(const GdnW& w) {
  CudaBackend& b = b_;
  const ModelConfig& c = b.c_;
  const std::int64_t C = c.gdn_conv_dim();
  check(rmsnorm_gated(b.core_, b.ld_core_, b.proj_ + C, b.ld_proj_, w.norm, b.core_, b.ld_core_, b.rows_,
                      c.linear_num_value_heads, c.linear_value_head_dim, c.rms_norm_eps, b.stream_),
        "rmsnorm_gated");
  b.project(b.core_, b.ld_core_, w.w_out, static_cast<int>(c.gdn_value_dim()), c.hidden_size, b.mix_, c.hidden_size);
}

void CudaPass::attn_in_proj(const AttnW& w) {
  const ModelConfig& c = b_.c_;
  const int out = static_cast<int>(2 * c.attn_q_dim() + 2 * c.attn_kv_dim());
  b_.project(b_.xn_, c.hidden_size, w.w_qkv, c.hidden_size, out, b_.proj_, b_.ld_proj_);
}

void CudaPass::attn_append(const AttnW& w, int kv_layer) {
  CudaBackend& b = b_;
  const PlanLayout& L = *b.plan_layout_;
  const ModelConfig& c = b.c_;
  const std::int64_t qd = c.attn_q_dim(), kvd = c.attn_kv_dim();
  AttnPrepareParams p;
  p.q_gate = b.proj_;
  p.ld_q = b.ld_proj_;
  p.k = b.proj_ + 2 * qd;
  p.v = p.k + kvd;
  p.ld_k = p.ld_v = b.ld_proj_;
  p.q_norm_scale = w.q_norm;
  p.k_norm_scale = w.k_norm;
  p.inv_freq = b.weights_->inv_freq;
  p.rotary_dim = c.rotary_dim;
  p.eps = c.rms_norm_eps;
  p.q_out = b.q_;
  p.ld_q_out = qd;
  p.kv = b.paged(kv_layer, 0);
  p.cu_seqlens = b.plan(L.cu_all);
  p.num_seqs = static_cast<int>(b.order_.size());
  p.rows = b.rows_;
  p.num_q_heads = c.num_attention_heads;
  p.num_kv_heads = c.num_key_value_heads;
  p.head_dim = c.head_dim;
  check(attention_prepare(p, b.stream_), "attention_prepare");
}

void CudaPass::attn_core(const AttnW&, int kv_layer) {
  CudaBackend& b = b_;
  const PlanLayout& L = *b.plan_layout_;
  const ModelConfig& c = b.c_;
  const std::int64_t qd = c.attn_q_dim();
  const auto params = [&](int row0) {
    AttnParams a;
    a.q = b.q_ + row0 * qd;
    a.ld_q = qd;
    a.gate = b.proj_ + static_cast<std::int64_t>(row0) * b.ld_proj_ + c.head_dim;
    a.ld_gate = b.ld_proj_;
    a.gate_head_stride = 2LL * c.head_dim;
    a.out = b.core_ + static_cast<std::int64_t>(row0) * b.ld_core_;
    a.ld_out = b.ld_core_;
    a.num_q_heads = c.num_attention_heads;
    a.num_kv_heads = c.num_key_value_heads;
    a.head_dim = c.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    return a;
  };
  if (b.n_a_ + b.n_b_ > 0) {
    AttnParams a = params(0);
    a.kv = b.paged(kv_layer, 0);
    a.cu_seqlens = b.plan(L.cu_all);
    a.num_seqs = b.n_a_ + b.n_b_;
    a.rows = b.rows_ab_;
    check(attention_prefill(a, b.max_ab_, b.stream_), "attention_prefill");
  }
  if (b.n_c_ > 0) {
    const int first = b.n_a_ + b.n_b_;
    AttnParams a = params(b.rows_ab_);
    a.kv = b.paged(kv_layer, first);
    a.cu_seqlens = b.plan(L.cu_c);
    a.num_seqs = b.n_c_;
    a.rows = b.rows_c_;
    check(attention_decode(a, b.splits_, b.split_len_, b.attn_ws_, b.stream_), "attention_decode");
  }
}

void CudaPass::attn_output(const AttnW& w) {
  const ModelConfig& c = b_.c_;
  b_.project(b_.core_, b_.ld_core_, w.w_o, static_cast<int>(c.attn_q_dim()), c.hidden_size, b_.mix_, c.hidden_size);
}

void CudaPass::mlp_gate_up(const MlpW& w) {
  const ModelConfig& c = b_.c_;
  b_.project(b_.xn_, c.hidden_size, w.w_gate_up, c.hidden_size, 2 * c.intermediate_size, b_.proj_, b_.ld_proj_);
}

void CudaPass::mlp_swiglu(const MlpW&) {
  const int I = b_.c_.intermediate_size;
  check(swiglu(b_.proj_, b_.ld_proj_, I, b_.act_, I, b_.rows_, I, b_.stream_), "swiglu");
}

void CudaPass::mlp_down(const MlpW& w) {
  const ModelConfig& c = b_.c_;
  b_.project(b_.act_, c.intermediate_size, w.w_down, c.intermediate_size, c.hidden_size, b_.mix_, c.hidden_size);
}

}  // namespace
GDN_CUDA_NAMESPACE_END

namespace gdn {

std::unique_ptr<BackendInterface> make_cuda_backend(std::shared_ptr<const Model> model, const BackendParams& params) {
  return std::make_unique<cuda::CudaBackend>(std::move(model), params);
}

void require_cuda_device(int device) { (void)cuda::open_device(device); }

double measure_cuda_copy_bandwidth(int device, std::size_t bytes) {
  namespace rt = cuda::rt;
  cuda::open_device(device);
  cuda::DeviceMemory a(bytes, "the bandwidth measurement"), b(bytes, "the bandwidth measurement");
  cudaStream_t s = nullptr;
  cuda::check(rt::stream_create(&s), "creating a stream");
  cuda::check(rt::memset_async(a.get(), 1, bytes, s), "the bandwidth measurement");
  std::vector<double> times;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cuda::check(rt::memcpy_async(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s), "the bandwidth measurement");
    cuda::check(rt::stream_synchronize(s), "the bandwidth measurement");
    if (i > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  (void)rt::stream_destroy(s);
  std::sort(times.begin(), times.end());
  return 2.0 * static_cast<double>(bytes) / times[times.size() / 2];
}

void randomize_cuda_weights(const Model& model, int device, std::uint64_t seed) {
  const auto w = cuda::device_weights(model, device, {});
  for (const auto& [p, n] : w->matrices) {
    cuda::check(cuda::fill_random_bf16(p, n, seed++, 0.02f, nullptr), "randomising the weights");
  }
  cuda::check(cuda::rt::stream_synchronize(nullptr), "randomising the weights");
}

void prepare_cuda_weights(const Model& model, int device, const std::function<void(std::size_t, std::size_t)>& progress) {
  (void)cuda::device_weights(model, device, progress);
}

}  // namespace gdn
