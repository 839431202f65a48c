// verifier/impls/faults/frozen_input_shortcut.cpp: "no input requires grad, so there is nothing to
// differentiate": runs fn without a graph. The frozen-embedding / LoRA bug of reentrant checkpoints:
// the segment's parameters silently get no gradient.
#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {
namespace {
class FrozenInputShortcutImpl : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    bool any = false;
    for (const auto& a : call.args) any |= a.isTensor() && a.toTensor().defined() && a.toTensor().requires_grad();
    if (any) return builtin_->run(call);
    torch::NoGradGuard no_grad;
    return call.fn(call.args);
  }

 private:
  std::unique_ptr<CheckpointImpl> builtin_ = make_builtin();
};
}  // namespace
ImplEntry frozen_input_shortcut() {
  return {{"frozen-input-shortcut", "runs fn without a graph when no tensor input requires grad", "grad-baseline",
           "input=frozen"},
          [] { return std::make_unique<FrozenInputShortcutImpl>(); }};
}
}  // namespace ckv::faults
