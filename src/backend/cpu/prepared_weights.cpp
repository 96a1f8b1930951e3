// The CPU form of a model's weights: projections packed into the order the projection kernel reads
// them (see cpu::pack_weight_image for why), conv taps tap-major.

#include "prepared_weights.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "gdn/core/thread_pool.hpp"
#include "gdn/io/safetensors.hpp"

#include "../../model_internals.hpp"

namespace gdn::cpu {
namespace {

Linear linear(const LinearWeight& w) { return Linear{&w.w}; }

GdnWeights gdn_weights(const GatedDeltaNetWeights& g, const ModelConfig& c) {
  GdnWeights o;
  o.in_proj_qkv = linear(g.in_proj_qkv);
  o.in_proj_z = linear(g.in_proj_z);
  o.in_proj_b = linear(g.in_proj_b);
  o.in_proj_a = linear(g.in_proj_a);
  o.in_proj_qkvz = linear(g.in_proj_qkvz);
  o.in_proj_ba = linear(g.in_proj_ba);
  o.out_proj = linear(g.out_proj);
  // Stored [conv_dim][1][K]; kept tap-major [K][conv_dim] for the conv's channel-contiguous loops.
  const std::int64_t C = c.gdn_conv_dim(), K = c.linear_conv_kernel_dim;
  o.conv.resize(static_cast<std::size_t>(C * K));
  for (std::int64_t ch = 0; ch < C; ++ch)
    for (std::int64_t j = 0; j < K; ++j) {
      const std::byte* p = g.conv1d.data + (ch * K + j) * static_cast<std::int64_t>(dtype_size(g.conv1d.dtype));
      float v = 0.0f;
      switch (g.conv1d.dtype) {
        case DType::f32: std::memcpy(&v, p, 4); break;
        case DType::bf16: { bf16 h; std::memcpy(&h, p, 2); v = to_float(h); break; }
        case DType::f16: { f16 h; std::memcpy(&h, p, 2); v = to_float(h); break; }
        default: break;
      }
      o.conv[static_cast<std::size_t>(j * C + ch)] = v;
    }
  o.neg_exp_A = g.neg_exp_A.data();
  o.dt_bias = g.dt_bias.data();
  o.norm = g.norm.data();
  return o;
}

LayerWeights layer_weights(const DecoderLayerWeights& l, const ModelConfig& c) {
  LayerWeights o;
  o.kind = l.kind;
  o.input_norm_scale = l.input_norm_scale.data();
  o.post_attention_norm_scale = l.post_attention_norm_scale.data();
  if (l.kind == LayerKind::linear_attention) {
    o.gdn = gdn_weights(l.gdn, c);
  } else {
    o.attn = AttentionWeights{linear(l.attn.q_proj), linear(l.attn.k_proj), linear(l.attn.v_proj), linear(l.attn.o_proj),
                              l.attn.q_norm_scale.data(), l.attn.k_norm_scale.data()};
  }
  o.mlp = MlpWeights{linear(l.mlp.gate_proj), linear(l.mlp.up_proj), linear(l.mlp.down_proj)};
  return o;
}

void add_layer(const LayerWeights& l, std::vector<const Linear*>& out) {
  for (const Linear* w : {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b, &l.gdn.in_proj_a, &l.gdn.in_proj_qkvz,
                          &l.gdn.in_proj_ba, &l.gdn.out_proj, &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj,
                          &l.attn.o_proj, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj})
    if (!w->empty()) out.push_back(w);
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

// Copies every bf16 projection into the kernel's image (one anonymous, huge-page-backed block the
// size of the weights) so decode streams the weights sequentially; then lets go of the checkpoint's
// pages of those tensors (they stay in the page cache, where the embedding lookup and anything else
// reading the views finds them).
void pack(PreparedWeights& w, const io::Checkpoint& ckpt, const std::function<void(std::size_t, std::size_t)>& progress) {
  const WeightImage layout = weight_image_layout(linear_kernel());
  if (layout == WeightImage::none) return;
  std::vector<Linear*> todo;
  std::size_t elements = 0;
  for (const Linear* p : w.projections())
    if (p->w->dtype == DType::bf16) {
      todo.push_back(const_cast<Linear*>(p));
      elements += weight_image_elements(layout, p->out(), p->in());
    }
  if (todo.empty()) return;
  w.packed = AnonymousMemory(elements * sizeof(std::uint16_t));
  auto* base = reinterpret_cast<std::uint16_t*>(w.packed.data());
  std::size_t offset = 0;
  for (Linear* p : todo) {
    p->image = base + offset;
    p->layout = layout;
    offset += weight_image_elements(layout, p->out(), p->in());
  }
  // Copying is bound by reading the checkpoint (page faults, or the disk on a cold cache), so a
  // pool of threads, alive only for the load, splits each tensor by blocks of 32 rows.
  ThreadPool pool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  std::size_t done = 0, total = 0;
  for (Linear* p : todo) total += p->w->nbytes();
  if (progress) progress(0, total);
  for (Linear* p : todo) {
    auto* image = const_cast<std::uint16_t*>(p->image);
    const auto data = reinterpret_cast<std::uintptr_t>(p->w->data);
    const std::int64_t out = p->out(), row_bytes = p->in() * 2;
    // Each range's source pages are let go as soon as it is packed, so the peak is the packed
    // copy plus a few ranges, not plus the largest tensor (a 248k-row lm_head is 0.5 GB at 0.8B).
    // The embedding lookup (a tied lm_head) re-faults the few rows it reads from the page cache.
    pool.parallel_for((out + 31) / 32, 64, [&](std::int64_t b0, std::int64_t b1, int) {
      pack_weight_image(layout, *p->w, b0 * 32, std::min(out, b1 * 32), image);
      const std::int64_t r0 = b0 * 32, r1 = std::min(out, b1 * 32);
      release_mapped_pages(data + static_cast<std::uintptr_t>(r0 * row_bytes), data + static_cast<std::uintptr_t>(r1 * row_bytes), ckpt);
    });
    done += p->w->nbytes();
    if (progress) progress(done, total);
  }
}

}  // namespace

std::vector<const Linear*> PreparedWeights::projections() const {
  std::vector<const Linear*> out;
  for (const auto& l : layers) add_layer(l, out);
  out.push_back(&lm_head);
  if (mtp) {
    out.push_back(&mtp->fc);
    add_layer(mtp->layer, out);
  }
  return out;
}

std::shared_ptr<const PreparedWeights> prepare_weights(const Model& model,
                                                       const std::function<void(std::size_t, std::size_t)>& progress) {
  auto made = detail::ModelInternals::prepared(model, prepared_weights_key, [&]() -> std::shared_ptr<const void> {
    const ModelConfig& c = model.config();
    const ModelWeights& mw = model.weights();
    auto w = std::make_shared<PreparedWeights>();
    w->embed_tokens = &mw.embed_tokens;
    w->layers.reserve(mw.layers.size());
    for (const auto& l : mw.layers) w->layers.push_back(layer_weights(l, c));
    w->final_norm_scale = mw.final_norm_scale.data();
    w->lm_head = linear(mw.lm_head);
    if (mw.mtp) {
      MtpWeights m;
      m.fc = linear(mw.mtp->fc);
      m.pre_fc_norm_embedding_scale = mw.mtp->pre_fc_norm_embedding_scale.data();
      m.pre_fc_norm_hidden_scale = mw.mtp->pre_fc_norm_hidden_scale.data();
      m.norm_scale = mw.mtp->norm_scale.data();
      m.layer = layer_weights(mw.mtp->layer, c);
      w->mtp = std::move(m);
    }
    if (model.params().pack_weights) pack(*w, detail::ModelInternals::checkpoint(model), progress);
    return w;
  });
  return std::static_pointer_cast<const PreparedWeights>(made);
}

}  // namespace gdn::cpu
