// verifier/impls/loader.cpp: see loader.hpp.
#include "verifier/impls/loader.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cctype>
#include <mutex>
#include <stdexcept>

#include "verifier/case/case.hpp"
#include "verifier/impls/plugin.hpp"

namespace ckv {

SpecKind spec_kind(const std::string& spec) {
  if (spec.rfind("py:", 0) == 0) return SpecKind::python;
  const std::string path = spec.substr(0, spec.find(':'));
  if (path.find('/') != std::string::npos || (path.size() > 3 && path.compare(path.size() - 3, 3, ".so") == 0))
    return SpecKind::plugin;
  return SpecKind::name;
}

size_t top_level_comma(const std::string& text, size_t from, bool* closed) {
  int depth = 0;
  bool quoted = false;
  for (size_t i = from; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch == '\\')
        ++i;
      else if (ch == '"')
        quoted = false;
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == '[' || ch == '{') {
      ++depth;
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    } else if (ch == ',' && depth == 0) {
      if (closed) *closed = true;
      return i;
    }
  }
  if (closed) *closed = !quoted && depth == 0;
  return text.size();
}

namespace {
// Where a value holds ":key=" outside quotes and brackets (`every=2:bogus=1`, options written as the spec's
// first fields are), the "key=" it holds; "" where it holds none.
std::string colon_option(const std::string& value, bool json_values) {
  bool quoted = false;
  int depth = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    const char ch = value[i];
    if (json_values && quoted) {
      if (ch == '\\')
        ++i;
      else if (ch == '"')
        quoted = false;
      continue;
    }
    if (json_values && ch == '"') quoted = true;
    if (json_values && (ch == '[' || ch == '{')) ++depth;
    if (json_values && (ch == ']' || ch == '}')) --depth;
    if (ch != ':' || depth > 0) continue;
    size_t j = i + 1;
    while (j < value.size() &&
           (std::isalnum(static_cast<unsigned char>(value[j])) || value[j] == '_' || (j == i + 1 && value[j] == '@')))
      ++j;
    const bool key = j > i + 1 && !std::isdigit(static_cast<unsigned char>(value[i + 1]));
    if (key && j < value.size() && value[j] == '=') return value.substr(i + 1, j - i);
  }
  return "";
}
}  // namespace

ImplSpec parse_spec(const std::string& spec) {
  ImplSpec s;
  std::string rest;
  if (spec_kind(spec) == SpecKind::python) {
    const std::string body = spec.substr(3);
    const size_t a = body.find(':');
    if (a == std::string::npos || a == 0 || a + 1 >= body.size())
      throw std::invalid_argument("--impl " + sanitize(spec, 200) + ": expected py:MODULE:CALLABLE[:key=value,...]");
    const size_t b = body.find(':', a + 1);
    s.target = body.substr(0, b);
    if (b != std::string::npos) rest = body.substr(b + 1);
  } else {
    const size_t a = spec.find(':');
    s.target = spec.substr(0, a);
    if (a != std::string::npos) rest = spec.substr(a + 1);
  }
  // The comma that ends an option, skipping those inside a JSON value ([...], {...}, "...").
  const bool json_values = spec_kind(spec) == SpecKind::python;  // a plugin's values are plain strings
  auto next_comma = [&](size_t from) {
    if (!json_values) return std::min(rest.find(',', from), rest.size());
    bool closed = true;
    const size_t comma = top_level_comma(rest, from, &closed);
    if (!closed)
      throw std::invalid_argument("--impl " + sanitize(spec, 200) +
                                  ": an option value has an unclosed quote or bracket");
    return comma;
  };
  size_t pos = 0;
  while (!rest.empty() && pos <= rest.size()) {
    const size_t comma = next_comma(pos);
    const std::string item = rest.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument("--impl " + sanitize(spec, 200) + ": option \"" + sanitize(item, 60) +
                                  "\" is not key=value");
    if (const std::string second = colon_option(item.substr(eq + 1), json_values); !second.empty())
      throw std::invalid_argument("--impl " + sanitize(spec, 200) + ": option " + sanitize(item.substr(0, eq), 60) +
                                  "'s value \"" + sanitize(item.substr(eq + 1), 60) + "\" holds another option (" +
                                  sanitize(second, 60) + "...): options are separated by commas (a=1,b=2)");
    if (!s.options.emplace(item.substr(0, eq), item.substr(eq + 1)).second)
      throw std::invalid_argument("--impl " + sanitize(spec, 200) + ": option " + sanitize(item.substr(0, eq), 60) +
                                  " is given twice");
    pos = comma + 1;
  }
  return s;
}

namespace {
using Create = CheckpointImpl* (*)(const PluginOptions&);
using Stamp = const ckverify_plugin_stamp* (*)();

// Plugins stay loaded for the life of the process: their code may still be referenced by a graph.
Create open_plugin(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, Create> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;
  const std::string shown = "plugin " + sanitize(path, 200);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::invalid_argument(shown + ": no such file");
  if (!S_ISREG(st.st_mode)) throw std::invalid_argument(shown + ": not a regular file");
  // A bare file name would make dlopen search the library path; the spec means this file.
  const std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
  void* h = ::dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* err = ::dlerror();
    throw std::invalid_argument(shown + ": cannot load it as a shared library: " + sanitize(err ? err : "?", 200));
  }
  auto stamp_fn = reinterpret_cast<Stamp>(::dlsym(h, "ckverify_plugin_stamp_v1"));
  auto create = reinterpret_cast<Create>(::dlsym(h, "ckverify_plugin_create"));
  if (!stamp_fn || !create)
    throw std::invalid_argument(shown + ": not a ckverify plugin (no " +
                                (stamp_fn ? "ckverify_plugin_create" : "ckverify_plugin_stamp_v1") +
                                " symbol; define it with CKVERIFY_PLUGIN from <ckverify/plugin.hpp>)");
  const ckverify_plugin_stamp* s = stamp_fn();
  if (s->interface_version != kImplInterfaceVersion)
    throw std::invalid_argument(shown + ": built for implementation interface version " +
                                std::to_string(s->interface_version) + ", this ckverify has version " +
                                std::to_string(kImplInterfaceVersion) + "; rebuild it against this ckverify");
  if (s->torch_major != TORCH_VERSION_MAJOR || s->torch_minor != TORCH_VERSION_MINOR)
    throw std::invalid_argument(shown + ": built against LibTorch " + std::to_string(s->torch_major) + "." +
                                std::to_string(s->torch_minor) + ", this ckverify uses " + TORCH_VERSION +
                                "; rebuild it against the same LibTorch");
  if (s->cxx11_abi != _GLIBCXX_USE_CXX11_ABI)
    throw std::invalid_argument(shown + ": built with _GLIBCXX_USE_CXX11_ABI=" + std::to_string(s->cxx11_abi) +
                                ", this ckverify with " + std::to_string(_GLIBCXX_USE_CXX11_ABI) +
                                "; rebuild it with the same C++ ABI as LibTorch");
  loaded.emplace(path, create);
  return create;
}
}  // namespace

std::unique_ptr<CheckpointImpl> load_plugin(const std::string& spec) {
  const ImplSpec s = parse_spec(spec);
  const Create create = open_plugin(s.target);
  CheckpointImpl* impl = nullptr;
  try {
    impl = create(s.options);
  } catch (const std::exception& e) {
    throw std::invalid_argument("plugin " + sanitize(s.target, 200) +
                                ": its factory threw (it refused its options, or its implementation's constructor "
                                "failed): " +
                                sanitize(e.what(), 200));
  }
  if (!impl)
    throw std::invalid_argument("plugin " + sanitize(s.target, 200) + ": its factory returned no implementation");
  return std::unique_ptr<CheckpointImpl>(impl);
}

}  // namespace ckv
