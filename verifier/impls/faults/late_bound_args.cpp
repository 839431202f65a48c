// verifier/impls/faults/late_bound_args.cpp: a wrapper that hands the checkpoint a function reading its
// non-tensor arguments from state shared by every call (a closure over a variable the next call
// overwrites, as a Python lambda made in a loop binds the loop variable late). The forward gets its own
// arguments; the recompute, run in backward after the later segments' forwards, gets the last forward's:
// it recomputes another layer range, and the gradients are another function's.
#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {
namespace {
class LateBoundArgsImpl : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    *latest_ = call.args;
    SegmentCall late = call;
    late.fn = [fn = call.fn, latest = latest_](const std::vector<c10::IValue>& args) {
      std::vector<c10::IValue> a = args;
      for (size_t i = 0; i < a.size() && i < latest->size(); ++i)
        if (!a[i].isTensor()) a[i] = (*latest)[i];
      return fn(a);
    };
    return builtin_->run(late);
  }

 private:
  std::unique_ptr<CheckpointImpl> builtin_ = make_builtin();
  std::shared_ptr<std::vector<c10::IValue>> latest_ = std::make_shared<std::vector<c10::IValue>>();
};
}  // namespace
ImplEntry late_bound_args() {
  return {{"late-bound-args",
           "recomputes with the non-tensor arguments of the latest forward call, not its own (a late-bound closure)",
           "recompute-count", "segio=multi with two or more checkpointed segments"},
          [] { return std::make_unique<LateBoundArgsImpl>(); }};
}
}  // namespace ckv::faults
