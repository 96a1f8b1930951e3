// The Python module `gdn`: a thin pybind11 binding of libgdn's C++ API. It adds no behaviour of its
// own: the C++ objects are exposed as they are, gdn::Error becomes a gdn.Error subclass per status
// (with .status and the library's message), and step() runs without the GIL.
//
// Outputs are numpy views, not copies: Context.logits() / hidden() return read-only float32 arrays
// over the context's own buffers, which keep the Context alive (the array's base). Like the C++
// spans they show the last step's results and are overwritten by the next step (which may also
// move the buffers, when it asks for more rows than any step before): copy (np.array(view)) what
// must outlive the next step.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gdn/gdn.hpp"
#include "gdn/diagnostics/doctor.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

// A Context with the model it was made from (the C++ Context holds it too, but only as a
// reference to the Model; Python wants the handle back).
struct ContextHandle {
  ContextHandle(std::shared_ptr<const gdn::Model> m, const gdn::ContextParams& p) : model(std::move(m)), ctx(model, p) {}
  std::shared_ptr<const gdn::Model> model;
  gdn::Context ctx;
};

struct ModelHandle {
  std::shared_ptr<const gdn::Model> model;
};

constexpr int n_status = static_cast<int>(gdn::Status::internal) + 1;
// Exception classes by status (index 0: the base gdn.Error). Leaked on purpose: they must outlive
// every translator call, and the interpreter owns the class objects anyway.
std::array<PyObject*, n_status>* exception_classes = nullptr;

const char* const exception_names[n_status] = {
    "Error",                    // ok: never raised; the base class
    "InvalidArgumentError",     "IoError",           "InvalidFileError",      "UnsupportedModelError",
    "MissingTensorError",       "TensorMismatchError", "OutOfCapacityError",  "InvalidSequenceError",
    "ContextOverflowError",     "InvalidTokenError", "BackendUnavailableError", "InternalError",
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
py::array rows_view(py::object self, std::optional<std::int64_t> row, std::int64_t width, RowFn get) {
  ContextHandle& pc = self.cast<ContextHandle&>();
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
      .value("internal", gdn::Status::internal);

  py::enum_<gdn::DType>(m, "DType")
      .value("f32", gdn::DType::f32)
      .value("f16", gdn::DType::f16)
      .value("bf16", gdn::DType::bf16);
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
          [](const std::string& path, bool load_mtp) {
            gdn::ModelParams p;
            p.load_mtp = load_mtp;
            py::gil_scoped_release nogil;
            return ModelHandle{gdn::Model::load(path, p)};
          },
          "path"_a, py::kw_only(), "load_mtp"_a = gdn::ModelParams{}.load_mtp,
          "Loads a Hugging Face checkpoint directory (config.json + safetensors), validated and memory-mapped.")
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
  py::class_<gdn::Batch>(m, "Batch",
                         "Which sequences advance by which tokens in one step, and which positions want logits.")
      .def(py::init<>())
      .def(
          "add",
          [](gdn::Batch& b, gdn::SeqId seq, gdn::Token token, gdn::LogitsFor logits, bool hidden_all) {
            return b.add(seq, std::span<const gdn::Token>(&token, 1), logits, hidden_all);
          },
          "seq"_a, "tokens"_a, "logits"_a = gdn::LogitsFor::last, "hidden_all"_a = false)
      .def(
          "add",
          [](gdn::Batch& b, gdn::SeqId seq, const Tokens& tokens, gdn::LogitsFor logits, bool hidden_all) {
            return b.add(seq, token_span(tokens), logits, hidden_all);
          },
          "seq"_a, "tokens"_a, "logits"_a = gdn::LogitsFor::last, "hidden_all"_a = false,
          "Appends tokens (an int or a sequence of ints) for seq; returns the entry's index.")
      .def("clear", &gdn::Batch::clear)
      .def_property_readonly("entries",
                             [](const gdn::Batch& b) { return std::vector<gdn::Batch::Entry>(b.entries().begin(), b.entries().end()); })
      .def_property_readonly("tokens", [](const gdn::Batch& b) {
        return py::array_t<gdn::Token>(static_cast<py::ssize_t>(b.tokens().size()), b.tokens().data());
      })
      .def_property_readonly("token_count", &gdn::Batch::token_count)
      .def_property_readonly("output_rows", &gdn::Batch::output_rows)
      .def(
          "output_row",
          [check_entry](const gdn::Batch& b, std::size_t e, std::int64_t i) {
            check_entry(b, e);
            return b.output_row(e, i);
          },
          "entry"_a, "i"_a, "The output row of entry's token i, or -1.")
      .def(
          "last_row",
          [check_entry](const gdn::Batch& b, std::size_t e) {
            check_entry(b, e);
            return b.last_row(e);
          },
          "entry"_a, "The output row of entry's last token, or -1.")
      .def("__len__", [](const gdn::Batch& b) { return b.entries().size(); });

  // --- context ------------------------------------------------------------------------------
  const gdn::ContextParams d;
  py::class_<ContextHandle>(m, "Context",
                        "The mutable state of up to max_sequences sequences of one model, allocated at creation. "
                        "Use a context from one thread at a time.")
      .def(py::init([](const ModelHandle& pm, int max_sequences, int max_context, int kv_page_size, std::int64_t kv_pages,
                       int max_batch_tokens, int max_logits_rows, std::optional<gdn::DType> state_dtype, int threads,
                       int gdn_chunk_min_tokens, int max_rollback_tokens, gdn::Backend backend) {
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
             return std::make_unique<ContextHandle>(pm.model, p);
           }),
           "model"_a, py::kw_only(), "max_sequences"_a = d.max_sequences, "max_context"_a = d.max_context,
           "kv_page_size"_a = d.kv_page_size, "kv_pages"_a = d.kv_pages, "max_batch_tokens"_a = d.max_batch_tokens,
           "max_logits_rows"_a = d.max_logits_rows, "state_dtype"_a = py::none(), "threads"_a = d.threads,
           "gdn_chunk_min_tokens"_a = d.gdn_chunk_min_tokens, "max_rollback_tokens"_a = d.max_rollback_tokens,
           "backend"_a = d.backend)
      .def_property_readonly("model", [](const ContextHandle& c) { return ModelHandle{c.model}; })
      // sequences
      .def("create_sequence", [](ContextHandle& c) { return c.ctx.create_sequence(); })
      .def("reset_sequence", [](ContextHandle& c, gdn::SeqId s) { c.ctx.reset_sequence(s); }, "seq"_a)
      .def("free_sequence", [](ContextHandle& c, gdn::SeqId s) { c.ctx.free_sequence(s); }, "seq"_a)
      .def("is_valid", [](const ContextHandle& c, gdn::SeqId s) { return c.ctx.is_valid(s); }, "seq"_a)
      .def("sequence_length", [](const ContextHandle& c, gdn::SeqId s) { return c.ctx.sequence_length(s); }, "seq"_a)
      .def("mtp_length", [](const ContextHandle& c, gdn::SeqId s) { return c.ctx.mtp_length(s); }, "seq"_a)
      .def_property_readonly("live_sequences", [](const ContextHandle& c) { return c.ctx.live_sequences(); })
      // state control
      .def("snapshot", [](ContextHandle& c, gdn::SeqId s) { return c.ctx.snapshot(s); }, "seq"_a)
      .def("free_snapshot", [](ContextHandle& c, gdn::SnapshotId s) { c.ctx.free_snapshot(s); }, "snapshot"_a)
      .def("restore", [](ContextHandle& c, gdn::SeqId s, gdn::SnapshotId snap) { c.ctx.restore(s, snap); }, "seq"_a,
           "snapshot"_a)
      .def("create_sequence_from", [](ContextHandle& c, gdn::SnapshotId snap) { return c.ctx.create_sequence_from(snap); },
           "snapshot"_a)
      .def("fork_sequence", [](ContextHandle& c, gdn::SeqId s) { return c.ctx.fork_sequence(s); }, "seq"_a)
      .def("rollback", [](ContextHandle& c, gdn::SeqId s, std::int64_t keep) { c.ctx.rollback(s, keep); }, "seq"_a,
           "keep"_a)
      .def("rollbackable_tokens", [](const ContextHandle& c, gdn::SeqId s) { return c.ctx.rollbackable_tokens(s); },
           "seq"_a)
      .def("truncate_mtp", [](ContextHandle& c, gdn::SeqId s, std::int64_t n) { c.ctx.truncate_mtp(s, n); }, "seq"_a,
           "mtp_length"_a)
      .def("save_sequence", [](const ContextHandle& c, gdn::SeqId s, const std::string& path) { c.ctx.save_sequence(s, path); },
           "seq"_a, "path"_a, py::call_guard<py::gil_scoped_release>())
      .def("load_sequence", [](ContextHandle& c, const std::string& path) { return c.ctx.load_sequence(path); }, "path"_a,
           py::call_guard<py::gil_scoped_release>())
      // steps
      .def("step", [](ContextHandle& c, const gdn::Batch& b) { c.ctx.step(b); }, "batch"_a,
           py::call_guard<py::gil_scoped_release>(),
           "Advances every sequence of the batch (the GIL is released meanwhile). Views of the previous outputs "
           "are overwritten.")
      .def(
          "step_mtp",
          [](ContextHandle& c, const gdn::Batch& b, const py::array_t<float, py::array::c_style | py::array::forcecast>& hidden) {
            std::span<const float> h(hidden.data(), static_cast<std::size_t>(hidden.size()));
            py::gil_scoped_release nogil;
            c.ctx.step_mtp(b, h);
          },
          "batch"_a, "hidden"_a,
          "Runs the MTP head; hidden holds one hidden_size row per batch token (the main model's hidden state of the "
          "position before it).")
      // outputs
      .def_property_readonly("output_rows", [](const ContextHandle& c) { return c.ctx.output_rows(); })
      .def(
          "logits",
          [](py::object self, std::optional<std::int64_t> row) {
            const auto V = self.cast<ContextHandle&>().model->config().vocab_size;
            return rows_view(self, row, V, [](const gdn::Context& c, std::int64_t r) { return c.logits(r); });
          },
          "row"_a = py::none(),
          "Logits of output row `row` ([vocab] float32), or of every row ([rows, vocab]): a read-only view of the "
          "context's buffer, overwritten by the next step.")
      .def(
          "hidden",
          [](py::object self, std::optional<std::int64_t> row) {
            const auto H = self.cast<ContextHandle&>().model->config().hidden_size;
            return rows_view(self, row, H, [](const gdn::Context& c, std::int64_t r) { return c.hidden(r); });
          },
          "row"_a = py::none(), "Final hidden state (after the last norm) of output row `row`, or of every row; a view.")
      // memory
      .def_property_readonly("gdn_state_bytes_per_sequence",
                             [](const ContextHandle& c) { return c.ctx.gdn_state_bytes_per_sequence(); })
      .def_property_readonly("kv_bytes_per_token", [](const ContextHandle& c) { return c.ctx.kv_bytes_per_token(); })
      .def_property_readonly("kv_free_pages", [](const ContextHandle& c) { return c.ctx.kv_free_pages(); })
      .def_property_readonly("snapshot_bytes", [](const ContextHandle& c) { return c.ctx.snapshot_bytes(); });

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
}
