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
// A segment call becomes CALLABLE(segment, *args, **options): `segment` is a Python callable over the
// same positional arguments (tensors as torch.Tensor, ints, floats, bools, None) that runs the Case's
// segment and returns a tensor (one output) or a tuple of tensors; options are typed (true/false, ints,
// floats, none, else strings). CALLABLE returns what segment returned. The GIL is held only while Python
// runs: it is released around the segment itself and everywhere else, so autograd's threads can run
// Python hooks (torch's saved-tensor unpack hooks, the reentrant CheckpointFunction.backward) during
// the Case's backward. Python modules are found on the torch wheel's site-packages (fixed at build
// time) and on PYTHONPATH.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/embed.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

#include "verifier/case/case.hpp"
#include "verifier/impls/loader.hpp"

namespace py = pybind11;

namespace ckv {
namespace {

// One interpreter per process, started on first use and never finalized (torch does not support it);
// the GIL is released once it is up.
void ensure_interpreter() {
  static std::once_flag once;
  std::call_once(once, [] {
    py::initialize_interpreter(/*init_signal_handlers=*/false);
    {
      py::module_ sys = py::module_::import("sys");
      py::list path = sys.attr("path");
      path.insert(0, std::string(CKV_PYTHON_SITE));
      // torch warns once that NumPy is missing; ckverify passes no arrays, and the warning is noise.
      py::module_::import("warnings").attr("filterwarnings")("ignore", py::arg("message") = "Failed to initialize NumPy");
      py::module_::import("torch");  // binds torch._C to this process's libtorch
    }
    PyEval_SaveThread();
  });
}

std::string py_error(const py::error_already_set& e) {
  std::string s = e.what();
  const size_t nl = s.find('\n');
  return sanitize(nl == std::string::npos ? s : s.substr(0, nl), 300);
}

py::object typed(const std::string& v) {
  if (v == "true" || v == "True") return py::bool_(true);
  if (v == "false" || v == "False") return py::bool_(false);
  if (v == "none" || v == "None") return py::none();
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(v.c_str(), &end, 10);
  if (!v.empty() && *end == '\0' && errno == 0) return py::int_(i);
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (!v.empty() && *end == '\0' && errno == 0) return py::float_(d);
  return py::str(v);
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
  throw std::invalid_argument("the segment was called with an argument that is not a tensor, int, float, bool or None: " +
                              std::string(py::str(h.get_type())));
}

class PythonImpl : public CheckpointImpl {
 public:
  PythonImpl(const std::string& module, const std::string& callable, const std::map<std::string, std::string>& options) {
    ensure_interpreter();
    py::gil_scoped_acquire gil;
    py::object m;
    try {
      m = py::module_::import(module.c_str());
    } catch (const py::error_already_set& e) {
      throw std::invalid_argument("cannot import Python module " + sanitize(module, 100) + ": " + py_error(e));
    }
    py::object f = m;
    size_t pos = 0;  // CALLABLE may be dotted (Class.method)
    while (pos <= callable.size()) {
      const size_t dot = std::min(callable.find('.', pos), callable.size());
      const std::string part = callable.substr(pos, dot - pos);
      if (!py::hasattr(f, part.c_str()))
        throw std::invalid_argument("Python module " + sanitize(module, 100) + " has no " + sanitize(callable, 100));
      f = f.attr(part.c_str());
      pos = dot + 1;
    }
    if (!PyCallable_Check(f.ptr()))
      throw std::invalid_argument("Python " + sanitize(module + "." + callable, 200) + " is not callable");
    fn_ = new py::object(f);
    kwargs_ = new py::dict();
    for (const auto& [k, v] : options) (*kwargs_)[py::str(k)] = typed(v);
  }
  ~PythonImpl() override {
    py::gil_scoped_acquire gil;
    delete fn_;
    delete kwargs_;
  }

  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    py::gil_scoped_acquire gil;
    // A backward that failed inside a Python hook leaves its exception set on this thread (torch's
    // Python engine restores it for a Python caller; here the caller is C++, which has seen it as a C++
    // exception already). Left set, it would surface as the error of this unrelated call.
    PyErr_Clear();
    const SegmentFunction seg = call.fn;
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
    py::tuple args(call.args.size() + 1);
    args[0] = segment;
    for (size_t i = 0; i < call.args.size(); ++i) args[i + 1] = to_py(call.args[i]);
    py::object r;
    try {
      r = (*fn_)(*args, **(*kwargs_));
    } catch (const py::error_already_set& e) {
      throw std::runtime_error("the Python checkpoint raised " + py_error(e));
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

 private:
  py::object* fn_ = nullptr;  // owned; released under the GIL
  py::dict* kwargs_ = nullptr;
};

}  // namespace

bool python_bridge_available() { return true; }

std::unique_ptr<CheckpointImpl> load_python(const std::string& spec) {
  const ImplSpec s = parse_spec(spec);
  const size_t colon = s.target.find(':');
  return std::make_unique<PythonImpl>(s.target.substr(0, colon), s.target.substr(colon + 1), s.options);
}

}  // namespace ckv
