// verifier/run/optimizer.cpp: see optimizer.hpp.
#include "verifier/run/optimizer.hpp"

#include <cmath>

#include "verifier/run/trainer.hpp"

namespace ckv::run_detail {
OptimizerState::OptimizerState(const Case& c, const std::vector<torch::Tensor>& params) : opt_(c.opt), lr_(c.lr) {
  if (opt_ != Optimizer::adam) return;
  for (const auto& p : params) {
    m_.push_back(torch::zeros_like(p));
    v_.push_back(torch::zeros_like(p));
  }
  steps_.assign(params.size(), 0);
}

void OptimizerState::update(std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& p = params[i];
    if (!p.grad().defined()) continue;
    const torch::Tensor g = p.grad();
    if (opt_ == Optimizer::sgd) {
      p.sub_(g * lr_);
      continue;
    }
    const double t = static_cast<double>(++steps_[i]);
    m_[i].mul_(kAdamBeta1).add_(g, 1.0 - kAdamBeta1);
    v_[i].mul_(kAdamBeta2).addcmul_(g, g, 1.0 - kAdamBeta2);
    const double bc1 = 1.0 - std::pow(kAdamBeta1, t), bc2 = 1.0 - std::pow(kAdamBeta2, t);
    const torch::Tensor denom = (v_[i].sqrt() / std::sqrt(bc2)).add_(kAdamEps);
    p.addcdiv_(m_[i], denom, -lr_ / bc1);
  }
}

ParamSet OptimizerState::moments(const ParamSet& layout) const {
  ParamSet out;
  for (size_t i = 0; i < m_.size(); ++i) {
    const NamedArray& a = layout.items[i];
    out.items.push_back({"exp_avg." + a.name, a.shape, to_doubles(m_[i])});
    out.items.push_back({"exp_avg_sq." + a.name, a.shape, to_doubles(v_[i])});
  }
  return out;
}

void OptimizerState::load_moments(const ParamSet& interleaved, const std::vector<torch::Tensor>& params) {
  for (size_t i = 0; i < m_.size(); ++i) {
    m_[i] = to_tensor(interleaved.items.at(2 * i).data, params[i].sizes().vec(), params[i].device());
    v_[i] = to_tensor(interleaved.items.at(2 * i + 1).data, params[i].sizes().vec(), params[i].device());
  }
}

void OptimizerState::load(const ParamSet& m, const ParamSet& v, std::vector<int64_t> steps,
                          const std::vector<torch::Tensor>& params) {
  for (size_t i = 0; i < m_.size(); ++i) {
    m_[i] = to_tensor(m.items.at(i).data, params[i].sizes().vec(), params[i].device());
    v_[i] = to_tensor(v.items.at(i).data, params[i].sizes().vec(), params[i].device());
  }
  steps_ = std::move(steps);
}

int64_t OptimizerState::bytes() const {
  int64_t n = 0;
  for (const auto* v : {&m_, &v_})
    for (const auto& t : *v) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace ckv::run_detail
