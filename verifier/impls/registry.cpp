// verifier/impls/registry.cpp: see registry.hpp.
#include "verifier/impls/registry.hpp"

#include <torch/version.h>

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "verifier/case/case.hpp"
#include "verifier/case/environment_error.hpp"
#include "verifier/checkpoint/compat.hpp"
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/loader.hpp"
#include "verifier/impls/traced_error.hpp"

namespace ckv {

namespace {
std::function<std::string(const std::exception&)>& tracer() {
  static std::function<std::string(const std::exception&)> f;
  return f;
}
}  // namespace

void set_exception_tracer(std::function<std::string(const std::exception&)> t) {
  tracer() = std::move(t);
}

std::string exception_trace(const std::exception& e) {
  std::string t;
  if (const auto* traced = dynamic_cast<const TracedError*>(&e))
    t = traced->trace;
  else if (tracer())
    t = tracer()(e);
  // Printable lines only, the end kept (where the exception was raised).
  std::string out;
  for (unsigned char ch : t) out += ch == '\n' || (ch >= 0x20 && ch < 0x7f) ? static_cast<char>(ch) : '?';
  while (!out.empty() && out.back() == '\n') out.pop_back();
  constexpr size_t kMax = 8000;
  if (out.size() > kMax) out = "...\n" + out.substr(out.size() - kMax);
  return out;
}

const std::vector<ImplEntry>& known_impls() {
  static const std::vector<ImplEntry> v = [] {
    std::vector<ImplEntry> all = {
        {{"builtin", "ckverify's own checkpoint (verifier/checkpoint/checkpoint.hpp)", "", ""},
         [] { return make_builtin(); }}};
    for (const auto& f : faults::catalogue()) all.push_back(f);
    return all;
  }();
  return v;
}

std::string unobservable_here(const ImplInfo& info, const std::string& device) {
  if (info.needs_cuda && device == "cpu")
    return "fault " + info.name + " only shows with a CUDA device (--device cuda)";
  if (info.needs_fp16 && device == "cpu" && !compat::kCpuFp16Autocast)
    return "fault " + info.name +
           " only shows under fp16 autocast, which on CPU needs LibTorch >= 2.3 (this build has " + TORCH_VERSION + ")";
  if (info.needs_torch2 && TORCH_VERSION_MAJOR < 2)
    return "fault " + info.name + " only shows with LibTorch >= 2.0 (this build has " + TORCH_VERSION + ")";
  return "";
}

const ImplInfo* find_impl(const std::string& name) {
  for (const auto& e : known_impls())
    if (e.info.name == name) return &e.info;
  return nullptr;
}

ImplInfo impl_info(const std::string& spec) {
  if (const ImplInfo* i = find_impl(spec)) return *i;
  ImplInfo i;
  i.name = spec;
  i.what = spec_kind(spec) == SpecKind::python ? "a Python checkpoint function" : "a C++ plugin";
  return i;
}

void check_impl_spec(const std::string& spec) {
  try {  // the Case's own limits on the field (the spec travels in every Case and repro file)
    case_from_json(nlohmann::json{{"impl", spec}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } catch (const CaseError& e) {
    throw std::invalid_argument(e.what());
  }
  switch (spec_kind(spec)) {
    case SpecKind::name:
      if (!find_impl(spec)) make_impl(spec);  // throws, listing the known names
      return;
    case SpecKind::plugin: {
      const std::string path = parse_spec(spec).target;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0)
        throw std::invalid_argument("plugin " + sanitize(path, 200) + ": no such file");
      if (!S_ISREG(st.st_mode)) throw std::invalid_argument("plugin " + sanitize(path, 200) + ": not a regular file");
      return;
    }
    case SpecKind::python:
      parse_spec(spec);
      if (!python_bridge_available())
        throw EnvironmentError(
            "--impl " + sanitize(spec, 200) +
            ": this build has no Python bridge (only the primary build, on the torch wheel, has one)");
      return;
  }
}

namespace {
ForeignLoadObserver foreign_load_observer = nullptr;
}  // namespace

void set_foreign_load_observer(ForeignLoadObserver observer) {
  foreign_load_observer = observer;
}

std::unique_ptr<CheckpointImpl> make_impl(const std::string& name) {
  if (spec_kind(name) != SpecKind::name && foreign_load_observer) foreign_load_observer(name);
  if (spec_kind(name) == SpecKind::plugin) return load_plugin(name);
  if (spec_kind(name) == SpecKind::python) return load_python(name);
  std::string names;
  for (const auto& e : known_impls()) {
    if (e.info.name == name) return e.make();
    if (!e.info.killed_by.empty() && names.size() > 60) continue;
    names += (names.empty() ? "" : "|") + e.info.name;
  }
  throw std::invalid_argument(
      "unknown implementation \"" + sanitize(name) + "\" (known: " + names +
      "|...; see `ckverify list`; or a plugin PATH.so[:k=v,...], or py:MODULE:CALLABLE[:k=v,...])");
}

}  // namespace ckv
