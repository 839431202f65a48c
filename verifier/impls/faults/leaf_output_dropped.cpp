// verifier/impls/faults/leaf_output_dropped.cpp: the reentrant skeleton differentiating only the
// recomputed outputs that have a grad_fn. A segment output that is one of its inputs, passed through
// untouched, is in the recompute the detached copy itself: a leaf with no grad_fn, so the gradient that
// reaches it is dropped (the input gets none from that path). A view of the input has a grad_fn and
// keeps its gradient, so segout=view shows nothing.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/reentrant.hpp"

namespace ckv::faults {
ImplEntry leaf_output_dropped() {
  ReentrantVariant v;
  v.outputs_with_grad_fn_only = true;
  return {{"leaf-output-dropped",
           "reentrant, differentiating only recomputed outputs with a grad_fn: an output that is an input gets no "
           "gradient",
           "grad-baseline", "segout=alias (a segment output that is one of its inputs)"},
          [v] { return std::make_unique<ReentrantCheckpoint>(v); }};
}
}  // namespace ckv::faults
