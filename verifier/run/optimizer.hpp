// verifier/run/optimizer.hpp: the Case's optimizer over a run's parameters (Case::opt): plain SGD, or
// Adam (Kingma & Ba), bias-corrected, with per-parameter step counts as torch.optim.Adam keeps them.
// Adam's moments and step counts are training state: a StepRecord carries them (the baseline follows the
// run under test) and the state file saves them (state.hpp).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "reference/params.hpp"
#include "verifier/case/case.hpp"

namespace ckv::run_detail {

class OptimizerState {
 public:
  OptimizerState(const Case& c, const std::vector<torch::Tensor>& params);
  // One update, in place, of every parameter that has a gradient.
  void update(std::vector<torch::Tensor>& params);
  // Adam's moments in layout order: exp_avg.<name>, exp_avg_sq.<name> per parameter (empty for SGD).
  ParamSet moments(const ParamSet& layout) const;
  // Continues from moments as moments() returns them (a StepRecord's optimizer), keeping the step counts.
  void load_moments(const ParamSet& interleaved, const std::vector<torch::Tensor>& params);
  // Continues from a state file's moments and step counts (checked against the parameters by the caller).
  void load(const ParamSet& m, const ParamSet& v, std::vector<int64_t> steps, const std::vector<torch::Tensor>& params);
  const std::vector<int64_t>& steps() const { return steps_; }
  bool adam() const { return opt_ == Optimizer::adam; }
  int64_t bytes() const;

 private:
  Optimizer opt_;
  double lr_;
  std::vector<torch::Tensor> m_, v_;
  std::vector<int64_t> steps_;
};

}  // namespace ckv::run_detail
