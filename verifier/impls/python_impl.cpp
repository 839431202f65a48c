// verifier/impls/python_impl.cpp: Python checkpoint functions as implementations under test
// (`--impl py:MODULE:CALLABLE[:key=value,...]`), primary build only.
//
// How: ckverify embeds CPython (pybind11's embedding API, both shipped in the torch wheel) and imports the
// wheel's own torch, whose _C extension (libtorch_python) binds to the very libtorch.so ckverify already
// runs on (same file, same process). So the Python function and the Case share one autograd engine,
// one set of generators and one autocast state: what torch.utils.checkpoint captures with
// torch.get_rng_state() and torch.is_autocast_enabled() is what the Case set in C++. The alternative, a
// Python driver process calling ckverify through bindings, would have needed Python bindings for the
// whole run stage and a second way to run every Case; this keeps one run stage for every implementation.
//
// The spec's calling convention, option typing and up-front signature checks live in Python
// (python/ckverify/_bridge.py, documented there): the bridge hands each segment call to the runner it
// returns, as runner(fn, params, segment_index, step, micro, args, generators) (generators: the call's
// SegmentCall::generators as torch.Generator objects). fn is a Python callable over the same positional arguments
// (tensors as torch.Tensor, ints, floats, bools, None) that runs the Case's segment and returns a tensor (one output)
// or a tuple of tensors. The GIL is held only while Python runs: it is released around the segment itself and
// everywhere else, so autograd's threads can run Python hooks (torch's saved-tensor unpack hooks, the reentrant
// CheckpointFunction.backward) during the Case's backward. The embedded module _ckverify_native gives Python the
// recompute flag (SegmentScope). Python modules are found on the torch wheel's site-packages (fixed at build time),
// ckverify's own package (python/, or share/ckverify/python beside an installed ckverify) and PYTHONPATH.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/embed.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "verifier/case/case.hpp"
#include "verifier/checkpoint/segment_scope.hpp"
#include "verifier/impls/loader.hpp"
#include "verifier/impls/traced_error.hpp"

namespace py = pybind11;

namespace {
// One recompute scope opened from Python (ckverify.segment_scope): closed explicitly, in LIFO order.
class PyScope {
 public:
  PyScope(std::shared_ptr<ckv::SegmentState> state, bool recomputing) : state_(std::move(state)) {
    scope_.emplace(*state_, recomputing);
  }
  void close() { scope_.reset(); }

 private:
  std::shared_ptr<ckv::SegmentState> state_;
  std::optional<ckv::SegmentScope> scope_;
};
}  // namespace

PYBIND11_EMBEDDED_MODULE(_ckverify_native, m) {
  py::class_<ckv::SegmentState, std::shared_ptr<ckv::SegmentState>>(m, "SegmentState").def(py::init<>());
  py::class_<PyScope>(m, "Scope")
      .def(py::init<std::shared_ptr<ckv::SegmentState>, bool>())
      .def("close", &PyScope::close);
  m.def("is_recomputing", [] { return ckv::is_recomputing(); });
}

namespace ckv {
namespace {

// ckverify's Python package: beside an installed ckverify (share/ckverify/python), else the source tree's.
std::string python_package_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto installed = exe.parent_path().parent_path() / "share" / "ckverify" / "python";
    if (std::filesystem::exists(installed / "ckverify" / "__init__.py", ec)) return installed.string();
  }
  return CKV_PYTHON_PKG;
}

std::string py_traceback(PyObject* type, PyObject* value, PyObject* tb);

// One interpreter per process, started on first use and never finalized (torch does not support it);
// the GIL is released once it is up.
void ensure_interpreter() {
  static std::once_flag once;
  std::call_once(once, [] {
    py::initialize_interpreter(/*init_signal_handlers=*/false);
    {
      py::module_ sys = py::module_::import("sys");
      py::list path = sys.attr("path");
      path.insert(0, python_package_dir());
      path.insert(0, std::string(CKV_PYTHON_SITE));
      // torch warns once that NumPy is missing; ckverify passes no arrays, and the warning is noise.
      py::module_::import("warnings")
          .attr("filterwarnings")("ignore", py::arg("message") = "Failed to initialize NumPy");
      py::module_::import("torch");  // binds torch._C to this process's libtorch
    }
    // A Python exception thrown through LibTorch (torch's python_error, e.g. raised by a recompute in
    // backward) keeps its traceback: the run stage records it (traced_error.hpp).
    set_exception_tracer([](const std::exception& e) -> std::string {
      const auto* pe = dynamic_cast<const python_error*>(&e);
      if (!pe) return "";
      py::gil_scoped_acquire gil;
      if (pe->type) return py_traceback(pe->type, pe->value, pe->traceback);
      // Not persisted (a backward on this thread): the exception is still this thread's Python error,
      // which is taken here (the next call into the implementation would clear it anyway).
      PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
      PyErr_Fetch(&type, &value, &tb);
      PyErr_NormalizeException(&type, &value, &tb);
      if (tb && value) PyException_SetTraceback(value, tb);
      std::string trace = py_traceback(type, value, tb);
      Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
      return trace;
    });
    PyEval_SaveThread();
  });
}

std::string py_error(const py::error_already_set& e) {
  std::string s = e.what();
  const size_t nl = s.find('\n');
  return sanitize(nl == std::string::npos ? s : s.substr(0, nl), 300);
}

// The whole Python traceback of an exception, as Python prints it (the GIL held); empty if it cannot
// be formatted.
std::string py_traceback(PyObject* type, PyObject* value, PyObject* tb) {
  if (!type) return "";
  try {
    const py::object lines = py::module_::import("traceback")
                                 .attr("format_exception")(py::reinterpret_borrow<py::object>(type),
                                                           py::reinterpret_borrow<py::object>(value ? value : Py_None),
                                                           py::reinterpret_borrow<py::object>(tb ? tb : Py_None));
    std::string out;
    // Encoded with backslash escapes: a lone surrogate in a message must not lose the whole traceback.
    for (const auto& l : lines) out += std::string(py::bytes(l.attr("encode")("utf-8", "backslashreplace")));
    return out;
  } catch (const std::exception&) {
    PyErr_Clear();
    return "";
  }
}

std::string py_traceback(const py::error_already_set& e) {
  return py_traceback(e.type().ptr(), e.value().ptr(), e.trace().ptr());
}

py::object to_py(const c10::IValue& v) {
  if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isNone()) return py::none();
  throw std::runtime_error("a segment argument of a type the Python bridge does not pass: " + v.tagKind());
}

c10::IValue from_py(const py::handle& h) {
  if (THPVariable_Check(h.ptr())) return THPVariable_Unpack(h.ptr());
  if (h.is_none()) return c10::IValue();
  if (py::isinstance<py::bool_>(h)) return c10::IValue(h.cast<bool>());
  if (py::isinstance<py::int_>(h)) return c10::IValue(h.cast<int64_t>());
  if (py::isinstance<py::float_>(h)) return c10::IValue(h.cast<double>());
  throw std::invalid_argument(
      "the segment was called with an argument that is not a tensor, int, float, bool or None: " +
      std::string(py::str(h.get_type())));
}

// The Python callable that runs a segment function (called with the GIL held; releases it inside).
// The generators a call shows besides the defaults, as torch.Generator objects (the same generators).
py::list generators_of(const SegmentCall& call) {
  py::list out;
  for (const at::Generator& g : call.generators) out.append(py::reinterpret_steal<py::object>(THPGenerator_Wrap(g)));
  return out;
}

py::object segment_callable(const SegmentFunction& seg) {
  py::cpp_function segment([seg](py::args a, py::kwargs kw) -> py::object {
    if (kw.size() > 0) {
      std::string names;
      for (const auto& item : kw) names += (names.empty() ? "" : ", ") + std::string(py::str(item.first));
      throw py::type_error("the segment takes positional arguments only; it was called with keyword argument(s) " +
                           names + " (an --impl option the callable passed on to the segment?)");
    }
    std::vector<c10::IValue> args;
    for (const auto& h : a) args.push_back(from_py(h));
    std::vector<torch::Tensor> out;
    try {
      py::gil_scoped_release nogil;
      out = seg(args);
    } catch (python_error& e) {
      // A Python exception raised inside the segment (by a saved-tensor hook, e.g. torch's
      // _StopRecomputationError) goes back to Python as itself, not as a RuntimeError.
      e.restore();
      throw py::error_already_set();
    }
    if (out.size() == 1) return py::reinterpret_steal<py::object>(THPVariable_Wrap(out[0]));
    py::tuple t(out.size());
    for (size_t i = 0; i < out.size(); ++i) t[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(out[i]));
    return std::move(t);
  });
  return std::move(segment);
}

class PythonImpl : public CheckpointImpl {
 public:
  PythonImpl(const std::string& module, const std::string& callable,
             const std::map<std::string, std::string>& options) {
    ensure_interpreter();
    py::gil_scoped_acquire gil;
    py::dict opts;
    for (const auto& [k, v] : options) opts[py::str(k)] = py::str(v);
    try {
      py::module_ bridge = py::module_::import("ckverify._bridge");
      try {
        runner_ = new py::object(bridge.attr("load")(module, callable, opts));
        is_strategy_ = py::hasattr(*runner_, "is_strategy") && runner_->attr("is_strategy").cast<bool>();
      } catch (py::error_already_set& e) {
        if (e.matches(bridge.attr("SpecError")))
          throw std::invalid_argument(sanitize(std::string(py::str(e.value())), 400));
        throw;
      }
    } catch (const py::error_already_set& e) {
      throw std::runtime_error("ckverify's Python bridge failed to load the spec: " + py_error(e));
    }
  }
  ~PythonImpl() override {
    py::gil_scoped_acquire gil;
    delete runner_;
  }

  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    py::gil_scoped_acquire gil;
    // A backward that failed inside a Python hook leaves its exception set on this thread (torch's
    // Python engine restores it for a Python caller; here the caller is C++, which has seen it as a C++
    // exception already). Left set, it would surface as the error of this unrelated call.
    PyErr_Clear();
    const py::object segment = segment_callable(call.fn);
    py::tuple args(call.args.size());
    for (size_t i = 0; i < call.args.size(); ++i) args[i] = to_py(call.args[i]);
    py::list params;
    for (const auto& p : call.params) params.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(p)));
    py::object r;
    try {
      r = (*runner_)(segment, params, call.segment, call.step, call.micro, args, generators_of(call));
    } catch (const py::error_already_set& e) {
      throw TracedError("the Python checkpoint raised " + py_error(e), py_traceback(e));
    }
    std::vector<torch::Tensor> out;
    if (THPVariable_Check(r.ptr())) {
      out.push_back(THPVariable_Unpack(r.ptr()));
    } else if (py::isinstance<py::tuple>(r) || py::isinstance<py::list>(r)) {
      for (const auto& h : r) {
        if (!THPVariable_Check(h.ptr())) throw std::runtime_error("the Python checkpoint returned a non-tensor output");
        out.push_back(THPVariable_Unpack(h.ptr()));
      }
    } else {
      throw std::runtime_error("the Python checkpoint returned " + std::string(py::str(r.get_type())) +
                               ", not the segment's tensors");
    }
    return out;
  }

  bool is_strategy() const override { return is_strategy_; }

  torch::Tensor run_stack(const StackCall& call) override {
    py::gil_scoped_acquire gil;
    PyErr_Clear();
    py::list fns, params, generators;
    for (const SegmentCall& b : call.blocks) {
      fns.append(segment_callable(b.fn));
      generators.append(generators_of(b));
      py::list ps;
      for (const auto& p : b.params) ps.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(p)));
      params.append(ps);
    }
    py::object r;
    try {
      r = (*runner_)(fns, params, call.step, call.micro, py::reinterpret_steal<py::object>(THPVariable_Wrap(call.x)),
                     generators);
    } catch (const py::error_already_set& e) {
      throw TracedError("the Python strategy raised " + py_error(e), py_traceback(e));
    }
    if (!THPVariable_Check(r.ptr())) throw std::runtime_error("the Python strategy returned a non-tensor");
    return THPVariable_Unpack(r.ptr());
  }

 private:
  bool is_strategy_ = false;
  py::object* runner_ = nullptr;  // owned (ckverify._bridge's runner); released under the GIL
};

}  // namespace

bool python_bridge_available() {
  return true;
}

std::unique_ptr<CheckpointImpl> load_python(const std::string& spec) {
  const ImplSpec s = parse_spec(spec);
  const size_t colon = s.target.find(':');
  return std::make_unique<PythonImpl>(s.target.substr(0, colon), s.target.substr(colon + 1), s.options);
}

}  // namespace ckv
