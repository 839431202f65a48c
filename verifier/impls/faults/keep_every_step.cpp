// verifier/impls/faults/keep_every_step.cpp: the builtin, plus a list of every call's outputs kept "for
// inspection" and never cleared. Gradients, RNG and effects are right, and what each step keeps after
// its backward fits the per-call allowance; only every step leaves its outputs behind for good, so the
// memory the run holds grows with every step of training.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
class KeepEveryStep : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    std::vector<torch::Tensor> out =
        checkpoint_detail::checkpoint_with<checkpoint_detail::RecomputeFrame>(call.fn, call.args, full_recompute());
    for (const torch::Tensor& t : out)
      if (t.defined()) kept_.push_back(t.detach());
    return out;
  }

 private:
  std::vector<torch::Tensor> kept_;
};
}  // namespace
ImplEntry keep_every_step() {
  return {{"keep-every-step", "keeps every call's outputs for good: the memory held grows with every step",
           "memory-saved", "steps>=3, segment outputs that outweigh a few KiB per step"},
          [] { return std::make_unique<KeepEveryStep>(); }};
}
}  // namespace ckv::faults
