// verifier/model/site_tap.hpp: the instrument at every dropout site of the model under test. Each call
// of a site records its context (step, micro-batch, phase: the forward or the k-th backward pass), its
// ordinal among the calls of that site in that micro-batch (0 = the first forward, 1.. = recomputes),
// grad mode and the autocast state it ran under, and, where the rate is non-zero, the mask it drew.
// The properties compare recomputed calls with the first forward (rng-replay, autocast-replay), and
// the reference is fed the first-forward masks (grad-reference).
//
// Two dropout implementations (Case::dropout_impl):
//   explicit: mask = bernoulli(1-p) drawn with the device's current default generator, out = x*mask/(1-p).
//   native:   out = torch::dropout(x, p, true); the mask is recovered as (out != 0) where x != 0.
//             Caveat: where the input is exactly zero the mask is unknowable from the output; those
//             positions are recorded as "unknown" (SiteCall::known false), excluded from mask
//             comparisons, and given to the reference as kept (1). Exact zeros arise after ReLU and at
//             masked attention probabilities; in both cases the gradient through that position is
//             zero whatever the mask, so the reference gradients are unaffected.
#pragma once

#include <torch/torch.h>

#include <array>
#include <vector>

#include "reference/transformer.hpp"
#include "verifier/case/case.hpp"
#include "verifier/checkpoint/compat.hpp"

namespace ckv {

struct SiteCall {
  int step = 0, micro = 0;
  int phase = 0;  // 0: the forward; k >= 1: during the k-th backward pass of this micro-batch
  int layer = 0;
  DropoutSite site = DropoutSite::attn_probs;
  int call = 0;  // 0 = first call of this site in this micro-batch, 1.. = later calls (recomputes)
  bool grad_enabled = false;
  compat::AutocastState autocast;
  torch::Tensor mask;   // bool, CPU, the site's shape, true = kept; undefined when the rate is 0
  torch::Tensor known;  // bool, CPU; undefined when every position is known (explicit)
};

// The side of ReLU's kink each FFN pre-activation fell on (the reference replays it: transformer.hpp).
struct ReluCall {
  int step = 0, micro = 0, layer = 0, call = 0;
  torch::Tensor positive;  // bool, CPU, (B,T,Dff)
};

// The eps a noise module (Effect kNoise) or the jitter (rand=jitter) drew: the reference applies the
// first forward's, and rng-replay compares every recompute's with it.
struct NoiseCall {
  int step = 0, micro = 0, phase = 0, layer = 0, call = 0;
  torch::Tensor eps;  // float, CPU, (B,T,D) for noise, (B,T,1) for jitter
};

class SiteTap {
 public:
  SiteTap(DropoutImpl impl, std::array<double, kNumDropoutSites> p) : impl_(impl), p_(p) {}
  void set_context(int step, int micro, int phase) { step_ = step, micro_ = micro, phase_ = phase; }
  // Off: the sites compute exactly as when recording, but keep no records (`ckverify bench`, where
  // the records would cost time and memory the measurement must not include).
  void set_recording(bool on) { recording_ = on; }
  torch::Tensor apply(const torch::Tensor& x, int layer, DropoutSite site);
  // relu(z), recording where z was positive.
  torch::Tensor relu(const torch::Tensor& z, int layer);
  // y + kNoiseScale * eps with eps ~ N(0,1) from the device's default generator, recording eps.
  torch::Tensor noise(const torch::Tensor& y, int layer);
  const std::vector<NoiseCall>& noise_calls() const { return noise_calls_; }
  // y * (1 + kJitterScale * eps) with eps ~ N(0,1) of shape (B,T,1) from the device's default generator
  // (rand=jitter, config.hpp), recording eps.
  torch::Tensor jitter(const torch::Tensor& y, int layer);
  const std::vector<NoiseCall>& jitter_calls() const { return jitter_calls_; }
  int step() const { return step_; }
  int micro() const { return micro_; }
  const std::vector<SiteCall>& calls() const { return calls_; }
  const std::vector<ReluCall>& relu_calls() const { return relu_calls_; }

 private:
  DropoutImpl impl_;
  std::array<double, kNumDropoutSites> p_;
  int step_ = 0, micro_ = 0, phase_ = 0;
  bool recording_ = true;
  std::vector<SiteCall> calls_;
  std::vector<ReluCall> relu_calls_;
  std::vector<NoiseCall> noise_calls_;
  std::vector<NoiseCall> jitter_calls_;
};

// The decisions that the first forward of (step, micro) made, as the reference consumes them: the masks
// of every site (sites without a mask, rate 0, stay identity), the ReLU sides, the noise and the jitter.
DropoutMasks reference_masks(const std::vector<SiteCall>& calls, const std::vector<ReluCall>& relu,
                             const std::vector<NoiseCall>& noise, const std::vector<NoiseCall>& jitter,
                             const ModelConfig& cfg, const std::array<double, kNumDropoutSites>& p, int step,
                             int micro);

}  // namespace ckv
