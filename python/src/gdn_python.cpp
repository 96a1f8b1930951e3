// The Python module `gdn`: a thin pybind11 binding of libgdn's C++ API. It adds no behaviour of its
// own beyond one lock per mutable object (use_lock.hpp): the C++ objects are exposed as they are,
// gdn::Error becomes a gdn.Error subclass per status (with .status and the library's message), and
// step(), generation and speculative decoding run without the GIL (a text callback takes it back for
// each piece). The C++ objects are one thread at a time; here every object may be shared between
// threads, whose calls then take turns (docs/reliability.md, "Thread-safety rules").
//
// Outputs are numpy views, not copies: Context.logits() / hidden() return read-only float32 arrays
// over the context's own buffers, which keep the Context alive (the array's base). Like the C++
// spans they show the last step's results and are overwritten by the next step, another thread's
// included (which may also move the buffers, when it asks for more rows than any step before; the
// context keeps the outgrown ones, so a late view reads stale numbers, never freed memory): copy
// (np.array(view)) what must outlive the next step.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gdn/gdn.hpp"
#include "gdn/model/memory_plan.hpp"
#include "gdn/model/packed_image.hpp"
#include "gdn/diagnostics/doctor.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/generator.hpp"
#include "gdn/runtime/sampling.hpp"
#include "gdn/runtime/speculative.hpp"
#include "gdn/text/chat_template.hpp"
#include "use_lock.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

using gdn::python::Use;
using gdn::python::UseLock;
constexpr auto gil_held = Use::Gil::held;
constexpr auto gil_released = Use::Gil::released;

// A Context with the model it was made from (the C++ Context holds it too, but only as a
// reference to the Model; Python wants the handle back), and the lock of every call on it: shared
// with the Generators and SpeculativeDecoders that drive it.
gdn::WeightPlacement placement_named(const std::string& v) {
  if (v == "auto" || v == "automatic") return gdn::WeightPlacement::automatic;
  if (v == "pack" || v == "packed") return gdn::WeightPlacement::packed;
  if (v == "in_place" || v == "in-place") return gdn::WeightPlacement::in_place;
  if (v == "image") return gdn::WeightPlacement::image;
  throw gdn::Error(gdn::Status::invalid_argument, "weights must be 'auto', 'pack', 'in_place' or 'image', got '" + v + "'");
}

struct ContextHandle {
  ContextHandle(std::shared_ptr<const gdn::Model> m, const gdn::ContextParams& p) : model(std::move(m)), ctx(model, p) {}
  std::shared_ptr<const gdn::Model> model;
  gdn::Context ctx;
  std::shared_ptr<UseLock> lock = std::make_shared<UseLock>("the context");
};

// Runs f(ctx) as one call on the context: with the GIL (short calls), or without it (steps, files).
template <typename F>
auto with_context(ContextHandle& c, const char* call, F&& f) {
  const Use use(*c.lock, call, gil_held);
  return f(c.ctx);
}
template <typename F>
auto without_gil(ContextHandle& c, const char* call, F&& f) {
  py::gil_scoped_release nogil;
  const Use use(*c.lock, call, gil_released);
  return f(c.ctx);
}

// `with ctx.hold():`
struct ContextHold {
  std::shared_ptr<UseLock> lock;
};

struct BatchHandle {
  gdn::Batch batch;
  UseLock lock{"the batch"};  // a step reads the batch without the GIL while another thread may add to it
};

struct SamplerHandle {
  SamplerHandle(const gdn::SamplingParams& p, int vocab) : sampler(p, vocab) {}
  gdn::Sampler sampler;
  UseLock lock{"the sampler"};  // a SpeculativeDecoder samples with it without the GIL
};

struct ModelHandle {
  std::shared_ptr<const gdn::Model> model;
};

constexpr int n_status = static_cast<int>(gdn::Status::busy) + 1;
// Exception classes by status (index 0: the base gdn.Error). Leaked on purpose: they must outlive
// every translator call, and the interpreter owns the class objects anyway.
std::array<PyObject*, n_status>* exception_classes = nullptr;

const char* const exception_names[n_status] = {
    "Error",                    // ok: never raised; the base class
    "InvalidArgumentError",     "IoError",           "InvalidFileError",      "UnsupportedModelError",
    "MissingTensorError",       "TensorMismatchError", "OutOfCapacityError",  "InvalidSequenceError",
    "ContextOverflowError",     "InvalidTokenError", "BackendUnavailableError", "InternalError",
    "BusyError",
};

void raise_gdn_error(const gdn::Error& e) {
  const int s = static_cast<int>(e.status());
  PyObject* type = (*exception_classes)[s > 0 && s < n_status ? s : 0];
  py::object instance = py::reinterpret_borrow<py::object>(type)(e.what());
  instance.attr("status") = py::cast(e.status());
  PyErr_SetObject(type, instance.ptr());
}

// A read-only numpy view of the floats at `data` with the given shape, kept alive by `owner`.
py::array view(const float* data, std::vector<py::ssize_t> shape, const py::object& owner) {
  std::vector<py::ssize_t> strides(shape.size(), sizeof(float));
  for (std::size_t i = shape.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * shape[i];
  py::array a(py::dtype::of<float>(), std::move(shape), std::move(strides), data, owner);
  a.attr("flags").attr("writeable") = false;
  return a;
}

// Rows of the last step's outputs as one [rows, width] view; `row` gives one row.
template <typename RowFn>
py::array rows_view(py::object self, std::optional<std::int64_t> row, std::int64_t width, RowFn get, const char* call) {
  ContextHandle& pc = self.cast<ContextHandle&>();
  const Use use(*pc.lock, call, gil_held);  // the rows and buffers of one step, not of two
  if (row) return view(get(pc.ctx, *row).data(), {static_cast<py::ssize_t>(width)}, self);
  const std::int64_t rows = pc.ctx.output_rows();
  if (rows == 0) return py::array_t<float>(std::vector<py::ssize_t>{0, static_cast<py::ssize_t>(width)});
  // Every row is fetched through the C++ accessor, so a row that has no logits is refused as in
  // C++; the rows are one buffer, which the view relies on.
  const float* base = get(pc.ctx, 0).data();
  for (std::int64_t r = 1; r < rows; ++r)
    if (get(pc.ctx, r).data() != base + r * width)
      throw gdn::Error(gdn::Status::internal, "output rows are not contiguous");
  return view(base, {static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(width)}, self);
}

using Tokens = py::array_t<gdn::Token, py::array::c_style | py::array::forcecast>;

std::span<const gdn::Token> token_span(const Tokens& t) {
  if (t.ndim() > 1) throw gdn::Error(gdn::Status::invalid_argument, "tokens must be a 1-d sequence of token ids");
  return {t.data(), static_cast<std::size_t>(t.size())};
}

// A StreamDecoder with its own copy of the tokenizer (copies share the tables), so the Python
// Tokenizer may go away first. `tok` is declared before `dec`, which points to it.
struct StreamDecoderHandle {
  StreamDecoderHandle(const gdn::Tokenizer& t, bool skip_special) : tok(t), dec(tok, skip_special) {}
  StreamDecoderHandle(const StreamDecoderHandle&) = delete;  // `dec` points into this object
  StreamDecoderHandle& operator=(const StreamDecoderHandle&) = delete;
  gdn::Tokenizer tok;
  gdn::StreamDecoder dec;
  UseLock lock{"the stream decoder"};
};

// A Generator with its own copy of the tokenizer; the Context is kept alive by keep_alive. Its
// calls take the context's lock.
struct GeneratorHandle {
  GeneratorHandle(ContextHandle& c, const gdn::Tokenizer& t, std::vector<gdn::Token> eos)
      : tok(t), gen(c.ctx, tok, std::move(eos)), lock(c.lock) {}
  GeneratorHandle(const GeneratorHandle&) = delete;  // `gen` refers to `tok`
  GeneratorHandle& operator=(const GeneratorHandle&) = delete;
  gdn::Tokenizer tok;
  gdn::Generator gen;
  std::shared_ptr<UseLock> lock;
};

// A SpeculativeDecoder takes its context's lock for every call, and for start / advance also the
// locks of the samplers it draws with (after the context's, in address order: no two calls wait
// for each other's). The samplers are kept alive by keep_alive, so their locks are too.
struct SpeculativeHandle {
  SpeculativeHandle(ContextHandle& c, const gdn::SpeculativeParams& p) : dec(c.ctx, p), lock(c.lock) {}
  gdn::SpeculativeDecoder dec;
  std::shared_ptr<UseLock> lock;
  std::unordered_map<gdn::SeqId, UseLock*> sampler_locks;  // of the started sequences; under `lock`
};

using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;

std::span<const float> float_span(const Floats& a) {
  if (a.ndim() != 1) throw gdn::Error(gdn::Status::invalid_argument, "logits must be a 1-d array of vocab_size floats");
  return {a.data(), static_cast<std::size_t>(a.size())};
}

// [{"role": ..., "content": ..., "reasoning_content": ..., "tool_calls": [...]}, ...] and tools, as
// transformers takes them: handed over as JSON (json.dumps keeps the keys' order, which the template writes).
std::string render_chat(const py::iterable& messages, const py::object& tools, bool add_generation_prompt, bool enable_thinking,
                        bool preserve_thinking) {
  py::list list;
  for (const py::handle item : messages) {
    if (!py::isinstance<py::dict>(item))
      throw gdn::Error(gdn::Status::invalid_argument, "each message must be a dict with 'role' and 'content'");
    if (!py::reinterpret_borrow<py::dict>(item).contains("role")) throw gdn::Error(gdn::Status::invalid_argument, "a message has no 'role'");
    list.append(item);
  }
  const py::object dumps = py::module_::import("json").attr("dumps");
  const auto messages_json = py::cast<std::string>(dumps(list, "ensure_ascii"_a = false));
  const auto tools_json = tools.is_none() ? std::string() : py::cast<std::string>(dumps(tools, "ensure_ascii"_a = false));
  gdn::ChatOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.enable_thinking = enable_thinking;
  o.preserve_thinking = preserve_thinking;
  return gdn::render_chat_json(messages_json, tools_json, o);
}

// The Python callable as a TextCallback: called with the GIL taken back; None or a true value
// goes on, a false value stops that sequence. An exception it raises propagates out of generate()
// (the Generator frees its sequences on the way).
gdn::TextCallback text_callback(const py::object& on_text) {
  if (on_text.is_none()) return {};
  return [&on_text](std::size_t sequence, std::string_view text) {
    py::gil_scoped_acquire gil;
    const py::object r = on_text(sequence, py::str(text.data(), text.size()));
    if (r.is_none()) return true;
    const int truth = PyObject_IsTrue(r.ptr());
    if (truth < 0) throw py::error_already_set();
    return truth == 1;
  };
}

}  // namespace

PYBIND11_MODULE(gdn, m) {
  m.doc() =
      "libgdn: Gated DeltaNet hybrid language models (Qwen3.5 / Qwen3.6 dense, Qwen3-Next) from Hugging Face "
      "checkpoints.\n\n"
      "    model = gdn.Model.load('path/to/checkpoint')\n"
      "    ctx = gdn.Context(model, max_sequences=4)\n"
      "    seq = ctx.create_sequence()\n"
      "    batch = gdn.Batch(); batch.add(seq, prompt)\n"
      "    ctx.step(batch)                      # releases the GIL\n"
      "    next_logits = ctx.logits(batch.last_row(0))   # numpy view, valid until the next step\n";
  m.attr("__version__") = GDN_VERSION_STRING;

  // --- enums and errors ---------------------------------------------------------------------
  py::enum_<gdn::Status>(m, "Status", "Status codes; values equal gdn_status of the C ABI.")
      .value("ok", gdn::Status::ok)
      .value("invalid_argument", gdn::Status::invalid_argument)
      .value("io_error", gdn::Status::io_error)
      .value("invalid_file", gdn::Status::invalid_file)
      .value("unsupported_model", gdn::Status::unsupported_model)
      .value("missing_tensor", gdn::Status::missing_tensor)
      .value("tensor_mismatch", gdn::Status::tensor_mismatch)
      .value("out_of_capacity", gdn::Status::out_of_capacity)
      .value("invalid_sequence", gdn::Status::invalid_sequence)
      .value("context_overflow", gdn::Status::context_overflow)
      .value("invalid_token", gdn::Status::invalid_token)
      .value("backend_unavailable", gdn::Status::backend_unavailable)
      .value("internal", gdn::Status::internal)
      .value("busy", gdn::Status::busy);

  py::enum_<gdn::DType>(m, "DType")
      .value("f32", gdn::DType::f32)
      .value("f16", gdn::DType::f16)
      .value("bf16", gdn::DType::bf16);
  py::enum_<gdn::MatmulInput>(m, "MatmulInput",
                              "The precision activations enter the projections at: float32 (exact, default) or bf16 "
                              "(rounded first, as transformers runs a bf16 checkpoint; faster prefill and batched decode "
                              "on AVX-512-BF16 CPUs).")
      .value("float32", gdn::MatmulInput::float32)
      .value("bf16", gdn::MatmulInput::bf16);
  py::enum_<gdn::LogitsFor>(m, "LogitsFor", "Which positions of a batch entry get logits.")
      .value("none", gdn::LogitsFor::none)
      .value("last", gdn::LogitsFor::last)
      .value("all", gdn::LogitsFor::all);
  py::enum_<gdn::Backend>(m, "Backend").value("cpu", gdn::Backend::cpu).value("cuda", gdn::Backend::cuda);
  py::enum_<gdn::LayerKind>(m, "LayerKind")
      .value("linear_attention", gdn::LayerKind::linear_attention)
      .value("full_attention", gdn::LayerKind::full_attention);

  exception_classes = new std::array<PyObject*, n_status>{};
  {
    PyObject* base = PyErr_NewExceptionWithDoc("gdn.Error",
                                               "A libgdn error. .status is a gdn.Status; str(e) is the library's message.",
                                               PyExc_Exception, nullptr);
    PyObject_SetAttrString(base, "status", Py_None);
    (*exception_classes)[0] = base;
    m.add_object("Error", py::reinterpret_borrow<py::object>(base));
    for (int s = 1; s < n_status; ++s) {
      const std::string qualified = std::string("gdn.") + exception_names[s];
      PyObject* cls = PyErr_NewException(qualified.c_str(), base, nullptr);
      py::object status = py::cast(static_cast<gdn::Status>(s));
      PyObject_SetAttrString(cls, "status", status.ptr());
      (*exception_classes)[static_cast<std::size_t>(s)] = cls;
      m.add_object(exception_names[s], py::reinterpret_borrow<py::object>(cls));
    }
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gdn::Error& e) {
      raise_gdn_error(e);
    }
  });

  // --- model --------------------------------------------------------------------------------
  py::class_<gdn::ModelConfig>(m, "ModelConfig", "The text model's configuration (read from config.json).")
      .def_readonly("architecture", &gdn::ModelConfig::architecture)
      .def_readonly("model_type", &gdn::ModelConfig::model_type)
      .def_readonly("hidden_size", &gdn::ModelConfig::hidden_size)
      .def_readonly("num_layers", &gdn::ModelConfig::num_layers)
      .def_readonly("vocab_size", &gdn::ModelConfig::vocab_size)
      .def_readonly("intermediate_size", &gdn::ModelConfig::intermediate_size)
      .def_readonly("layer_types", &gdn::ModelConfig::layer_types)
      .def_readonly("num_attention_heads", &gdn::ModelConfig::num_attention_heads)
      .def_readonly("num_key_value_heads", &gdn::ModelConfig::num_key_value_heads)
      .def_readonly("head_dim", &gdn::ModelConfig::head_dim)
      .def_readonly("rotary_dim", &gdn::ModelConfig::rotary_dim)
      .def_readonly("rope_theta", &gdn::ModelConfig::rope_theta)
      .def_readonly("linear_num_key_heads", &gdn::ModelConfig::linear_num_key_heads)
      .def_readonly("linear_num_value_heads", &gdn::ModelConfig::linear_num_value_heads)
      .def_readonly("linear_key_head_dim", &gdn::ModelConfig::linear_key_head_dim)
      .def_readonly("linear_value_head_dim", &gdn::ModelConfig::linear_value_head_dim)
      .def_readonly("linear_conv_kernel_dim", &gdn::ModelConfig::linear_conv_kernel_dim)
      .def_readonly("rms_norm_eps", &gdn::ModelConfig::rms_norm_eps)
      .def_readonly("tie_word_embeddings", &gdn::ModelConfig::tie_word_embeddings)
      .def_readonly("mtp_num_hidden_layers", &gdn::ModelConfig::mtp_num_hidden_layers)
      .def_readonly("max_position_embeddings", &gdn::ModelConfig::max_position_embeddings)
      .def_readonly("ssm_state_dtype", &gdn::ModelConfig::ssm_state_dtype)
      .def_readonly("eos_token_ids", &gdn::ModelConfig::eos_token_ids)
      .def("count_layers", &gdn::ModelConfig::count_layers, "kind"_a)
      .def("__repr__", [](const gdn::ModelConfig& c) {
        return "<gdn.ModelConfig " + c.architecture + ", " + std::to_string(c.num_layers) + " layers, hidden " +
               std::to_string(c.hidden_size) + ", vocab " + std::to_string(c.vocab_size) + ">";
      });

  py::class_<ModelHandle>(m, "Model", "An immutable model; share it between contexts and threads.")
      .def_static(
          "load",
          [](const std::string& path, bool load_mtp, bool pack_weights, const std::string& weights,
             const std::optional<std::string>& packed_image, gdn::Backend backend, int device, const std::string& quant,
             const std::string& lm_head_quant) {
            gdn::ModelParams p;
            p.load_mtp = load_mtp;
            p.quant = gdn::parse_weight_quant(quant);
            p.lm_head_quant = gdn::parse_lm_head_quant(lm_head_quant);
            p.weights = placement_named(weights);
            if (!pack_weights) p.weights = gdn::WeightPlacement::in_place;
            if (packed_image) p.packed_image = *packed_image;
            p.backend = backend;
            p.device = device;
            py::gil_scoped_release nogil;
            return ModelHandle{gdn::Model::load(path, p)};
          },
          "path"_a, py::kw_only(), "load_mtp"_a = gdn::ModelParams{}.load_mtp, "pack_weights"_a = true, "weights"_a = "auto",
          "packed_image"_a = py::none(), "backend"_a = gdn::ModelParams{}.backend, "device"_a = gdn::ModelParams{}.device,
          "quant"_a = "none", "lm_head_quant"_a = "auto",
          "Loads a Hugging Face checkpoint directory (config.json + safetensors), validated and memory-mapped. "
          "weights (the CPU backend's; the CUDA backend uploads its own copy): 'auto' (a valid packed image when there "
          "is one, else packed at load when that fits the memory available, else in place), 'pack' (packed at load, no "
          "image looked for), 'in_place' or 'image' (see gdn/model/model.hpp, WeightPlacement); "
          "pack_weights=False is weights='in_place'. packed_image: the image file to look for (default "
          "MODEL_DIR/gdn-packed.<layout>.gdnimg, what gdn.pack writes). "
          "backend: whose form of the weights to make now (gdn.Backend.cuda: upload them to `device`). "
          "quant: 'none', 'q8_0', 'q4_0', 'q4_k' or 'q4_k_m' (block-quantised projections, docs/quantization.md: the image gdn.pack(..., "
          "quant=) wrote, else quantised at load). lm_head_quant: the lm_head's format under quant: 'auto' (q8_0 "
          "under the 4-bit quants, else quant's), 'q8_0', 'q4_0' or 'q4_k' (another than auto's has its own image, "
          "MODEL_DIR/gdn-packed.<quant>.lm_head-<format>.gdnimg).")
      .def_property_readonly("weights",
                             [](const ModelHandle& pm) {
                               const auto w = pm.model->weight_placement();
                               return std::string(w == gdn::WeightPlacement::in_place ? "in_place" : gdn::weight_placement_name(w));
                             },
                             "What loading chose: 'packed', 'image' or 'in_place'.")
      .def_property_readonly("weight_notice", [](const ModelHandle& pm) { return pm.model->weight_notice(); })
      .def_property_readonly(
          "config", [](const ModelHandle& pm) -> const gdn::ModelConfig& { return pm.model->config(); },
          py::return_value_policy::reference_internal)
      .def_property_readonly("has_mtp", [](const ModelHandle& pm) { return pm.model->has_mtp(); })
      .def_property_readonly("path", [](const ModelHandle& pm) { return pm.model->dir(); })
      .def("__repr__", [](const ModelHandle& pm) { return "<gdn.Model " + pm.model->dir() + ">"; });

  // --- batch --------------------------------------------------------------------------------
  py::class_<gdn::Batch::Entry>(m, "BatchEntry")
      .def_readonly("seq", &gdn::Batch::Entry::seq)
      .def_readonly("token_begin", &gdn::Batch::Entry::token_begin)
      .def_readonly("token_count", &gdn::Batch::Entry::token_count)
      .def_readonly("output_begin", &gdn::Batch::Entry::output_begin)
      .def_readonly("logits", &gdn::Batch::Entry::logits)
      .def_readonly("hidden_all", &gdn::Batch::Entry::hidden_all);

  auto check_entry = [](const gdn::Batch& b, std::size_t e) {
    if (e >= b.entries().size())
      throw py::index_error("entry " + std::to_string(e) + " of a batch of " + std::to_string(b.entries().size()));
  };
  // A method without arguments as one call under the batch's lock (a step reads it without the GIL).
  const auto batch_call = [](const char* call, auto f) {
    return [call, f](BatchHandle& b) {
      const Use use(b.lock, call, gil_held);
      return f(b.batch);
    };
  };
  py::class_<BatchHandle>(m, "Batch",
                          "Which sequences advance by which tokens in one step, and which positions want logits. May be "
                          "shared between threads: its calls, and the steps that read it, take turns.")
      .def(py::init<>())
      .def(
          "add",
          [](BatchHandle& b, gdn::SeqId seq, gdn::Token token, gdn::LogitsFor logits, bool hidden_all) {
            const Use use(b.lock, "Batch.add", gil_held);
            return b.batch.add(seq, std::span<const gdn::Token>(&token, 1), logits, hidden_all);
          },
          "seq"_a, "tokens"_a, "logits"_a = gdn::LogitsFor::last, "hidden_all"_a = false)
      .def(
          "add",
          [](BatchHandle& b, gdn::SeqId seq, const Tokens& tokens, gdn::LogitsFor logits, bool hidden_all) {
            const auto span = token_span(tokens);
            const Use use(b.lock, "Batch.add", gil_held);
            return b.batch.add(seq, span, logits, hidden_all);
          },
          "seq"_a, "tokens"_a, "logits"_a = gdn::LogitsFor::last, "hidden_all"_a = false,
          "Appends tokens (an int or a sequence of ints) for seq; returns the entry's index.")
      .def("clear", batch_call("Batch.clear", [](gdn::Batch& b) { b.clear(); }))
      .def_property_readonly("entries", batch_call("Batch.entries", [](gdn::Batch& b) {
                               return std::vector<gdn::Batch::Entry>(b.entries().begin(), b.entries().end());
                             }))
      .def_property_readonly("tokens", [](BatchHandle& bh) {
        const Use use(bh.lock, "Batch.tokens", gil_held);
        const gdn::Batch& b = bh.batch;
        // Explicit strides: see Sampler.distribution.
        py::array out(py::dtype::of<gdn::Token>(), {static_cast<py::ssize_t>(b.tokens().size())},
                      {static_cast<py::ssize_t>(sizeof(gdn::Token))});
        std::copy(b.tokens().begin(), b.tokens().end(), static_cast<gdn::Token*>(out.mutable_data()));
        return out;
      })
      .def_property_readonly("token_count", batch_call("Batch.token_count", [](gdn::Batch& b) { return b.token_count(); }))
      .def_property_readonly("output_rows", batch_call("Batch.output_rows", [](gdn::Batch& b) { return b.output_rows(); }))
      .def(
          "output_row",
          [check_entry](BatchHandle& bh, std::size_t e, std::int64_t i) {
            const Use use(bh.lock, "Batch.output_row", gil_held);
            check_entry(bh.batch, e);
            return bh.batch.output_row(e, i);
          },
          "entry"_a, "i"_a, "The output row of entry's token i, or -1.")
      .def(
          "last_row",
          [check_entry](BatchHandle& bh, std::size_t e) {
            const Use use(bh.lock, "Batch.last_row", gil_held);
            check_entry(bh.batch, e);
            return bh.batch.last_row(e);
          },
          "entry"_a, "The output row of entry's last token, or -1.")
      .def("__len__", batch_call("Batch.__len__", [](gdn::Batch& b) { return b.entries().size(); }));

  // --- context ------------------------------------------------------------------------------
  const gdn::ContextParams d;
  py::class_<ContextHold>(m, "ContextHold",
                          "What Context.hold() returns: `with ctx.hold():` keeps other threads' calls on the context "
                          "(and its Generators and SpeculativeDecoders) waiting until the block ends.")
      .def("__enter__", [](ContextHold& h) { h.lock->hold("Context.hold"); })
      .def("__exit__", [](ContextHold& h, const py::args&) {
        h.lock->unhold("Context.hold");
        return false;
      });

  py::class_<ContextHandle>(m, "Context",
                            "The mutable state of up to max_sequences sequences of one model, allocated at creation.\n\n"
                            "A context may be shared between threads: each call on it (and on a Generator or "
                            "SpeculativeDecoder over it) waits, with the GIL released, until the call running on another "
                            "thread has finished. A step and the reading of its outputs are two calls, so another thread's "
                            "step may come between them: do both inside `with ctx.hold():`. A callback (on_text) that calls "
                            "back into the context its generation runs on raises gdn.BusyError.")
      .def(py::init([](const ModelHandle& pm, int max_sequences, int max_context, int kv_page_size, std::int64_t kv_pages,
                       int max_batch_tokens, int max_logits_rows, std::optional<gdn::DType> state_dtype, int threads,
                       int gdn_chunk_min_tokens, int max_rollback_tokens, gdn::Backend backend, int device, bool cuda_graphs,
                       gdn::MatmulInput matmul_input, std::optional<gdn::DType> kv_dtype) {
             gdn::ContextParams p;
             p.max_sequences = max_sequences;
             p.max_context = max_context;
             p.kv_page_size = kv_page_size;
             p.kv_pages = kv_pages;
             p.max_batch_tokens = max_batch_tokens;
             p.max_logits_rows = max_logits_rows;
             p.state_dtype = state_dtype;
             p.threads = threads;
             p.gdn_chunk_min_tokens = gdn_chunk_min_tokens;
             p.max_rollback_tokens = max_rollback_tokens;
             p.backend = backend;
             p.device = device;
             p.cuda_graphs = cuda_graphs;
             p.matmul_input = matmul_input;
             p.kv_dtype = kv_dtype;
             return std::make_unique<ContextHandle>(pm.model, p);
           }),
           "model"_a, py::kw_only(), "max_sequences"_a = d.max_sequences, "max_context"_a = d.max_context,
           "kv_page_size"_a = d.kv_page_size, "kv_pages"_a = d.kv_pages, "max_batch_tokens"_a = d.max_batch_tokens,
           "max_logits_rows"_a = d.max_logits_rows, "state_dtype"_a = py::none(), "threads"_a = d.threads,
           "gdn_chunk_min_tokens"_a = d.gdn_chunk_min_tokens, "max_rollback_tokens"_a = d.max_rollback_tokens,
           "backend"_a = d.backend, "device"_a = d.device, "cuda_graphs"_a = d.cuda_graphs, "matmul_input"_a = d.matmul_input,
           "kv_dtype"_a = py::none())
      .def_property_readonly("model", [](const ContextHandle& c) { return ModelHandle{c.model}; })
      .def("hold", [](const ContextHandle& c) { return ContextHold{c.lock}; },
           "`with ctx.hold():` makes the calls of the block one turn: other threads wait until it ends. Nests; a "
           "callback cannot take it (gdn.BusyError). Like any lock: two threads that each hold one context and wait "
           "for the other's wait forever.")
      // sequences
      .def("create_sequence",
           [](ContextHandle& c) { return with_context(c, "Context.create_sequence", [](gdn::Context& x) { return x.create_sequence(); }); })
      .def(
          "reset_sequence",
          [](ContextHandle& c, gdn::SeqId s) { with_context(c, "Context.reset_sequence", [&](gdn::Context& x) { x.reset_sequence(s); }); },
          "seq"_a)
      .def(
          "free_sequence",
          [](ContextHandle& c, gdn::SeqId s) { with_context(c, "Context.free_sequence", [&](gdn::Context& x) { x.free_sequence(s); }); },
          "seq"_a)
      .def(
          "is_valid",
          [](ContextHandle& c, gdn::SeqId s) { return with_context(c, "Context.is_valid", [&](gdn::Context& x) { return x.is_valid(s); }); },
          "seq"_a)
      .def(
          "sequence_length",
          [](ContextHandle& c, gdn::SeqId s) {
            return with_context(c, "Context.sequence_length", [&](gdn::Context& x) { return x.sequence_length(s); });
          },
          "seq"_a)
      .def(
          "mtp_length",
          [](ContextHandle& c, gdn::SeqId s) { return with_context(c, "Context.mtp_length", [&](gdn::Context& x) { return x.mtp_length(s); }); },
          "seq"_a)
      .def_property_readonly(
          "live_sequences",
          [](ContextHandle& c) { return with_context(c, "Context.live_sequences", [](gdn::Context& x) { return x.live_sequences(); }); })
      // state control
      .def(
          "snapshot",
          [](ContextHandle& c, gdn::SeqId s) { return with_context(c, "Context.snapshot", [&](gdn::Context& x) { return x.snapshot(s); }); },
          "seq"_a)
      .def(
          "free_snapshot",
          [](ContextHandle& c, gdn::SnapshotId s) { with_context(c, "Context.free_snapshot", [&](gdn::Context& x) { x.free_snapshot(s); }); },
          "snapshot"_a)
      .def(
          "restore",
          [](ContextHandle& c, gdn::SeqId s, gdn::SnapshotId snap) {
            with_context(c, "Context.restore", [&](gdn::Context& x) { x.restore(s, snap); });
          },
          "seq"_a, "snapshot"_a)
      .def(
          "create_sequence_from",
          [](ContextHandle& c, gdn::SnapshotId snap) {
            return with_context(c, "Context.create_sequence_from", [&](gdn::Context& x) { return x.create_sequence_from(snap); });
          },
          "snapshot"_a)
      .def(
          "fork_sequence",
          [](ContextHandle& c, gdn::SeqId s) { return with_context(c, "Context.fork_sequence", [&](gdn::Context& x) { return x.fork_sequence(s); }); },
          "seq"_a)
      .def(
          "rollback",
          [](ContextHandle& c, gdn::SeqId s, std::int64_t keep) {
            with_context(c, "Context.rollback", [&](gdn::Context& x) { x.rollback(s, keep); });
          },
          "seq"_a, "keep"_a)
      .def(
          "rollbackable_tokens",
          [](ContextHandle& c, gdn::SeqId s) {
            return with_context(c, "Context.rollbackable_tokens", [&](gdn::Context& x) { return x.rollbackable_tokens(s); });
          },
          "seq"_a)
      .def(
          "truncate_mtp",
          [](ContextHandle& c, gdn::SeqId s, std::int64_t n) {
            with_context(c, "Context.truncate_mtp", [&](gdn::Context& x) { x.truncate_mtp(s, n); });
          },
          "seq"_a, "mtp_length"_a)
      .def(
          "save_sequence",
          [](ContextHandle& c, gdn::SeqId s, const std::string& path) {
            without_gil(c, "Context.save_sequence", [&](gdn::Context& x) { x.save_sequence(s, path); });
          },
          "seq"_a, "path"_a)
      .def(
          "load_sequence",
          [](ContextHandle& c, const std::string& path) {
            return without_gil(c, "Context.load_sequence", [&](gdn::Context& x) { return x.load_sequence(path); });
          },
          "path"_a)
      // steps
      .def(
          "step",
          [](ContextHandle& c, BatchHandle& b) {
            without_gil(c, "Context.step", [&](gdn::Context& x) {
              const Use reading(b.lock, "Context.step", gil_released);
              x.step(b.batch);
            });
          },
          "batch"_a,
          "Advances every sequence of the batch (the GIL is released meanwhile). Views of the previous outputs "
          "are overwritten.")
      .def(
          "step_mtp",
          [](ContextHandle& c, BatchHandle& b, const py::array_t<float, py::array::c_style | py::array::forcecast>& hidden) {
            std::span<const float> h(hidden.data(), static_cast<std::size_t>(hidden.size()));
            without_gil(c, "Context.step_mtp", [&](gdn::Context& x) {
              const Use reading(b.lock, "Context.step_mtp", gil_released);
              x.step_mtp(b.batch, h);
            });
          },
          "batch"_a, "hidden"_a,
          "Runs the MTP head; hidden holds one hidden_size row per batch token (the main model's hidden state of the "
          "position before it).")
      // outputs
      .def_property_readonly("output_rows",
                             [](ContextHandle& c) { return with_context(c, "Context.output_rows", [](gdn::Context& x) { return x.output_rows(); }); })
      .def(
          "logits",
          [](py::object self, std::optional<std::int64_t> row) {
            const auto V = self.cast<ContextHandle&>().model->config().vocab_size;
            return rows_view(self, row, V, [](const gdn::Context& c, std::int64_t r) { return c.logits(r); }, "Context.logits");
          },
          "row"_a = py::none(),
          "Logits of output row `row` ([vocab] float32), or of every row ([rows, vocab]): a read-only view of the "
          "context's buffer, overwritten by the next step (another thread's too; after it, the view reads that step's or "
          "stale numbers, never freed memory).")
      .def(
          "hidden",
          [](py::object self, std::optional<std::int64_t> row) {
            const auto H = self.cast<ContextHandle&>().model->config().hidden_size;
            return rows_view(self, row, H, [](const gdn::Context& c, std::int64_t r) { return c.hidden(r); }, "Context.hidden");
          },
          "row"_a = py::none(), "Final hidden state (after the last norm) of output row `row`, or of every row; a view.")
      // memory
      .def_property_readonly("gdn_state_bytes_per_sequence",
                             [](ContextHandle& c) {
                               return with_context(c, "Context.gdn_state_bytes_per_sequence",
                                                   [](gdn::Context& x) { return x.gdn_state_bytes_per_sequence(); });
                             })
      .def_property_readonly(
          "kv_bytes_per_token",
          [](ContextHandle& c) { return with_context(c, "Context.kv_bytes_per_token", [](gdn::Context& x) { return x.kv_bytes_per_token(); }); })
      .def_property_readonly(
          "kv_free_pages",
          [](ContextHandle& c) { return with_context(c, "Context.kv_free_pages", [](gdn::Context& x) { return x.kv_free_pages(); }); })
      .def_property_readonly(
          "snapshot_bytes",
          [](ContextHandle& c) { return with_context(c, "Context.snapshot_bytes", [](gdn::Context& x) { return x.snapshot_bytes(); }); });

  // --- memory plan, packed image ----------------------------------------------------------------
  m.def(
      "memory_plan",
      [](const std::string& path, int max_sequences, int max_context, std::optional<gdn::DType> state_dtype,
         gdn::Backend backend, int max_batch_tokens, int max_rollback_tokens, int threads, const std::string& weights,
         const std::optional<std::string>& packed_image, std::optional<gdn::DType> kv_dtype, const std::string& quant,
         const std::string& lm_head_quant) {
        gdn::ContextParams p;
        p.max_sequences = max_sequences;
        p.max_context = max_context;
        p.state_dtype = state_dtype;
        p.kv_dtype = kv_dtype;
        p.backend = backend;
        p.max_batch_tokens = max_batch_tokens;
        p.max_rollback_tokens = max_rollback_tokens;
        p.threads = threads;
        gdn::ModelParams mp;
        mp.weights = placement_named(weights);
        if (packed_image) mp.packed_image = *packed_image;
        mp.quant = gdn::parse_weight_quant(quant);
        mp.lm_head_quant = gdn::parse_lm_head_quant(lm_head_quant);
        std::string json;
        {
          py::gil_scoped_release nogil;
          json = gdn::plan_memory(path, p, mp).to_json(-1);
        }
        return py::module_::import("json").attr("loads")(json);
      },
      "path"_a, py::kw_only(), "max_sequences"_a = 1, "max_context"_a = d.max_context, "state_dtype"_a = py::none(),
      "backend"_a = gdn::Backend::cpu, "max_batch_tokens"_a = d.max_batch_tokens, "max_rollback_tokens"_a = 0,
      "threads"_a = 0, "weights"_a = "auto", "packed_image"_a = py::none(), "kv_dtype"_a = py::none(), "quant"_a = "none",
      "lm_head_quant"_a = "auto",
      "The memory plan of a checkpoint for these context parameters, from config.json and the safetensors headers only "
      "(no weight is read; `gdn info`): a dict of byte counts (weights, per-sequence GDN state, KV per token, rollback, "
      "work buffers, outputs, totals) and what loading would do with the weights.");
  m.def(
      "pack",
      [](const std::string& path, const std::optional<std::string>& out, const std::string& quant, const std::string& lm_head_quant) {
        gdn::PackImageOptions o;
        if (out) o.out = *out;
        o.quant = gdn::parse_weight_quant(quant);
        o.lm_head_quant = gdn::parse_lm_head_quant(lm_head_quant);
        gdn::PackImageResult r;
        {
          py::gil_scoped_release nogil;
          r = gdn::write_packed_image(path, o);
        }
        py::dict d;
        d["path"] = r.path;
        d["layout"] = r.layout;
        d["file_bytes"] = r.file_bytes;
        d["written_bytes"] = r.written_bytes;
        d["tensors"] = r.tensors;
        d["seconds"] = r.seconds;
        return d;
      },
      "path"_a, "out"_a = py::none(), "quant"_a = "none", "lm_head_quant"_a = "auto",
      "Writes the packed weight image of a checkpoint (`gdn pack`); later loads map it instead of packing the weights. "
      "quant 'q8_0' / 'q4_0' / 'q4_k' / 'q4_k_m': the block-quantised image that Model.load(..., quant=, lm_head_quant=) maps; "
      "lm_head_quant: the lm_head's format ('auto': q8_0 under the 4-bit quants).");

  // --- gdn doctor ---------------------------------------------------------------------------
  m.def(
      "doctor",
      [](const std::string& path, bool quick, int threads, std::optional<gdn::DType> state_dtype) {
        gdn::DoctorOptions o;
        o.quick = quick;
        o.threads = threads;
        o.state_dtype = state_dtype;
        std::string json;
        {
          py::gil_scoped_release nogil;
          json = gdn::run_doctor(path, o).to_json(-1);
        }
        return py::module_::import("json").attr("loads")(json);
      },
      "path"_a, py::kw_only(), "quick"_a = false, "threads"_a = 0, "state_dtype"_a = py::none(),
      "Self-check of a checkpoint (`gdn doctor`): a dict {'ok', 'counts', 'checks': [{'name', 'verdict', 'metric', "
      "'measured', 'threshold', 'message', 'details', 'seconds'}, ...]}; 'ok' is False when any check FAILed.");

  // --- text: tokenizer, chat template ----------------------------------------------------------
  py::class_<StreamDecoderHandle>(m, "StreamDecoder",
                                  "Incremental decoding: push() one id at a time, get back only complete UTF-8 text; "
                                  "the pushes and the final flush() concatenate to Tokenizer.decode() of the same ids. "
                                  "Calls from several threads take turns (the order of the pushes is theirs to keep).")
      .def(
          "push",
          [](StreamDecoderHandle& self, gdn::Token id) {
            const Use use(self.lock, "StreamDecoder.push", gil_held);
            return self.dec.push(id);
          },
          "id"_a)
      .def(
          "flush",
          [](StreamDecoderHandle& self) {
            const Use use(self.lock, "StreamDecoder.flush", gil_held);
            return self.dec.flush();
          },
          "Whatever is still held (an unfinished character as U+FFFD); then starts afresh.")
      .def("reset",
           [](StreamDecoderHandle& self) {
             const Use use(self.lock, "StreamDecoder.reset", gil_held);
             self.dec.reset();
           })
      .def_property_readonly("pending_bytes", [](StreamDecoderHandle& self) {
        const Use use(self.lock, "StreamDecoder.pending_bytes", gil_held);
        return self.dec.pending_bytes();
      });

  py::class_<gdn::Tokenizer>(m, "Tokenizer",
                             "A Hugging Face tokenizer.json (byte-level BPE, as Qwen3.5 / Qwen3.6 ship it), ids identical to "
                             "Hugging Face tokenizers'. Immutable; safe to share between threads.")
      .def_static(
          "from_file",
          [](const std::string& path) {
            py::gil_scoped_release nogil;
            return gdn::Tokenizer::load(path);
          },
          "path"_a, "Reads a tokenizer.json file.")
      .def_static(
          "from_model_dir",
          [](const std::string& dir) {
            py::gil_scoped_release nogil;
            return gdn::Tokenizer::load(dir + "/tokenizer.json");
          },
          "model_dir"_a, "Reads MODEL_DIR/tokenizer.json.")
      .def_static("from_json", [](const std::string& json) { return gdn::Tokenizer::from_json(json); }, "json"_a,
                  "The same from the text of a tokenizer.json.")
      .def(
          "encode",
          [](const gdn::Tokenizer& t, const std::string& text, bool parse_special) {
            py::gil_scoped_release nogil;
            return t.encode(text, parse_special);
          },
          "text"_a, py::kw_only(), "parse_special"_a = true,
          "Ids for text (no BOS/EOS added). parse_special=False reads special tokens in the text as plain text.")
      .def(
          "decode",
          [](const gdn::Tokenizer& t, const Tokens& ids, bool skip_special) {
            const auto span = token_span(ids);
            py::gil_scoped_release nogil;
            return t.decode(span, skip_special);
          },
          "ids"_a, py::kw_only(), "skip_special"_a = false)
      .def_property_readonly("vocab_size", &gdn::Tokenizer::vocab_size)
      .def("token_to_id", &gdn::Tokenizer::token_to_id, "token"_a, "The id of a token as tokenizer.json spells it, or None.")
      .def("id_to_token", &gdn::Tokenizer::id_to_token, "id"_a)
      .def("is_special", &gdn::Tokenizer::is_special, "id"_a)
      .def(
          "stream_decoder",
          [](const gdn::Tokenizer& t, bool skip_special) { return std::make_unique<StreamDecoderHandle>(t, skip_special); },
          py::kw_only(), "skip_special"_a = false)
      .def(
          "apply_chat_template",
          [](const gdn::Tokenizer& t, const py::iterable& messages, const py::object& tools, bool add_generation_prompt,
             bool enable_thinking, bool preserve_thinking, bool tokenize) -> py::object {
            std::string text = render_chat(messages, tools, add_generation_prompt, enable_thinking, preserve_thinking);
            if (!tokenize) return py::str(text);
            return py::cast(t.encode(text));
          },
          "messages"_a, py::kw_only(), "tools"_a = py::none(), "add_generation_prompt"_a = false, "enable_thinking"_a = true,
          "preserve_thinking"_a = false, "tokenize"_a = false,
          "The Qwen3.5 / Qwen3.6 chat template (what transformers' apply_chat_template returns) for "
          "[{'role', 'content', 'reasoning_content', 'tool_calls'}] messages and optional tools; the ids instead with "
          "tokenize=True.");

  m.def("render_chat", &render_chat, "messages"_a, py::kw_only(), "tools"_a = py::none(), "add_generation_prompt"_a = false,
        "enable_thinking"_a = true, "preserve_thinking"_a = false,
        "The Qwen3.5 / Qwen3.6 chat template rendered for [{'role', 'content', 'reasoning_content', 'tool_calls'}] "
        "messages and optional tools ([{'type': 'function', 'function': {...}}]), as transformers renders them; "
        "image and video parts raise (the model reads text only).");

  // --- sampling -------------------------------------------------------------------------------
  const gdn::SamplingParams sd;
  py::class_<gdn::SamplingParams>(m, "SamplingParams", "Per-sequence sampling settings; temperature 0 is greedy.")
      .def(py::init([](float temperature, int top_k, float top_p, float min_p, float repetition_penalty, float presence_penalty,
                       std::uint64_t seed, float frequency_penalty) {
             return gdn::SamplingParams{temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, seed, frequency_penalty};
           }),
           py::kw_only(), "temperature"_a = sd.temperature, "top_k"_a = sd.top_k, "top_p"_a = sd.top_p, "min_p"_a = sd.min_p,
           "repetition_penalty"_a = sd.repetition_penalty, "presence_penalty"_a = sd.presence_penalty, "seed"_a = sd.seed,
           "frequency_penalty"_a = sd.frequency_penalty)
      .def_readwrite("temperature", &gdn::SamplingParams::temperature)
      .def_readwrite("top_k", &gdn::SamplingParams::top_k)
      .def_readwrite("top_p", &gdn::SamplingParams::top_p)
      .def_readwrite("min_p", &gdn::SamplingParams::min_p)
      .def_readwrite("repetition_penalty", &gdn::SamplingParams::repetition_penalty)
      .def_readwrite("presence_penalty", &gdn::SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &gdn::SamplingParams::frequency_penalty)
      .def_readwrite("seed", &gdn::SamplingParams::seed)
      .def("__repr__", [](const gdn::SamplingParams& p) {
        return "<gdn.SamplingParams temperature=" + std::to_string(p.temperature) + " top_k=" + std::to_string(p.top_k) +
               " top_p=" + std::to_string(p.top_p) + " seed=" + std::to_string(p.seed) + ">";
      });

  py::class_<SamplerHandle>(m, "Sampler",
                            "One sequence's sampler: settings, the tokens its penalties have seen, a seeded RNG. "
                            "sample() does not record the token it draws: observe() it. Calls from several threads take "
                            "turns, also with a SpeculativeDecoder sampling with it.")
      .def(py::init<const gdn::SamplingParams&, int>(), "params"_a, "vocab_size"_a)
      .def_property_readonly("params", [](const SamplerHandle& s) { return s.sampler.params(); })  // fixed at creation
      .def_property_readonly("greedy", [](const SamplerHandle& s) { return s.sampler.greedy(); })
      .def(
          "observe",
          [](SamplerHandle& s, gdn::Token t) {
            const Use use(s.lock, "Sampler.observe", gil_held);
            s.sampler.observe(t);
          },
          "tokens"_a)
      .def(
          "observe",
          [](SamplerHandle& s, const Tokens& ts) {
            const auto span = token_span(ts);
            const Use use(s.lock, "Sampler.observe", gil_held);
            s.sampler.observe(span);
          },
          "tokens"_a)
      .def(
          "sample",
          [](SamplerHandle& s, const Floats& logits) {
            const auto l = float_span(logits);
            const Use use(s.lock, "Sampler.sample", gil_held);
            return s.sampler.sample(l);
          },
          "logits"_a)
      .def(
          "distribution",
          [](SamplerHandle& s, const Floats& logits) {
            const auto l = float_span(logits);
            // Explicit strides, as view() passes them: pybind11 < 2.12 reads the item size from
            // NumPy 1's descriptor layout, which is wrong under NumPy 2 when it computes strides.
            py::array probs(py::dtype::of<float>(), {static_cast<py::ssize_t>(l.size())},
                            {static_cast<py::ssize_t>(sizeof(float))});
            const Use use(s.lock, "Sampler.distribution", gil_held);  // it works in the sampler's scratch
            s.sampler.distribution(l, std::span<float>(static_cast<float*>(probs.mutable_data()), l.size()));
            return probs;
          },
          "logits"_a, "The distribution a draw would come from (sums to 1; one-hot for greedy).")
      .def("uniform", [](SamplerHandle& s) {
        const Use use(s.lock, "Sampler.uniform", gil_held);
        return s.sampler.uniform();
      });

  // --- generation -----------------------------------------------------------------------------
  const gdn::GenerationParams gd;
  py::class_<gdn::GenerationParams>(m, "GenerationParams")
      .def(py::init([](std::optional<gdn::SamplingParams> sampling, int max_tokens, bool stop_on_eos,
                       std::vector<gdn::Token> stop_tokens, std::vector<std::string> stop_strings, int mtp_draft,
                       bool mtp_adaptive) {
             gdn::GenerationParams p;
             if (sampling) p.sampling = *sampling;
             p.max_tokens = max_tokens;
             p.stop_on_eos = stop_on_eos;
             p.stop_tokens = std::move(stop_tokens);
             p.stop_strings = std::move(stop_strings);
             p.mtp_draft = mtp_draft;
             p.mtp_adaptive = mtp_adaptive;
             return p;
           }),
           py::kw_only(), "sampling"_a = py::none(), "max_tokens"_a = gd.max_tokens, "stop_on_eos"_a = gd.stop_on_eos,
           "stop_tokens"_a = std::vector<gdn::Token>{}, "stop_strings"_a = std::vector<std::string>{},
           "mtp_draft"_a = gd.mtp_draft, "mtp_adaptive"_a = gd.mtp_adaptive)
      .def_readwrite("sampling", &gdn::GenerationParams::sampling)
      .def_readwrite("max_tokens", &gdn::GenerationParams::max_tokens)
      .def_readwrite("stop_on_eos", &gdn::GenerationParams::stop_on_eos)
      .def_readwrite("stop_tokens", &gdn::GenerationParams::stop_tokens)
      .def_readwrite("stop_strings", &gdn::GenerationParams::stop_strings)
      .def_readwrite("mtp_draft", &gdn::GenerationParams::mtp_draft)
      .def_readwrite("mtp_adaptive", &gdn::GenerationParams::mtp_adaptive);

  py::class_<gdn::SpeculativeStats>(m, "SpeculativeStats")
      .def_readonly("rounds", &gdn::SpeculativeStats::rounds)
      .def_readonly("drafted", &gdn::SpeculativeStats::drafted)
      .def_readonly("accepted", &gdn::SpeculativeStats::accepted)
      .def_readonly("generated", &gdn::SpeculativeStats::generated)
      .def_readonly("draft_rounds", &gdn::SpeculativeStats::draft_rounds)
      .def_readonly("k", &gdn::SpeculativeStats::k)
      .def_property_readonly("acceptance_rate", &gdn::SpeculativeStats::acceptance_rate)
      .def_property_readonly("tokens_per_round", &gdn::SpeculativeStats::tokens_per_round);

  py::class_<gdn::GenerationResult>(m, "GenerationResult")
      .def_readonly("tokens", &gdn::GenerationResult::tokens)
      .def_readonly("text", &gdn::GenerationResult::text)
      .def_property_readonly("finish_reason",
                             [](const gdn::GenerationResult& r) { return std::string(gdn::finish_reason_name(r.finish)); },
                             "'stop_token', 'stop_string', 'length' or 'cancelled'")
      .def_readonly("prompt_tokens", &gdn::GenerationResult::prompt_tokens)
      .def_readonly("prefill_seconds", &gdn::GenerationResult::prefill_seconds)
      .def_readonly("decode_seconds", &gdn::GenerationResult::decode_seconds)
      .def_readonly("speculative", &gdn::GenerationResult::speculative)
      .def("__repr__", [](const gdn::GenerationResult& r) {
        return "<gdn.GenerationResult " + std::to_string(r.tokens.size()) + " tokens, " +
               std::string(gdn::finish_reason_name(r.finish)) + ">";
      });

  py::class_<GeneratorHandle>(m, "Generator",
                              "Text generation on a Context: prompt ids in, streamed text out. Each call creates its "
                              "sequences in the context and frees them before it returns. Calls from several threads "
                              "take turns with each other and with every other call on the context; on_text must not "
                              "call into the context (gdn.BusyError).")
      .def(py::init([](ContextHandle& c, const gdn::Tokenizer& tok, std::optional<std::vector<gdn::Token>> eos) {
             return std::make_unique<GeneratorHandle>(c, tok, eos ? *eos : gdn::load_eos_token_ids(c.model->dir()));
           }),
           "ctx"_a, "tokenizer"_a, "eos"_a = py::none(), py::keep_alive<1, 2>(),
           "eos=None: the checkpoint's eos ids (config.json and generation_config.json).")
      .def(
          "generate",
          [](GeneratorHandle& g, const Tokens& prompt, const gdn::GenerationParams& params, const py::object& on_text) {
            const auto span = token_span(prompt);
            const gdn::TextCallback cb = text_callback(on_text);
            py::gil_scoped_release nogil;
            const Use use(*g.lock, "Generator.generate", gil_released);  // held while on_text runs
            return g.gen.generate(span, params, cb);
          },
          "prompt"_a, "params"_a = gdn::GenerationParams{}, "on_text"_a = py::none(),
          "Generates from prompt ids; on_text(sequence_index, text) receives each final piece of text (return False "
          "to stop: finish_reason 'cancelled'). Releases the GIL.")
      .def(
          "generate_batch",
          [](GeneratorHandle& g, const std::vector<std::vector<gdn::Token>>& prompts, const py::object& params,
             const py::object& on_text) {
            std::vector<gdn::GenerationParams> ps;
            if (params.is_none()) ps.assign(prompts.size(), gdn::GenerationParams{});
            else if (py::isinstance<gdn::GenerationParams>(params)) ps.assign(prompts.size(), params.cast<gdn::GenerationParams>());
            else ps = params.cast<std::vector<gdn::GenerationParams>>();
            const gdn::TextCallback cb = text_callback(on_text);
            py::gil_scoped_release nogil;
            const Use use(*g.lock, "Generator.generate_batch", gil_released);
            return g.gen.generate(prompts, ps, cb);
          },
          "prompts"_a, "params"_a = py::none(), "on_text"_a = py::none(),
          "Several prompts together; params is one GenerationParams for all or a list with one per prompt (all with "
          "the same mtp_draft). Returns a list of GenerationResult.");

  // --- speculative decoding -------------------------------------------------------------------
  const gdn::SpeculativeParams spd;
  py::class_<SpeculativeHandle>(m, "SpeculativeDecoder",
                                "MTP speculative decoding driven by the host: start() each sequence, advance() rounds, "
                                "finish(). The context needs max_rollback_tokens >= max_draft + 1. Calls take turns with "
                                "every other call on the context and on the samplers they draw with.")
      .def(py::init([](ContextHandle& c, int max_draft, bool adaptive) {
             return std::make_unique<SpeculativeHandle>(c, gdn::SpeculativeParams{max_draft, adaptive});
           }),
           "ctx"_a, py::kw_only(), "max_draft"_a = spd.max_draft, "adaptive"_a = spd.adaptive, py::keep_alive<1, 2>())
      .def(
          "start",
          [](SpeculativeHandle& self, gdn::SeqId seq, const Tokens& prompt, SamplerHandle& sampler) {
            const auto span = token_span(prompt);
            py::gil_scoped_release nogil;
            const Use use(*self.lock, "SpeculativeDecoder.start", gil_released);
            const Use sampling(sampler.lock, "SpeculativeDecoder.start", gil_released);
            const gdn::Token first = self.dec.start(seq, span, sampler.sampler);
            self.sampler_locks[seq] = &sampler.lock;
            return first;
          },
          "seq"_a, "prompt"_a, "sampler"_a, py::keep_alive<1, 4>(),
          "Prefills prompt on a fresh sequence and returns the first token (pending: the next advance feeds it).")
      .def(
          "advance",
          [](SpeculativeHandle& self, const std::vector<gdn::SeqId>& seqs) {
            std::vector<std::vector<gdn::Token>> out(seqs.size());
            std::vector<std::vector<gdn::Token>*> ptrs;
            for (auto& v : out) ptrs.push_back(&v);
            {
              py::gil_scoped_release nogil;
              const Use use(*self.lock, "SpeculativeDecoder.advance", gil_released);
              // The samplers of the round (a sequence that was not started is refused by advance()).
              std::vector<UseLock*> locks;
              for (const gdn::SeqId s : seqs)
                if (const auto it = self.sampler_locks.find(s); it != self.sampler_locks.end()) locks.push_back(it->second);
              std::sort(locks.begin(), locks.end());
              locks.erase(std::unique(locks.begin(), locks.end()), locks.end());
              std::deque<Use> sampling;  // Use cannot move; a deque builds each in place
              for (UseLock* l : locks) sampling.emplace_back(*l, "SpeculativeDecoder.advance", gil_released);
              self.dec.advance(seqs, ptrs);
            }
            return out;
          },
          "seqs"_a, "One round for every sequence: a list of 1..k+1 new tokens per sequence.")
      .def(
          "finish",
          [](SpeculativeHandle& self, gdn::SeqId seq) {
            const Use use(*self.lock, "SpeculativeDecoder.finish", gil_held);
            self.dec.finish(seq);
            self.sampler_locks.erase(seq);
          },
          "seq"_a)
      .def_property_readonly(
          "stats",
          [](SpeculativeHandle& self) {
            const Use use(*self.lock, "SpeculativeDecoder.stats", gil_held);
            return self.dec.stats();
          },
          "A copy of the statistics so far.");
}
