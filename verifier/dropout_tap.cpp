// verifier/dropout_tap.cpp: see dropout_tap.hpp.
#include "verifier/dropout_tap.hpp"

namespace ckv {

torch::Tensor DropoutTap::apply(const torch::Tensor& x, int layer, DropoutSite site) {
  const double p = p_[static_cast<size_t>(site)];
  if (p == 0.0) return x;
  MaskRecord rec;
  rec.step = step_;
  rec.layer = layer;
  rec.site = site;
  rec.grad_enabled = torch::GradMode::is_enabled();
  int call = 0;
  for (const auto& r : records_) call += r.step == step_ && r.layer == layer && r.site == site;
  rec.call = call;
  torch::Tensor out;
  if (impl_ == DropoutImpl::explicit_mask) {
    // bernoulli_ draws from the default generator of x's device: exactly the state a checkpoint must
    // save and restore.
    const torch::Tensor keep = torch::empty_like(x).bernoulli_(1.0 - p);
    out = x * keep * (1.0 / (1.0 - p));
    rec.mask = keep.to(torch::kCPU).to(torch::kBool);
  } else {
    out = torch::dropout(x, p, /*train=*/true);
    torch::NoGradGuard no_grad;
    rec.known = (x != 0).to(torch::kCPU);
    rec.mask = ((out != 0).to(torch::kCPU)) | rec.known.logical_not();  // unknown positions recorded as kept
  }
  records_.push_back(std::move(rec));
  return out;
}

DropoutMasks reference_masks(const std::vector<MaskRecord>& records, const ModelConfig& cfg,
                             const std::array<double, kNumDropoutSites>& p, int step, int call) {
  DropoutMasks m = DropoutMasks::none(cfg.layers);
  m.p = p;
  for (const auto& r : records) {
    if (r.step != step || r.call != call) continue;
    const torch::Tensor f = r.mask.to(torch::kDouble).contiguous();
    m.masks[static_cast<size_t>(r.layer)][static_cast<size_t>(r.site)].assign(f.data_ptr<double>(),
                                                                              f.data_ptr<double>() + f.numel());
  }
  return m;
}

}  // namespace ckv
