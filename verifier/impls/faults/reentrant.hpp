// verifier/impls/faults/reentrant.hpp: a reentrant checkpoint, the other design (torch.utils.checkpoint
// with use_reentrant=True, and what most hand-written C++ checkpoints look like): one custom autograd
// Function whose forward runs fn under no_grad, and whose backward recomputes fn from detached copies of
// its inputs under the forward's RNG and autocast state and differentiates the recomputed graph with
// autograd::grad w.r.t. those copies and the declared parameters. Under create_graph (a gradient
// penalty) the input gradients come from a second recompute on the inputs themselves, so that their
// second-order term reaches the inputs' history; the parameters' still come from the detached one
// (with the history attached, the engine would follow it to a weight tied to an earlier segment, count
// that use twice and free graph the outer backward needs). It is correct on everything the builtin is
// except one thing, which makes it a fault of its own: a parameter's gradient hook runs twice, once
// inside the inner autograd::grad and once when the Function's output gradient reaches the parameter.
// The variants below each break one more thing.
#pragma once

#include "verifier/impls/interface.hpp"

namespace ckv::faults {

struct ReentrantVariant {
  // Disable autocast's cast cache during the no-grad forward. Without it, casts of parameters made under
  // no_grad are cached without a graph and reused by later (grad-enabled) uses of the same parameter in
  // the same autocast region, which then get no gradient.
  bool guard_cast_cache = true;
  bool differentiate_params = true;  // false: only the inputs get gradients
  // Hand fn the detached inputs themselves (leaves), under create_graph too, as older reentrant
  // checkpoints do: autocast caches the casts of fp32 leaves that require grad, so the consumers of an
  // input share one cast and their gradients are summed in the autocast dtype instead of fp32, and a
  // gradient penalty loses the inputs' second-order term.
  bool leaf_inputs = false;
  // Recompute under the forward's autocast state; false: under backward's (autocast off), as torch's
  // reentrant checkpoint did before it saved the autocast state for the recompute.
  bool replay_autocast = true;
  // Differentiate only the recomputed outputs that have a grad_fn, instead of every output that requires
  // grad: an output that is a detached input itself (a leaf, as a tensor the segment passes through
  // untouched is in the recompute) gets no gradient.
  bool outputs_with_grad_fn_only = false;
  // Differentiate the recompute in two passes, the inputs first (keeping the graph) and then the
  // parameters: the gradients are right, but every backward function of the recomputed graph runs twice,
  // a tensor-parallel region's backward all-reduce included.
  bool two_pass = false;
  // Differentiate the recompute as torch's reentrant checkpoint does: autograd::backward from the
  // recomputed outputs, accumulating into the detached inputs (whose gradients the Function returns) and
  // straight into every parameter the recompute reached (which get none from the Function). The gradients
  // are right in one process, but a parameter read by two checkpointed segments, or inside one and
  // outside, has its gradient accumulator run once per nested backward: a data-parallel reducer's hook
  // fires twice in one backward. The parameters are the Function's inputs only where no tensor input
  // requires grad (then, and under create_graph, the skeleton's path runs).
  bool nested_backward = false;
  // Add the parameters' gradients to their .grad by hand (from autograd::grad) instead of returning them
  // to the engine, the parameters no inputs of the Function where an input carries gradient: the
  // gradients are right in one process, but the parameters' accumulators never run, so neither do the
  // hooks on them: a data-parallel reducer never averages those gradients, and the replicas diverge.
  bool params_by_hand = false;
};

class ReentrantCheckpoint : public CheckpointImpl {
 public:
  explicit ReentrantCheckpoint(ReentrantVariant v = {}) : v_(v) {}
  std::vector<torch::Tensor> run(const SegmentCall& call) override;

 private:
  ReentrantVariant v_;
};

}  // namespace ckv::faults
