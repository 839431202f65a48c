// verifier/impls/faults/no_preserve_rng.cpp: the builtin with preserve_rng=false, the switch users flip
// "for speed": the recompute draws fresh dropout masks, so backward differentiates another function.
// It recomputes the whole segment (frame_impl.hpp), so a noise term after the last saving op is redrawn too.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv::faults {
ImplEntry no_preserve_rng() {
  return {{"no-preserve-rng", "preserve_rng=false: the recompute draws fresh dropout masks", "rng-replay",
           "any dropout inside a checkpointed segment"},
          [] {
            CheckpointOptions o = full_recompute();
            o.preserve_rng = false;
            return make_builtin(o);
          }};
}
}  // namespace ckv::faults
