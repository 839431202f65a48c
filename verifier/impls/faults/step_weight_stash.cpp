// verifier/impls/faults/step_weight_stash.cpp: weight stashing keyed by step instead of by call. So that
// a recompute reads the parameter values its forward read (PipeDream's weight stashing, a defence against
// optimizers that update in place between forward and backward), each segment's parameters are copied at
// its first forward of a step and every recompute of that step runs on the copy. Within a step of plain
// gradient accumulation nothing changes the parameters and the copy is harmless; parameters edited in
// place between micro-batches (an EMA, a weight constraint, a pipeline's update) are recomputed from
// their old values for every later micro-batch, whose forward read the new ones.
#include <map>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
class StepWeightStashImpl : public CheckpointImpl {
  struct Frame : checkpoint_detail::RecomputeFrame {
    Frame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions o, std::vector<torch::Tensor> params,
          std::vector<torch::Tensor> stash)
        : RecomputeFrame(std::move(fn), std::move(args), o), params_(std::move(params)), stash_(std::move(stash)) {}
    // The recompute runs with each parameter's data swapped for the step's copy (set_data keeps the
    // parameter's identity and version counter, so no in-place check sees it), and swapped back after.
    void recompute() override {
      std::vector<torch::Tensor> current;
      current.reserve(params_.size());
      struct SwapBack {
        std::vector<torch::Tensor>& params;
        std::vector<torch::Tensor>& current;
        ~SwapBack() {
          for (size_t i = 0; i < current.size(); ++i) params[i].set_data(current[i]);
        }
      } swap_back{params_, current};
      for (size_t i = 0; i < params_.size(); ++i) {
        current.push_back(params_[i].data());
        params_[i].set_data(stash_[i]);
      }
      RecomputeFrame::recompute();
    }
    std::vector<torch::Tensor> params_, stash_;
  };

 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    if (!torch::GradMode::is_enabled()) return call.fn(call.args);
    auto it = stash_.find(call.segment);
    if (it == stash_.end()) {
      std::vector<torch::Tensor> copy;
      for (const torch::Tensor& p : call.params) copy.push_back(p.detach().clone());
      it = stash_.emplace(call.segment, std::move(copy)).first;
    }
    auto frame = std::make_shared<Frame>(call.fn, call.args, full_recompute(), call.params, it->second);
    return frame->run_forward();
  }
  void begin_step(int) override { stash_.clear(); }
  void end_step(int) override { stash_.clear(); }

 private:
  std::map<int, std::vector<torch::Tensor>> stash_;  // segment -> its parameters at its first forward of the step
};
}  // namespace
ImplEntry step_weight_stash() {
  return {{"step-weight-stash",
           "recomputes every micro-batch of a step from the parameters as the step's first forward read them",
           "refuses-inplace", "inplace=true inplace_on=param (micro >= 2)"},
          [] { return std::make_unique<StepWeightStashImpl>(); }};
}
}  // namespace ckv::faults
