// verifier/impls.hpp: the implementations ckverify can check, by name. "builtin" is ckverify's own
// checkpoint (checkpoint.hpp); every other name is a fault: a deliberately broken variant that some
// property must kill (DESIGN.md, "Faults"). `ckverify check --impl NAME` and the fault tests use this.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "verifier/runner.hpp"

namespace ckv {

struct ImplInfo {
  std::string name;
  std::string what;         // one line: what it does (wrong)
  std::string killed_by;    // the property expected to kill it ("" for builtin)
  bool needs_cuda = false;  // only observable with a CUDA device
  std::string demo;         // Case line keys under which it is observable ("prec=bf16"), "" if any
};

const std::vector<ImplInfo>& known_impls();
// Throws std::invalid_argument with a one-line message listing the known names.
std::unique_ptr<CheckpointImpl> make_impl(const std::string& name);

}  // namespace ckv
