// verifier/dist/reducer.cpp: see reducer.hpp.
#include "verifier/dist/reducer.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>
#include <string>

namespace ckv::dist {

struct GradReducer::State {
  std::shared_ptr<Group> replicas;
  std::shared_ptr<CollectiveLedger> ledger;
  std::vector<torch::Tensor> params;
  std::vector<std::string> labels;  // the ledger's, per parameter
  std::mutex mu;
  std::vector<int> fires;
  bool armed = true;
};

namespace {
// Averages parameter `index`'s accumulated gradient over the replicas, after its AccumulateGrad ran.
struct ReduceHook : torch::autograd::FunctionPostHook {
  std::weak_ptr<GradReducer::State> state;
  size_t index = 0;
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    const std::shared_ptr<GradReducer::State> s = state.lock();
    if (!s) return outputs;
    torch::Tensor param;
    {
      const std::lock_guard<std::mutex> lock(s->mu);
      if (!s->armed) return outputs;
      ++s->fires.at(index);
      param = s->params.at(index);
    }
    // The average is not differentiated again: refused rather than silently first-order.
    if (torch::GradMode::is_enabled())
      throw std::runtime_error("GradReducer: a backward with create_graph through a data-parallel reducer (parameter " +
                               std::to_string(index) + ") is not supported");
    torch::NoGradGuard no_grad;
    // Every replica joins the collective, also one whose gradient is undefined (it contributes zeros and
    // then holds the average, as DDP does for a parameter unused on one replica).
    const torch::Tensor grad = param.grad();
    torch::Tensor sum = all_reduce_recorded(*s->replicas, grad.defined() ? grad : torch::zeros_like(param),
                                            s->ledger.get(), Pass::backward, s->labels.at(index));
    sum.div_(static_cast<double>(s->replicas->size()));
    if (grad.defined())
      grad.copy_(sum);
    else
      param.mutable_grad() = sum;
    return outputs;
  }
};
}  // namespace

GradReducer::GradReducer(std::shared_ptr<Group> replicas, std::vector<torch::Tensor> params,
                         std::shared_ptr<CollectiveLedger> ledger, std::vector<std::string> names)
    : state_(std::make_shared<State>()) {
  if (!replicas) throw std::invalid_argument("GradReducer: no data-parallel group");
  state_->replicas = std::move(replicas);
  state_->ledger = std::move(ledger);
  state_->params = std::move(params);
  state_->fires.assign(state_->params.size(), 0);
  if (!names.empty() && names.size() != state_->params.size())
    throw std::invalid_argument("GradReducer: " + std::to_string(names.size()) + " names for " +
                                std::to_string(state_->params.size()) + " parameters");
  for (size_t i = 0; i < state_->params.size(); ++i)
    state_->labels.push_back("dp." + (names.empty() ? std::to_string(i) : names[i]));
  for (size_t i = 0; i < state_->params.size(); ++i) {
    const torch::Tensor& p = state_->params[i];
    if (!p.requires_grad()) continue;
    if (!p.is_leaf()) throw std::invalid_argument("GradReducer: parameter " + std::to_string(i) + " is not a leaf");
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(p);
    auto hook = std::make_unique<ReduceHook>();
    hook->state = state_;
    hook->index = i;
    acc->add_post_hook(std::move(hook));
    accumulators_.emplace_back(i, std::move(acc));
  }
}

GradReducer::~GradReducer() {
  const std::lock_guard<std::mutex> lock(state_->mu);
  state_->armed = false;
}

void GradReducer::begin_backward() {
  // set_data to another dtype or device (what Module::to does) gives a parameter a new accumulator,
  // without the hook: its gradient would silently go unreduced.
  for (const auto& [i, acc] : accumulators_)
    if (torch::autograd::impl::try_get_grad_accumulator(state_->params[i]) != acc)
      throw std::logic_error("GradReducer: parameter " + std::to_string(i) +
                             " has a new gradient accumulator (its dtype or device changed?): build the reducer "
                             "again after moving the model");
  const std::lock_guard<std::mutex> lock(state_->mu);
  std::fill(state_->fires.begin(), state_->fires.end(), 0);
}

std::vector<int> GradReducer::fires() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->fires;
}

}  // namespace ckv::dist
