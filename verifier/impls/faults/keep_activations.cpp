// verifier/impls/faults/keep_activations.cpp: keeps every recomputed activation alive until the step
// ends (a cache of the recompute's tensors "for a second backward", cleared only at end_step, as in
// checkpoint wrappers that stash the recomputed graph on the module). Gradients, RNG, autocast and
// side effects are all right; only the memory the checkpoint exists to save is never given back, so
// the step's peak is the no-checkpoint run's and memory stays up after backward.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/stash_impl.hpp"

namespace ckv::faults {
namespace {
struct KeepFrame : checkpoint_detail::RecomputeFrame {
  KeepFrame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions options, Stash stash)
      : RecomputeFrame(std::move(fn), std::move(args), options), stash_(std::move(stash)) {}
  void recompute() override {
    RecomputeFrame::recompute();
    stash_->insert(stash_->end(), collected_.begin(), collected_.end());
  }
  Stash stash_;
};
}  // namespace
ImplEntry keep_activations() {
  return {{"keep-activations", "keeps every recomputed activation alive until the step ends: saves no memory",
           "memory-saved", "a plan that checkpoints a segment whose recompute outweighs the boundaries kept"},
          [] { return std::make_unique<StashImpl<KeepFrame>>(); }};
}
}  // namespace ckv::faults
