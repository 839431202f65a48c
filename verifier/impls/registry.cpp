// verifier/impls/registry.cpp: see registry.hpp.
#include "verifier/impls/registry.hpp"

#include <torch/version.h>

#include <stdexcept>

#include "verifier/case/case.hpp"
#include "verifier/checkpoint/compat.hpp"
#include "verifier/impls/faults/faults.hpp"

namespace ckv {

const std::vector<ImplEntry>& known_impls() {
  static const std::vector<ImplEntry> v = {
      {{"builtin", "ckverify's own checkpoint (verifier/checkpoint/checkpoint.hpp)", "", ""},
       [] { return make_builtin(); }},
      faults::no_preserve_rng(),
      faults::cpu_rng_only(),
      faults::per_segment_state(),
      faults::replays_effects(),
      faults::rng_left_advanced(),
      faults::keep_activations(),
      faults::no_autocast_replay(),
      faults::default_dtype_replay(),
      faults::recompute_twice(),
      faults::single_recompute(),
      faults::no_version_check(),
      faults::no_restore_on_throw(),
      faults::inputs_only_grad(),
      faults::frozen_input_shortcut(),
      faults::trains_frozen(),
      faults::first_output_only(),
      faults::resume_no_rng(),
      faults::resume_rng_before(),
      faults::resume_no_optimizer(),
      faults::resume_no_running_stats(),
      faults::resume_no_accumulation(),
      faults::reentrant_hooks(),
      faults::nograd_forward_cache(),
      faults::leaf_input_recompute(),
  };
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

std::unique_ptr<CheckpointImpl> make_impl(const std::string& name) {
  std::string names;
  for (const auto& e : known_impls()) {
    if (e.info.name == name) return e.make();
    names += (names.empty() ? "" : "|") + e.info.name;
  }
  throw std::invalid_argument("unknown implementation \"" + sanitize(name) + "\" (known: " + names + ")");
}

}  // namespace ckv
