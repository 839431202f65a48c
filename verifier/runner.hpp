// verifier/runner.hpp: runs a Case and records what happened (DESIGN.md: "Runners only record;
// properties only compare"). One run = the Case's model, parameters and data, `steps` SGD steps of
// forward + backward, with the block stack cut into the segments of the Case's plan and every
// checkpointed segment handed to the implementation under test.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reference/params.hpp"
#include "verifier/case.hpp"
#include "verifier/dropout_tap.hpp"
#include "verifier/plan.hpp"

namespace ckv {

using SegmentFn = std::function<torch::Tensor(const torch::Tensor&)>;

// The interface a checkpoint implementation presents to ckverify: run `fn` on `x` as one checkpointed
// segment whose parameters are `params`, returning fn(x) with a graph through which backward yields
// the gradients of x and of every parameter.
class CheckpointImpl {
 public:
  virtual ~CheckpointImpl() = default;
  virtual std::string name() const = 0;
  virtual torch::Tensor run(const SegmentFn& fn, const torch::Tensor& x, const std::vector<torch::Tensor>& params) = 0;
};

struct StepObservation {
  double loss = 0.0;
  ParamSet grads;                  // parameter gradients after backward
  std::vector<bool> grad_defined;  // per parameter (layout order): did it receive a gradient at all
  std::vector<double> dx;          // gradient of the loss w.r.t. the input x
  ParamSet params_after;           // after the optimizer step
  std::vector<int> segment_calls;  // per segment: how often its forward ran during this step
};

struct RunObservation {
  Case c;
  std::vector<Segment> segments;
  ParamSet initial_params;
  CaseData data;
  std::vector<StepObservation> steps;
  std::vector<MaskRecord> masks;
};

// Runs the case. With impl == nullptr, or plan none, no segment is checkpointed (the baseline).
// Throws std::runtime_error (with the implementation's message) if the run fails.
RunObservation run_case(const Case& c, CheckpointImpl* impl);

}  // namespace ckv
