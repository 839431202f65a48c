// verifier/impls/faults/first_output_only.cpp: written for one tensor in and one out, it keeps the graph
// of the first output only and hands the others back detached: an auxiliary loss returned by the
// segment no longer trains anything.
#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {
namespace {
class FirstOutputOnlyImpl : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    std::vector<torch::Tensor> outs = builtin_->run(call);
    for (size_t i = 1; i < outs.size(); ++i) outs[i] = outs[i].detach();
    return outs;
  }

 private:
  std::unique_ptr<CheckpointImpl> builtin_ = make_builtin();
};
}  // namespace
ImplEntry first_output_only() {
  return {{"first-output-only", "keeps the graph of the first output only; the others come back detached",
           "grad-baseline", "segio=multi"},
          [] { return std::make_unique<FirstOutputOnlyImpl>(); }};
}
}  // namespace ckv::faults
