// verifier/impls/faults/trains_frozen.cpp: turns on requires_grad for every parameter it is given (the
// usual "fix" for "One of the differentiated Tensors does not require grad"): frozen parameters start
// receiving gradients and the optimizer moves them.
#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {
namespace {
class TrainsFrozenImpl : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    for (const auto& p : call.params) const_cast<torch::Tensor&>(p).requires_grad_(true);
    return builtin_->run(call);
  }

 private:
  std::unique_ptr<CheckpointImpl> builtin_ = make_builtin();
};
}  // namespace
ImplEntry trains_frozen() {
  return {{"trains-frozen", "sets requires_grad on every declared parameter, frozen ones included", "grad-baseline",
           "freeze=alt or blocks"},
          [] { return std::make_unique<TrainsFrozenImpl>(); }};
}
}  // namespace ckv::faults
