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
    torch::Tensor grad;
    {
      const std::lock_guard<std::mutex> lock(s->mu);
      if (!s->armed) return outputs;
      ++s->fires.at(index);
      grad = s->params.at(index).grad();
    }
    if (!grad.defined()) return outputs;
    torch::NoGradGuard no_grad;
    torch::Tensor sum = grad.detach().contiguous().clone();
    s->replicas->all_reduce_sum_(sum);
    grad.copy_(sum.div_(static_cast<double>(s->replicas->size())));
    if (s->ledger)
      s->ledger->add({Collective::all_reduce, Pass::backward, static_cast<int64_t>(sum.numel() * sum.element_size()),
                      "dp." + std::to_string(index)});
    return outputs;
  }
};
}  // namespace

GradReducer::GradReducer(std::shared_ptr<Group> replicas, std::vector<torch::Tensor> params,
                         std::shared_ptr<CollectiveLedger> ledger)
    : state_(std::make_shared<State>()) {
  if (!replicas) throw std::invalid_argument("GradReducer: no data-parallel group");
  state_->replicas = std::move(replicas);
  state_->ledger = std::move(ledger);
  state_->params = std::move(params);
  state_->fires.assign(state_->params.size(), 0);
  for (size_t i = 0; i < state_->params.size(); ++i) {
    const torch::Tensor& p = state_->params[i];
    if (!p.requires_grad()) continue;
    if (!p.is_leaf()) throw std::invalid_argument("GradReducer: parameter " + std::to_string(i) + " is not a leaf");
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(p);
    auto hook = std::make_unique<ReduceHook>();
    hook->state = state_;
    hook->index = i;
    acc->add_post_hook(std::move(hook));
    accumulators_.push_back(std::move(acc));
  }
}

GradReducer::~GradReducer() {
  const std::lock_guard<std::mutex> lock(state_->mu);
  state_->armed = false;
}

void GradReducer::begin_backward() {
  const std::lock_guard<std::mutex> lock(state_->mu);
  std::fill(state_->fires.begin(), state_->fires.end(), 0);
}

std::vector<int> GradReducer::fires() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->fires;
}

}  // namespace ckv::dist
