// verifier/impls/faults/no_preserve_rng.cpp: the builtin with preserve_rng=false, the switch users flip
// "for speed": the recompute draws fresh dropout masks, so backward differentiates another function.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv::faults {
ImplEntry no_preserve_rng() {
  return {{"no-preserve-rng", "preserve_rng=false: the recompute draws fresh dropout masks", "rng-replay",
           "any dropout inside a checkpointed segment"},
          [] { return make_builtin(CheckpointOptions{false}); }};
}
}  // namespace ckv::faults
