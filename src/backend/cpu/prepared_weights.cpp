// The CPU form of a model's weights: projections packed into the order the projection kernel reads
// them (see cpu::pack_weight_image for why), conv taps tap-major.

#include "prepared_weights.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <unordered_map>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/core/system_memory.hpp"
#include "gdn/core/thread_pool.hpp"
#include "gdn/io/safetensors.hpp"
#include "gdn/model/packed_image.hpp"

#include "../../model_internals.hpp"
#include "quant.hpp"

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

// The bf16 projections an image holds, in projections() order.
std::vector<Linear*> bf16_projections(PreparedWeights& w) {
  std::vector<Linear*> out;
  for (const Linear* p : w.projections())
    if (p->w->dtype == DType::bf16) out.push_back(const_cast<Linear*>(p));
  return out;
}

// Copies every bf16 projection into the kernel's image (one anonymous, huge-page-backed block the
// size of the weights) so decode streams the weights sequentially; then lets go of the checkpoint's
// pages of those tensors (they stay in the page cache, where the embedding lookup and anything else
// reading the views finds them).
void pack(PreparedWeights& w, const ImageLayouts& layouts, const io::Checkpoint& ckpt,
          const std::function<void(std::size_t, std::size_t)>& progress) {
  const std::vector<Linear*> todo = bf16_projections(w);
  if (todo.empty()) return;
  w.packed = AnonymousMemory(packed_bytes(w, layouts));
  auto* base = reinterpret_cast<std::uint16_t*>(w.packed.data());
  std::size_t offset = 0;
  for (Linear* p : todo) {
    p->image = base + offset;
    p->layout = layout_of(w, p, layouts);
    offset += weight_image_elements(p->layout, p->out(), p->in());
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
      pack_weight_image(p->layout, *p->w, b0 * 32, std::min(out, b1 * 32), image);
      const std::int64_t r0 = b0 * 32, r1 = std::min(out, b1 * 32);
      release_mapped_pages(data + static_cast<std::uintptr_t>(r0 * row_bytes), data + static_cast<std::uintptr_t>(r1 * row_bytes), ckpt);
    });
    done += p->w->nbytes();
    if (progress) progress(done, total);
  }
  w.image_bytes = w.packed.size();
}

// Points every bf16 projection at its image in the packed image file at `path`, after checking
// that the file is a valid image of this checkpoint for these layouts (each tensor's encoding
// included: an image of another lm_head format is refused, never read as this one). Throws
// gdn::Error naming why not (nothing is changed then).
void map_image(PreparedWeights& w, const ImageLayouts& layouts, WeightQuant quant, const io::Checkpoint& ckpt,
               const std::string& path) {
  const WeightImage layout = layouts.projections;
  auto file = std::make_unique<io::MappedFile>(path, /*huge_pages=*/true);
  const PackedImageHeader h = parse_packed_image_header(file->bytes(), path);
  if (h.layout != weight_image_name(layout))
    throw Error(Status::invalid_file,
                is_quantized(layout) ? fmt::format("{}: the image is in the {} layout, not the {} quantisation asked for", path,
                                                   h.layout, weight_image_name(layout))
                                     : fmt::format("{}: the image is in the {} layout, this CPU's kernel ({}) reads {}", path,
                                                   h.layout, linear_kernel_name(), weight_image_name(layout)));
  std::vector<std::string> names;
  for (const auto& t : h.tensors) names.push_back(t.name);
  if (checkpoint_fingerprint(ckpt, names) != h.fingerprint)
    throw Error(Status::invalid_file,
                fmt::format("{}: the image is stale or foreign: it was packed from a checkpoint with fingerprint {}, and {} has "
                            "{} (its files, headers or values changed); run gdn pack again",
                            path, h.fingerprint, ckpt.dir(), checkpoint_fingerprint(ckpt, names)));
  std::unordered_map<std::string, const PackedImageTensor*> by_name;
  for (const auto& t : h.tensors) by_name.emplace(t.name, &t);
  const std::vector<Linear*> todo = bf16_projections(w);
  const std::vector<std::string> want = projection_names(w, ckpt);
  std::vector<const std::uint16_t*> images;
  std::size_t bytes = 0;
  std::size_t k = 0;
  for (const Linear* p : w.projections()) {
    const std::string& name = want[k++];
    if (p->w->dtype != DType::bf16) continue;
    const auto it = by_name.find(name);
    if (name.empty() || it == by_name.end())
      throw Error(Status::invalid_file, fmt::format("{}: the image holds no '{}'", path, name.empty() ? "(unnamed)" : name));
    const PackedImageTensor& t = *it->second;
    if (t.rows != p->out() || t.cols != p->in())
      throw Error(Status::invalid_file, fmt::format("{}: the image's '{}' is [{}, {}]; the model's is [{}, {}]", path, name, t.rows,
                                                    t.cols, p->out(), p->in()));
    const WeightImage want_layout = layout_of(w, p, layouts);
    if (t.encoding != weight_image_name(want_layout)) {
      // The lm_head_quant that gives an encoding (q4_k_m's q5_0 is its q4_k in rows of partial super-blocks).
      const auto lm_head_quant = [](std::string_view e) { return e == "q5_0" ? std::string_view("q4_k") : e; };
      const std::string_view asked = lm_head_quant(weight_image_name(want_layout));
      throw Error(Status::invalid_file,
                  fmt::format("{}: the image's '{}' is {}, and this load reads it as {}{}", path, name, t.encoding,
                              weight_image_name(want_layout),
                              p == &w.lm_head ? fmt::format(" (lm_head_quant {}); write the image for it with gdn pack {} "
                                                            "--quant {} --lm-head-quant {}, or load with --lm-head-quant {}",
                                                            asked, ckpt.dir(), weight_quant_name(quant), asked,
                                                            lm_head_quant(t.encoding))
                                              : std::string()));
    }
    images.push_back(reinterpret_cast<const std::uint16_t*>(file->bytes().data() + t.offset));
    bytes += t.bytes;
  }
  for (std::size_t i = 0; i < todo.size(); ++i) {
    todo[i]->image = images[i];
    todo[i]->layout = layout_of(w, todo[i], layouts);
  }
  w.image_bytes = bytes;
  w.image = std::move(file);
}

void notify(const Model& model, const std::string& line) {
  if (model.params().notice) model.params().notice(line);
  else fmt::print(stderr, "{}\n", line);
}

// WeightPlacement's rules (gdn/model/model.hpp).
void place(PreparedWeights& w, const Model& model, const std::function<void(std::size_t, std::size_t)>& progress) {
  const ModelParams& mp = model.params();
  const io::Checkpoint& ckpt = detail::ModelInternals::checkpoint(model);
  const ImageLayouts layouts = load_layouts(mp);
  const WeightImage layout = layouts.projections;
  const std::size_t need = packed_bytes(w, layouts);
  w.placement = WeightPlacement::in_place;
  if (is_quantized(layout) && mp.weights == WeightPlacement::in_place)
    throw Error(Status::invalid_argument, fmt::format("{}: {} weights cannot be read in place (the checkpoint holds bf16): "
                                                      "drop --in-place, or write the image once with gdn pack {} --quant {}",
                                                      model.dir(), weight_image_name(layout), model.dir(), weight_image_name(layout)));
  if (mp.weights == WeightPlacement::in_place) return;
  if (layout == WeightImage::none || need == 0) {
    if (mp.weights == WeightPlacement::image)
      throw Error(Status::unsupported_model,
                  fmt::format("{}: no packed image can be used: {}", model.dir(),
                              layout == WeightImage::none
                                  ? fmt::format("this CPU's projection kernel ({}) reads the weights in place", linear_kernel_name())
                                  : std::string("the model has no bf16 projections")));
    return;
  }
  const std::string path =
      mp.packed_image.empty() ? default_packed_image_path(model.dir(), mp.quant, mp.lm_head_quant) : mp.packed_image;
  std::string refused;
  if (mp.weights == WeightPlacement::packed) {
    // Packing asked for: no image is looked for.
  } else if (std::filesystem::exists(path)) {
    try {
      map_image(w, layouts, mp.quant, ckpt, path);
      w.placement = WeightPlacement::image;
      if (progress) progress(need, need);
      return;
    } catch (const Error& e) {
      if (mp.weights == WeightPlacement::image) throw;
      refused = e.what();
    }
  } else if (mp.weights == WeightPlacement::image || !mp.packed_image.empty()) {
    if (mp.weights == WeightPlacement::image)
      throw Error(Status::io_error, fmt::format("{}: no packed image at '{}' (write one with: gdn pack {})", model.dir(), path, model.dir()));
    refused = fmt::format("'{}' does not exist", path);
  }
  // Pack when the copy fits what this process can get, with room for contexts and the rest of the
  // process: an eighth of the copy, at least 512 MiB.
  const SystemMemory mem = system_memory();
  const std::int64_t margin = packing_margin(static_cast<std::int64_t>(need));
  std::string why;  // why the weights are not packed
  if (static_cast<std::int64_t>(need) + margin <= mem.available) {
    try {
      pack(w, layouts, ckpt, progress);
      w.placement = WeightPlacement::packed;
      if (!refused.empty()) {
        w.notice = fmt::format("gdn: not using the packed image ({}); packed the weights at load instead", refused);
        notify(model, w.notice);
      }
      return;
    } catch (const Error& e) {
      // The mapping was refused (overcommit, an address-space limit): read in place instead.
      if (mp.weights == WeightPlacement::packed || e.status() != Status::out_of_capacity) throw;
      for (Linear* p : bf16_projections(w)) {
        p->image = nullptr;
        p->layout = WeightImage::none;
      }
      w.packed = AnonymousMemory();
      why = e.what();
    }
  } else {
    why = fmt::format("packing them for the {} kernel needs {} (+{} margin), {}",
                      is_quantized(layout) ? quant_kernel_name(quant_kernel()) : linear_kernel_name(),
                      format_bytes(static_cast<std::int64_t>(need)), format_bytes(margin), mem.describe());
  }
  if (mp.weights == WeightPlacement::packed)
    throw Error(Status::out_of_capacity, fmt::format("{}: cannot pack the weights: {}; read them in place (--in-place) or write a "
                                                     "packed image once (gdn pack {})",
                                                     model.dir(), why, model.dir()));
  if (is_quantized(layout))
    throw Error(Status::out_of_capacity, fmt::format("{}: cannot quantise the weights at load: {}; write the {} image once "
                                                     "(gdn pack {} --quant {}), which loading then maps",
                                                     model.dir(), why, weight_image_name(layout), model.dir(), weight_image_name(layout)));
  w.notice = fmt::format("gdn: {}reading the weights of {} in place: {}; decode runs slower than from a packed image "
                         "(write one with: gdn pack {})",
                         refused.empty() ? std::string() : fmt::format("not using the packed image ({}); ", refused), model.dir(),
                         why, model.dir());
  notify(model, w.notice);
}

}  // namespace

bool more_bits_projection(const PreparedWeights& w, const Linear* p) noexcept {
  const int n = static_cast<int>(w.layers.size());
  for (int i = 0; i < n; ++i) {
    const LayerWeights& l = w.layers[static_cast<std::size_t>(i)];
    if (p == &l.attn.v_proj || p == &l.gdn.in_proj_qkv || p == &l.gdn.in_proj_qkvz || p == &l.mlp.down_proj)
      return quant_more_bits_layer(i, n);
  }
  return false;  // the lm_head, the MTP head's, the other projections
}

std::size_t packed_bytes(const PreparedWeights& w, const ImageLayouts& layouts) {
  std::size_t elements = 0;
  for (const Linear* p : w.projections())
    if (p->w->dtype == DType::bf16) elements += weight_image_elements(layout_of(w, p, layouts), p->out(), p->in());
  return elements * sizeof(std::uint16_t);
}

std::vector<std::string> projection_names(const PreparedWeights& w, const io::Checkpoint& ckpt) {
  std::unordered_map<const std::byte*, std::string> by_data;
  for (const auto& name : ckpt.names()) by_data.emplace(ckpt.find(name).data, name);
  std::vector<std::string> out;
  for (const Linear* p : w.projections()) {
    const auto it = by_data.find(p->w->data);
    if (it != by_data.end()) {
      out.push_back(it->second);
      continue;
    }
    // A copy made because the file's data was not aligned: the tensor of that shape and content.
    std::string name;
    for (const auto& n : ckpt.names()) {
      const TensorView t = ckpt.find(n);
      if (t.dtype == p->w->dtype && t.rank == p->w->rank && t.shape == p->w->shape &&
          std::memcmp(t.data, p->w->data, t.nbytes()) == 0) {
        name = n;
        break;
      }
    }
    out.push_back(name);
  }
  return out;
}

const char* weight_image_name(WeightImage layout) noexcept {
  switch (layout) {
    case WeightImage::panels: return "panels";
    case WeightImage::amx_tiles: return "amx_tiles";
    case WeightImage::q8_0: return "q8_0";
    case WeightImage::q5_0: return "q5_0";
    case WeightImage::q4_0: return "q4_0";
    case WeightImage::q4_k: return "q4_k";
    default: return "none";
  }
}

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
    place(*w, model, progress);
    return w;
  });
  return std::static_pointer_cast<const PreparedWeights>(made);
}

}  // namespace gdn::cpu
