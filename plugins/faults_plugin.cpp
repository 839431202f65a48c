// plugins/faults_plugin.cpp: the fault catalogue as one plugin. `--impl libckverify_faults.so:fault=NAME`
// gives the fault NAME, compiled into this library from the same sources as the built-in table; what it
// borrows from ckverify (the builtin checkpoint some faults wrap, SegmentScope) comes from the loading
// executable, as for any plugin.
#include <stdexcept>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/plugin.hpp"

namespace {
ckv::CheckpointImpl* make(const ckv::PluginOptions& o) {
  const auto it = o.find("fault");
  if (it == o.end() || o.size() != 1) throw std::invalid_argument("expected exactly one option, fault=NAME");
  for (const auto& e : ckv::faults::catalogue())
    if (e.info.name == it->second) return e.make().release();
  throw std::invalid_argument("no fault named " + it->second);
}
}  // namespace

CKVERIFY_PLUGIN(make)
