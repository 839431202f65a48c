// verifier/impls/faults/carry_input_grads.cpp: the builtin, plus a cache of the gradients that reach each
// checkpointed segment's input ("for gradient inspection", or a pipeline stage's send buffer), rotated
// at end_step instead of cleared: each step's gradients stay alive through the next step. Gradients,
// RNG and effects are right, and what a step holds after its own backward fits the per-call allowance;
// only the next step begins with the previous one's gradients still held, so every later peak rises.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
using Cache = std::shared_ptr<std::vector<torch::Tensor>>;

class CarryInputGrads : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    for (const auto& a : call.args)
      if (a.isTensor() && a.toTensor().defined() && a.toTensor().requires_grad()) {
        torch::Tensor t = a.toTensor();
        t.register_hook([cache = current_](const torch::Tensor& g) { cache->push_back(g); });
      }
    return checkpoint_detail::checkpoint_with<checkpoint_detail::RecomputeFrame>(call.fn, call.args, full_recompute());
  }
  void end_step(int) override {
    previous_ = current_;  // the step before last's gradients go; this step's stay until the next ends
    current_ = std::make_shared<std::vector<torch::Tensor>>();
  }

 private:
  Cache current_ = std::make_shared<std::vector<torch::Tensor>>(), previous_;
};
}  // namespace
ImplEntry carry_input_grads() {
  return {{"carry-input-grads", "keeps each step's segment-input gradients alive through the next step", "memory-saved",
           "steps>=3, checkpointed segments whose input gradients outweigh a few KiB"},
          [] { return std::make_unique<CarryInputGrads>(); }};
}
}  // namespace ckv::faults
