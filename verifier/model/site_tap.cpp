// verifier/model/site_tap.cpp: see site_tap.hpp.
#include "verifier/model/site_tap.hpp"

#include "verifier/model/memory.hpp"

namespace ckv {

torch::Tensor SiteTap::apply(const torch::Tensor& x, int layer, DropoutSite site) {
  const double p = p_[static_cast<size_t>(site)];
  if (!recording_) {
    if (p == 0.0) return x;
    if (impl_ == DropoutImpl::explicit_mask) return x * torch::empty_like(x).bernoulli_(1.0 - p) * (1.0 / (1.0 - p));
    return torch::dropout(x, p, /*train=*/true);
  }
  SiteCall rec;
  rec.step = step_;
  rec.micro = micro_;
  rec.phase = phase_;
  rec.layer = layer;
  rec.site = site;
  rec.grad_enabled = torch::GradMode::is_enabled();
  rec.autocast = compat::AutocastState::current();
  for (const auto& r : calls_) rec.call += r.step == step_ && r.micro == micro_ && r.layer == layer && r.site == site;
  torch::Tensor out = x;
  if (p > 0.0) {
    if (impl_ == DropoutImpl::explicit_mask) {
      // bernoulli_ draws from the default generator of x's device: exactly the state a checkpoint must
      // save and restore.
      const torch::Tensor keep = torch::empty_like(x).bernoulli_(1.0 - p);
      out = x * keep * (1.0 / (1.0 - p));
      ChargeTo instrument(nullptr);  // the record is ckverify's, not the run's memory (memory.hpp)
      rec.mask = keep.to(torch::kCPU).to(torch::kBool);
    } else {
      out = torch::dropout(x, p, /*train=*/true);
      torch::NoGradGuard no_grad;
      ChargeTo instrument(nullptr);
      rec.known = (x != 0).to(torch::kCPU);
      rec.mask = ((out != 0).to(torch::kCPU)) | rec.known.logical_not();  // unknown positions recorded as kept
    }
  }
  calls_.push_back(std::move(rec));
  return out;
}

torch::Tensor SiteTap::relu(const torch::Tensor& z, int layer) {
  if (!recording_) return torch::relu(z);
  ReluCall rec;
  rec.step = step_;
  rec.micro = micro_;
  rec.layer = layer;
  for (const auto& r : relu_calls_) rec.call += r.step == step_ && r.micro == micro_ && r.layer == layer;
  {
    torch::NoGradGuard no_grad;
    ChargeTo instrument(nullptr);
    rec.positive = (z > 0).to(torch::kCPU);
  }
  relu_calls_.push_back(std::move(rec));
  return torch::relu(z);
}

torch::Tensor SiteTap::noise(const torch::Tensor& y, int layer) {
  NoiseCall rec;
  rec.step = step_;
  rec.micro = micro_;
  rec.phase = phase_;
  rec.layer = layer;
  for (const auto& r : noise_calls_) rec.call += r.step == step_ && r.micro == micro_ && r.layer == layer;
  const torch::Tensor eps = torch::randn(y.sizes(), y.options().dtype(torch::kFloat));
  {
    ChargeTo instrument(nullptr);
    rec.eps = eps.detach().to(torch::kCPU).clone();
  }
  noise_calls_.push_back(std::move(rec));
  return y + eps * kNoiseScale;
}

torch::Tensor SiteTap::jitter(const torch::Tensor& y, int layer) {
  const torch::Tensor eps = torch::randn({y.size(0), y.size(1), 1}, y.options().dtype(torch::kFloat));
  if (recording_) {
    NoiseCall rec;
    rec.step = step_, rec.micro = micro_, rec.phase = phase_, rec.layer = layer;
    for (const auto& r : jitter_calls_) rec.call += r.step == step_ && r.micro == micro_ && r.layer == layer;
    ChargeTo instrument(nullptr);
    rec.eps = eps.detach().to(torch::kCPU).clone();
    jitter_calls_.push_back(std::move(rec));
  }
  return y * (1.0 + kJitterScale * eps);
}

DropoutMasks reference_masks(const std::vector<SiteCall>& calls, const std::vector<ReluCall>& relu,
                             const std::vector<NoiseCall>& noise, const std::vector<NoiseCall>& jitter,
                             const ModelConfig& cfg, const std::array<double, kNumDropoutSites>& p, int step,
                             int micro) {
  DropoutMasks m = DropoutMasks::none(cfg.layers);
  m.p = p;
  for (const auto& r : noise) {
    if (r.step != step || r.micro != micro || r.call != 0) continue;
    if (m.noise.empty()) m.noise.resize(static_cast<size_t>(cfg.layers));
    const torch::Tensor f = r.eps.to(torch::kDouble).contiguous();
    m.noise[static_cast<size_t>(r.layer)].assign(f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
  }
  for (const auto& r : jitter) {
    if (r.step != step || r.micro != micro || r.call != 0) continue;
    if (m.jitter.empty()) m.jitter.resize(static_cast<size_t>(cfg.layers));
    const torch::Tensor f = r.eps.to(torch::kDouble).contiguous();
    m.jitter[static_cast<size_t>(r.layer)].assign(f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
  }
  for (const auto& r : relu) {
    if (r.step != step || r.micro != micro || r.call != 0) continue;
    if (m.relu.empty()) m.relu.resize(static_cast<size_t>(cfg.layers));
    const torch::Tensor f = r.positive.to(torch::kDouble).contiguous();
    m.relu[static_cast<size_t>(r.layer)].assign(f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
  }
  for (const auto& r : calls) {
    if (r.step != step || r.micro != micro || r.call != 0 || !r.mask.defined()) continue;
    const torch::Tensor f = r.mask.to(torch::kDouble).contiguous();
    m.masks[static_cast<size_t>(r.layer)][static_cast<size_t>(r.site)].assign(f.data_ptr<double>(),
                                                                              f.data_ptr<double>() + f.numel());
  }
  return m;
}

}  // namespace ckv
