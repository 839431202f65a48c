// verifier/impls/faults/inputs_only_grad.cpp: the reentrant skeleton differentiating only w.r.t. the
// segment's inputs: every parameter inside a checkpointed segment gets no gradient.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/reentrant.hpp"

namespace ckv::faults {
ImplEntry inputs_only_grad() {
  ReentrantVariant v;
  v.differentiate_params = false;
  return {{"inputs-only-grad", "differentiates only w.r.t. the segment inputs: parameters get no gradient",
           "grad-baseline", "any trainable parameter in a checkpointed segment"},
          [v] { return std::make_unique<ReentrantCheckpoint>(v); }};
}
}  // namespace ckv::faults
