// verifier/impls/faults/leaf_input_recompute.cpp: the reentrant skeleton handing fn the detached inputs
// themselves. A gradient penalty's second-order term through those inputs is lost (they are leaves of
// a graph built inside backward), which grad-baseline kills. It also lets autocast cache the cast of an
// fp32 leaf that requires grad, so wq, wk and wv share one bf16 cast of the block input and their input
// gradients are summed in bf16 instead of fp32: earlier layers' gradients move by a bf16 rounding, which
// grad-baseline accepts as a summation-order difference (torch.utils.checkpoint(use_reentrant=True) does
// the same) and audit-amp measures. ckverify found both in its own first checkpoint.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/reentrant.hpp"

namespace ckv::faults {
ImplEntry leaf_input_recompute() {
  ReentrantVariant v;
  v.leaf_inputs = true;
  return {{"leaf-input-recompute",
           "recomputes from detached leaf inputs: a gradient penalty loses its second-order term through them",
           "grad-baseline", "gp>0 with a checkpointed segment that is not the first"},
          [v] { return std::make_unique<ReentrantCheckpoint>(v); }};
}
}  // namespace ckv::faults
