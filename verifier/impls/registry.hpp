// verifier/impls/registry.hpp: the implementations ckverify can check, by name. "builtin" is ckverify's
// own checkpoint (verifier/checkpoint/); every other name is a fault: a deliberately broken variant,
// each in its own file under faults/, that some property must kill (DESIGN.md, "Faults").
// `ckverify check --impl NAME`, `ckverify faults`, `ckverify list` and the tests use this table.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "verifier/impls/interface.hpp"
#include "verifier/impls/parallel_fault.hpp"
#include "verifier/impls/state_fault.hpp"

namespace ckv {

struct ImplInfo {
  std::string name;
  std::string what;           // one line: what it does (wrong)
  std::string killed_by;      // the property that must kill it ("" for builtin)
  std::string exposed_by;     // the Case condition under which it misbehaves, in words
  bool needs_cuda = false;    // only observable with a CUDA device
  bool needs_torch2 = false;  // only observable with LibTorch >= 2.0
  bool needs_fp16 = false;    // only observable under fp16 autocast (on CPU: LibTorch >= 2.3)
  // A resume fault: the checkpoint is the builtin, the training state saver is broken this way.
  StateFault state_fault = StateFault::none;
  // A tensor-parallel framework fault: the checkpoint is the builtin, the sharded model is built this way.
  ParallelFault parallel_fault = ParallelFault::none;
  // Case fields (line form) every Case that shows it needs, which `ckverify faults` fixes (--only): "tp=2".
  std::string case_fields = "";
};

// Why the implementation's fault cannot show on `device` with this build ("" when it can).
std::string unobservable_here(const ImplInfo& info, const std::string& device);

struct ImplEntry {
  ImplInfo info;
  std::function<std::unique_ptr<CheckpointImpl>()> make;
};

const std::vector<ImplEntry>& known_impls();
const ImplInfo* find_impl(const std::string& name);
// The entry of a builtin name; for a plugin or Python spec (loader.hpp) a plain entry (no fault).
ImplInfo impl_info(const std::string& spec);
// Cheap checks of --impl before any work (a known name; a plugin file that exists; a Python spec that
// parses, on a build with the bridge); the real load happens in the workers. Throws std::invalid_argument.
void check_impl_spec(const std::string& spec);
// A builtin name, a plugin spec or a Python spec (loader.hpp). Throws std::invalid_argument with one line.
std::unique_ptr<CheckpointImpl> make_impl(const std::string& name);
// Called with the spec before make_impl loads code from outside ckverify (a plugin, a Python module),
// so a supervisor can blame what happens next on it (cli/supervise.hpp). Null: nobody is told.
using ForeignLoadObserver = void (*)(const std::string& spec);
void set_foreign_load_observer(ForeignLoadObserver observer);

// ckverify's builtin checkpoint behind the interface.
std::unique_ptr<CheckpointImpl> make_builtin(CheckpointOptions options = {});

}  // namespace ckv
