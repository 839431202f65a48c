// verifier/impls/loader.hpp: implementations named by a spec instead of a builtin name.
//   PATH[:key=value,...]            a C++ plugin (plugin.hpp), loaded with dlopen; PATH contains a '/'
//                                   or ends in .so
//   py:MODULE:CALLABLE[:key=value,...]  a Python checkpoint function (python_impl.hpp)
// Every load error is one line (std::invalid_argument; the CLI exits 2): a missing file, a file that is
// not a shared library, a missing entry point, a stamp from another interface version, LibTorch or C++
// ABI, options the plugin refuses.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "verifier/impls/interface.hpp"

namespace ckv {

enum class SpecKind { name, plugin, python };
SpecKind spec_kind(const std::string& spec);

struct ImplSpec {
  std::string target;  // the plugin's path, or "MODULE:CALLABLE"
  std::map<std::string, std::string> options;
};
// Splits "TARGET[:k=v,...]"; throws std::invalid_argument on a malformed option list.
ImplSpec parse_spec(const std::string& spec);
// The first comma at or after `from` that is outside a JSON value ([...], {...}, "..." with \ escapes),
// or text.size() when there is none; `closed` (when given) says whether every quote and bracket closed.
size_t top_level_comma(const std::string& text, size_t from, bool* closed = nullptr);

// Loads (once per process) and instantiates a plugin.
std::unique_ptr<CheckpointImpl> load_plugin(const std::string& spec);
// A Python implementation; throws std::invalid_argument when this build has no Python bridge.
std::unique_ptr<CheckpointImpl> load_python(const std::string& spec);
bool python_bridge_available();

}  // namespace ckv
