// verifier/impls/faults/leaf_input_recompute.cpp: the reentrant skeleton handing fn the detached inputs
// themselves. Autocast caches the cast of an fp32 leaf that requires grad, so wq, wk and wv share one
// bf16 cast of the block input and their input gradients are summed in bf16 instead of fp32: earlier
// layers' gradients move by an ulp. ckverify found this in its own first checkpoint.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/reentrant.hpp"

namespace ckv::faults {
ImplEntry leaf_input_recompute() {
  ReentrantVariant v;
  v.leaf_inputs = true;
  return {{"leaf-input-recompute",
           "recomputes from detached leaf inputs, so autocast caches their casts (the bf16-ulp bug)", "grad-baseline",
           "prec=bf16 with pos=post and a checkpointed segment that is not the first; gp>0"},
          [v] { return std::make_unique<ReentrantCheckpoint>(v); }};
}
}  // namespace ckv::faults
