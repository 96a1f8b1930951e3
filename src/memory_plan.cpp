// inspect_model and plan_memory (gdn/model/memory_plan.hpp): config.json and the safetensors
// headers, never the weights; the CPU context figures from the backend's own accounting
// (backend/cpu/host_memory.hpp), the CUDA ones from the sizes it keeps.

#include "gdn/model/memory_plan.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/core/error.hpp"
#include "gdn/io/safetensors.hpp"
#include "gdn/model/packed_image.hpp"
#include "gdn/model/weights.hpp"

#include "backend/cpu/host_memory.hpp"
#include "backend/cpu/linear.hpp"
#include "backend/cpu/prepared_weights.hpp"
#include "backend/cpu/quant.hpp"

namespace gdn {
namespace {

struct Entry {
  DType dtype;
  std::vector<std::int64_t> shape;
  std::int64_t bytes;
};

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

std::int64_t numel(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (const auto d : s) n *= d;
  return n;
}

// The entry table of every shard; fills the summary and the model's tensors (validated).
void read_tensors(const std::string& dir, const ModelConfig& cfg, CheckpointSummary& sum, bool load_mtp,
                  std::vector<ModelTensor>& model) {
  struct {
    std::unordered_map<std::string, Entry> entries;
    std::vector<TensorSpec> specs;
  } t;
  const io::CheckpointFiles files = io::checkpoint_files(dir);
  std::unordered_map<std::string, std::string> shard_of;
  std::map<DType, DTypeCount> by_dtype;
  for (const auto& name : files.shards) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    const io::SafetensorsHeader h = io::read_safetensors_header(path);
    sum.files.push_back(name);
    sum.file_bytes += static_cast<std::int64_t>(std::filesystem::file_size(path));
    for (const auto& e : h.tensors) {
      if (!shard_of.emplace(e.name, name).second)
        throw Error(Status::invalid_file, fmt::format("tensor '{}' appears in both '{}' and '{}'", e.name,
                                                      (std::filesystem::path(dir) / shard_of[e.name]).string(), path));
      Entry en{e.dtype, std::vector<std::int64_t>(e.shape.begin(), e.shape.begin() + e.rank), static_cast<std::int64_t>(e.end - e.begin)};
      auto& d = by_dtype[e.dtype];
      d.dtype = e.dtype;
      ++d.tensors;
      d.parameters += numel(en.shape);
      d.bytes += en.bytes;
      ++sum.tensors;
      sum.parameters += numel(en.shape);
      sum.bytes += en.bytes;
      t.entries.emplace(e.name, std::move(en));
    }
  }
  for (const auto& [name, shard] : files.weight_map) {
    const auto it = shard_of.find(name);
    if (it == shard_of.end() || it->second != shard)
      throw Error(Status::invalid_file, fmt::format("{}: index lists '{}' in '{}', which does not hold it", files.index_path, name, shard));
  }
  for (const auto& [_, d] : by_dtype) sum.by_dtype.push_back(d);

  // As bind_weights: the prefix, then every tensor the config implies.
  for (const char* candidate : {"model.language_model.", "model.", ""})
    if (t.entries.count(std::string(candidate) + "embed_tokens.weight")) {
      sum.prefix = candidate;
      break;
    }
  if (!t.entries.count(sum.prefix + "embed_tokens.weight"))
    throw Error(Status::missing_tensor,
                fmt::format("{}: no embedding found (looked for model.language_model.embed_tokens.weight and "
                            "model.embed_tokens.weight)",
                            dir));
  sum.has_mtp = load_mtp && cfg.mtp_num_hidden_layers > 0 && t.entries.count("mtp.fc.weight") > 0;
  t.specs = model_tensor_specs(cfg, sum.prefix, sum.has_mtp);
  for (const auto& s : t.specs) {
    const auto it = t.entries.find(s.name);
    if (it == t.entries.end())
      throw Error(Status::missing_tensor, fmt::format("{}: tensor '{}' is missing from the checkpoint", dir, s.name));
    if (it->second.shape != s.shape)
      throw Error(Status::tensor_mismatch, fmt::format("{}: tensor '{}' has shape {} but the config implies {}", dir, s.name,
                                                       shape_text(it->second.shape), shape_text(s.shape)));
    if (!is_float(it->second.dtype))
      throw Error(Status::tensor_mismatch, fmt::format("{}: tensor '{}' has dtype {}; BF16, F16 or F32 expected", dir, s.name,
                                                       dtype_name(it->second.dtype)));
    model.push_back({s, it->second.dtype, it->second.bytes});
    if (s.alias) continue;
    ++sum.model_tensors;
    sum.model_parameters += numel(s.shape);
    sum.model_bytes += it->second.bytes;
  }
  sum.other_tensors = sum.tensors - sum.model_tensors;
  sum.other_parameters = sum.parameters - sum.model_parameters;
  sum.other_bytes = sum.bytes - sum.model_bytes;
}

// What the CPU backend's load would do with the weights now (prepared_weights.cpp's place()).
void plan_cpu_weights(const std::string& dir, const std::vector<ModelTensor>& tensors, const ModelParams& mp, MemoryPlan& plan) {
  const cpu::ImageLayouts layouts = cpu::load_layouts(mp);
  const cpu::WeightImage layout = layouts.projections;
  plan.kernel = cpu::is_quantized(layout) ? cpu::quant_kernel_name(cpu::quant_kernel()) : cpu::linear_kernel_name();
  std::vector<const TensorSpec*> bf16;
  std::int64_t embedding = 0, other_in_place = 0, vectors = 0;
  for (const auto& mt : tensors) {
    const TensorSpec& s = mt.spec;
    const ModelTensor& e = mt;
    if (s.alias && !s.projection) continue;
    if (s.projection && e.dtype == DType::bf16) {
      bf16.push_back(&s);
      plan.packed_bytes +=
          static_cast<std::int64_t>(cpu::weight_image_elements(cpu::layout_of(s, layouts), s.shape[0], s.shape[1]) * 2);
    } else if (s.projection) {
      other_in_place += s.alias ? 0 : e.bytes;  // f16 / f32 projections are always read in place
    } else if (s.shape.size() == 2) {
      embedding += e.bytes;
    } else {
      vectors += numel(s.shape) * 4;  // converted to float at load (conv taps: tap-major floats)
    }
  }
  for (const auto& mt : tensors) plan.weight_bytes += mt.spec.alias ? 0 : mt.bytes;
  const auto in_place = [&](std::string why) {
    plan.weights = WeightPlacement::in_place;
    plan.weights_reason = std::move(why);
    plan.weights_anonymous_bytes = vectors;
    plan.weights_mapped_bytes = plan.weight_bytes;
  };
  if (cpu::is_quantized(layout) && mp.weights == WeightPlacement::in_place)
    return in_place(fmt::format("loading would fail: {} weights cannot be read in place", cpu::weight_image_name(layout)));
  if (mp.weights == WeightPlacement::in_place) return in_place("asked for");
  if (layout == cpu::WeightImage::none)
    return in_place(fmt::format("this CPU's projection kernel ({}) reads the weights in place", plan.kernel));
  if (bf16.empty()) return in_place("the model has no bf16 projections to pack");

  const std::string path = mp.packed_image.empty() ? default_packed_image_path(dir, mp.quant, mp.lm_head_quant) : mp.packed_image;
  std::string refused;
  if (mp.weights == WeightPlacement::packed) {
    // Packing asked for: no image is looked for.
  } else if (std::filesystem::exists(path)) {
    try {
      const PackedImageHeader h = read_packed_image_header(path);
      if (h.layout != cpu::weight_image_name(layout))
        throw Error(Status::invalid_file, fmt::format("{}: the image is in the {} layout, loading reads {}", path, h.layout,
                                                      cpu::weight_image_name(layout)));
      std::vector<std::string> names;
      std::unordered_map<std::string, const PackedImageTensor*> by_name;
      for (const auto& e : h.tensors) {
        names.push_back(e.name);
        by_name.emplace(e.name, &e);
      }
      if (checkpoint_fingerprint(dir, names) != h.fingerprint)
        throw Error(Status::invalid_file, fmt::format("{}: the image is stale or foreign (its checkpoint fingerprint differs)", path));
      for (const TensorSpec* s : bf16) {
        const auto it = by_name.find(s->name);
        if (it == by_name.end() || it->second->rows != s->shape[0] || it->second->cols != s->shape[1])
          throw Error(Status::invalid_file, fmt::format("{}: the image holds no '{}' of the model's shape", path, s->name));
        const char* want = cpu::weight_image_name(cpu::layout_of(*s, layouts));
        if (it->second->encoding != want)
          throw Error(Status::invalid_file, fmt::format("{}: the image's '{}' is {}, loading reads it as {}", path, s->name,
                                                        it->second->encoding, want));
      }
      plan.weights = WeightPlacement::image;
      plan.packed_image = path;
      plan.weights_reason = fmt::format("the packed image {}", path);
      plan.weights_anonymous_bytes = vectors;
      plan.weights_mapped_bytes = plan.packed_bytes + embedding + other_in_place;
      return;
    } catch (const Error& e) {
      refused = e.what();
    }
  } else if (!mp.packed_image.empty() || mp.weights == WeightPlacement::image) {
    refused = fmt::format("'{}' does not exist", path);
  }
  if (mp.weights == WeightPlacement::image) return in_place(fmt::format("loading would fail: no valid packed image ({})", refused));
  const std::int64_t margin = cpu::packing_margin(plan.packed_bytes);
  if (plan.packed_bytes + margin <= plan.memory.available) {
    plan.weights = WeightPlacement::packed;
    plan.weights_reason = refused.empty() ? std::string("packed at load (it fits)")
                                          : fmt::format("packed at load; not using the packed image ({})", refused);
    plan.weights_anonymous_bytes = plan.packed_bytes + vectors;
    plan.weights_mapped_bytes = embedding + other_in_place;
    return;
  }
  const std::string why = fmt::format("packing them needs {} (+{} margin), {}", format_bytes(plan.packed_bytes), format_bytes(margin),
                                      plan.memory.describe());
  if (mp.weights == WeightPlacement::packed || cpu::is_quantized(layout)) {
    plan.weights = WeightPlacement::packed;
    plan.weights_reason = cpu::is_quantized(layout)
                              ? fmt::format("loading would fail: {}; write the {} image once (gdn pack --quant {})", why,
                                            cpu::weight_image_name(layout), cpu::weight_image_name(layout))
                              : fmt::format("loading would fail: {}", why);
    plan.weights_anonymous_bytes = plan.packed_bytes + vectors;
    plan.weights_mapped_bytes = embedding + other_in_place;
    return;
  }
  in_place(refused.empty() ? why : fmt::format("{}; not using the packed image ({})", why, refused));
}

}  // namespace

ModelInfo inspect_model(const std::string& dir, bool load_mtp) {
  ModelInfo info;
  info.config = load_model_config(dir);
  info.checkpoint.dir = dir;
  read_tensors(dir, info.config, info.checkpoint, load_mtp, info.tensors);
  return info;
}

MemoryPlan plan_memory(const std::string& dir, const ContextParams& context, const ModelParams& load) {
  return plan_memory(inspect_model(dir, load.load_mtp), context, load);
}

MemoryPlan plan_memory(const ModelInfo& info, const ContextParams& p, const ModelParams& load) {
  const ModelConfig& c = info.config;
  if (p.max_sequences < 1 || p.max_context < 1 || p.kv_page_size < 1 || p.max_batch_tokens < 1 || p.max_rollback_tokens < 0)
    throw Error(Status::invalid_argument, "plan_memory: max_sequences, max_context, kv_page_size and max_batch_tokens must be "
                                          "positive, max_rollback_tokens not negative");
  MemoryPlan plan;
  plan.backend = p.backend;
  plan.max_sequences = p.max_sequences;
  plan.max_context = p.max_context;
  plan.state_dtype = p.state_dtype.value_or(c.ssm_state_dtype);
  plan.kv_dtype = p.kv_dtype.value_or(default_kv_dtype(p.backend));
  plan.memory = system_memory();
  const bool has_mtp = info.checkpoint.has_mtp;
  const bool has_kv = c.count_layers(LayerKind::full_attention) > 0 || has_mtp;
  const std::int64_t slots = p.max_sequences;
  const std::int64_t pages_per_seq = (p.max_context + p.kv_page_size - 1) / p.kv_page_size;
  plan.kv_page_size = p.kv_page_size;
  plan.kv_pages = has_kv ? (p.kv_pages > 0 ? p.kv_pages : pages_per_seq * slots) : 0;
  const std::int64_t out_rows = p.max_logits_rows > 0 ? p.max_logits_rows : std::max(p.max_sequences, 64);
  plan.output_bytes = out_rows * (std::int64_t{c.vocab_size} + c.hidden_size) * 4;
  // The engine's bookkeeping: page reference counts and free list, page tables, the pass plan.
  const std::int64_t bookkeeping = plan.kv_pages * 8 + slots * pages_per_seq * 4 + slots * 48 + p.max_batch_tokens * 24;

  if (p.backend == Backend::cuda) {
    const std::int64_t gdn_layers = c.count_layers(LayerKind::linear_attention);
    const std::int64_t kv_layers = has_kv ? c.count_layers(LayerKind::full_attention) + (has_mtp ? 1 : 0) : 0;
    const std::int64_t C = c.gdn_conv_dim(), Vd = c.gdn_value_dim(), Hv = c.linear_num_value_heads;
    const std::int64_t H = c.hidden_size, I = c.intermediate_size, qd = c.attn_q_dim(), kvd = c.attn_kv_dim();
    plan.state_dtype = DType::f32;
    plan.weights = WeightPlacement::automatic;
    plan.weights_reason = "bf16 weights uploaded to the device";
    plan.kernel = "cuda";
    plan.weight_bytes = info.checkpoint.model_bytes;
    plan.device_weight_bytes = info.checkpoint.model_parameters * 2;
    plan.gdn_recurrent_bytes_per_sequence = gdn_layers * Hv * c.linear_key_head_dim * c.linear_value_head_dim * 4;
    plan.gdn_conv_bytes_per_sequence = gdn_layers * (c.linear_conv_kernel_dim - 1) * C * 2;
    plan.kv_bytes_per_token = kv_layers * 2 * kvd * 2;
    plan.kv_bytes = plan.kv_pages * p.kv_page_size * plan.kv_bytes_per_token;
    plan.rollback_bytes_per_sequence =
        p.max_rollback_tokens > 0 ? (p.max_rollback_tokens + 1) * (plan.gdn_recurrent_bytes_per_sequence + plan.gdn_conv_bytes_per_sequence) : 0;
    // Work buffers, estimated from the sizes the backend carves (bf16 activations, float logits).
    const std::int64_t U = p.max_batch_tokens, out_cap = std::clamp<std::int64_t>(out_rows, 1, U);
    const std::int64_t ld_proj = std::max({C + Vd + 2 * Hv, 2 * qd + 2 * kvd, 2 * I});
    plan.scratch_bytes = U * (3 * H + ld_proj + C + std::max(Vd, qd) + qd + I + 3 * H) * 2 + out_cap * 2 * H * 2 + out_cap * c.vocab_size * 4;
    plan.context_bytes = slots * (plan.gdn_recurrent_bytes_per_sequence + plan.gdn_conv_bytes_per_sequence + plan.rollback_bytes_per_sequence) +
                         plan.kv_bytes + plan.scratch_bytes;
    plan.device_bytes = plan.device_weight_bytes + plan.context_bytes;
    plan.host_bytes = plan.output_bytes + bookkeeping;
    plan.fits = plan.context_fits = plan.host_bytes <= plan.memory.available;
    return plan;
  }

  // CPU: the backend's accounting, on the parameters the engine would give it.
  BackendParams b;
  b.slots = p.max_sequences;
  b.kv_pages = plan.kv_pages;
  b.kv_page_size = p.kv_page_size;
  b.max_context = p.max_context;
  b.max_pass_rows = p.max_batch_tokens;
  b.max_output_rows = static_cast<int>(std::min<std::int64_t>(out_rows, p.max_batch_tokens));
  b.state_dtype = plan.state_dtype;
  b.kv_dtype = plan.kv_dtype;
  b.matmul_input = p.matmul_input;
  b.threads = p.threads;
  b.max_rollback_tokens = p.max_rollback_tokens;
  const cpu::HostMemory m = cpu::host_memory(c, has_mtp, b);
  plan.threads = m.threads;
  plan.gdn_recurrent_bytes_per_sequence = m.recurrent_per_slot;
  plan.gdn_conv_bytes_per_sequence = m.conv_per_slot;
  plan.kv_bytes_per_token = m.kv_bytes_per_token;
  plan.kv_bytes = m.kv_bytes;
  plan.rollback_bytes_per_sequence = m.rollback_per_slot;
  plan.scratch_bytes = m.scratch;
  plan.context_bytes = m.total(slots) + plan.output_bytes + bookkeeping;
  plan_cpu_weights(info.checkpoint.dir, info.tensors, load, plan);
  plan.host_bytes = plan.weights_anonymous_bytes + plan.weights_mapped_bytes + plan.context_bytes;
  plan.fits = plan.host_bytes <= plan.memory.available;
  plan.context_fits = plan.weights_anonymous_bytes + plan.context_bytes <= plan.memory.available;
  return plan;
}

std::string MemoryPlan::to_text() const {
  const auto mb = [](std::int64_t b) { return format_bytes(b); };
  std::string s;
  const auto line = [&](const char* what, const std::string& text) { s += fmt::format("  {:<16}{}\n", what, text); };
  s += fmt::format("memory plan       {} backend, {} sequence{} x {} positions, {} recurrent state{}\n",
                   backend == Backend::cuda ? "cuda" : "cpu", max_sequences, max_sequences == 1 ? "" : "s", max_context,
                   dtype_name(state_dtype), backend == Backend::cpu ? fmt::format(", {} threads", threads) : std::string());
  if (backend == Backend::cuda) {
    line("weights", fmt::format("{} on the device (bf16; the checkpoint holds {})", mb(device_weight_bytes), mb(weight_bytes)));
  } else {
    std::string w;
    switch (weights) {
      case WeightPlacement::packed:
        w = fmt::format("packed at load for the {} kernel: {} anonymous memory", kernel, mb(packed_bytes));
        break;
      case WeightPlacement::image:
        w = fmt::format("mapped from the packed image: {} of page cache, shared", mb(packed_bytes));
        break;
      default:
        w = fmt::format("read in place from the mapped checkpoint: {} of page cache, shared", mb(weight_bytes));
        break;
    }
    line("weights", w);
    if (!weights_reason.empty()) line("", fmt::format("({})", weights_reason));
    line("", fmt::format("{} anonymous + {} mapped", mb(weights_anonymous_bytes), mb(weights_mapped_bytes)));
  }
  line("GDN state", fmt::format("{} per sequence: recurrent {} ({}), conv {}", mb(gdn_recurrent_bytes_per_sequence + gdn_conv_bytes_per_sequence),
                                mb(gdn_recurrent_bytes_per_sequence), dtype_name(state_dtype), mb(gdn_conv_bytes_per_sequence)));
  line("KV cache", fmt::format("{} per token ({}); {} pages of {} = {}", mb(kv_bytes_per_token), dtype_name(kv_dtype), kv_pages, kv_page_size, mb(kv_bytes)));
  line("rollback log", rollback_bytes_per_sequence > 0 ? fmt::format("{} per sequence", mb(rollback_bytes_per_sequence))
                                                       : std::string("none (max_rollback_tokens 0)"));
  line("work buffers", mb(scratch_bytes));
  line("outputs", mb(output_bytes));
  line("context", fmt::format("{} in all", mb(context_bytes)));
  if (backend == Backend::cuda) {
    line("device", fmt::format("{} (weights + context)", mb(device_bytes)));
    line("host", mb(host_bytes));
  } else {
    line("total", fmt::format("{} resident for full speed; {}", mb(host_bytes), memory.describe()));
    if (!context_fits)
      line("", "DOES NOT FIT: creating the context is refused (out_of_capacity); lower max_sequences or max_context");
    else if (!fits)
      line("", fmt::format("the mapped weights do not fit: they are read from disk as decode needs them (at disk speed); "
                           "the context and anonymous memory ({}) fit",
                           mb(weights_anonymous_bytes + context_bytes)));
  }
  return s;
}

std::string MemoryPlan::to_json(int indent) const {
  const nlohmann::json j = {{"backend", backend == Backend::cuda ? "cuda" : "cpu"},
                            {"max_sequences", max_sequences},
                            {"max_context", max_context},
                            {"state_dtype", std::string(dtype_name(state_dtype))},
                            {"threads", threads},
                            {"kernel", kernel},
                            {"weights", weight_placement_name(weights)},
                            {"weights_reason", weights_reason},
                            {"packed_image", packed_image},
                            {"weight_bytes", weight_bytes},
                            {"packed_bytes", packed_bytes},
                            {"weights_anonymous_bytes", weights_anonymous_bytes},
                            {"weights_mapped_bytes", weights_mapped_bytes},
                            {"device_weight_bytes", device_weight_bytes},
                            {"gdn_recurrent_bytes_per_sequence", gdn_recurrent_bytes_per_sequence},
                            {"gdn_conv_bytes_per_sequence", gdn_conv_bytes_per_sequence},
                            {"kv_dtype", std::string(dtype_name(kv_dtype))},
                            {"kv_bytes_per_token", kv_bytes_per_token},
                            {"kv_pages", kv_pages},
                            {"kv_page_size", kv_page_size},
                            {"kv_bytes", kv_bytes},
                            {"rollback_bytes_per_sequence", rollback_bytes_per_sequence},
                            {"scratch_bytes", scratch_bytes},
                            {"output_bytes", output_bytes},
                            {"context_bytes", context_bytes},
                            {"host_bytes", host_bytes},
                            {"device_bytes", device_bytes},
                            {"available_bytes", memory.available},
                            {"fits", fits},
                            {"context_fits", context_fits}};
  return j.dump(indent);
}

}  // namespace gdn
