// verifier/dropout_tap.hpp: instrumented dropout. Every dropout site of the model under test calls
// DropoutTap::apply, which draws the mask and records it with (step, layer, site, call ordinal), for
// the first forward and for every later call of the same site in the same step (a recompute). The
// properties compare recomputed masks with the first-forward ones (rng-replay), and the reference is
// fed the first-forward masks (grad-reference).
//
// Two implementations (Case::dropout_impl):
//   explicit: mask = bernoulli(1-p) drawn with the device's current default generator, out = x*mask/(1-p).
//   native:   out = torch::dropout(x, p, true); the mask is recovered as (out != 0) where x != 0.
//             Caveat: where the input is exactly zero the mask is unknowable from the output; those
//             positions are recorded as "unknown" (MaskRecord::known false), excluded from mask
//             comparisons, and given to the reference as kept (1). Exact zeros arise after ReLU and at
//             causally masked attention probabilities; in both cases the gradient through that
//             position is zero whatever the mask, so the reference gradients are unaffected.
#pragma once

#include <torch/torch.h>

#include <array>
#include <vector>

#include "reference/transformer.hpp"
#include "verifier/case.hpp"

namespace ckv {

struct MaskRecord {
  int step = 0;
  int layer = 0;
  DropoutSite site = DropoutSite::attn_probs;
  int call = 0;               // 0 = first forward of this step, 1.. = later calls (recomputes)
  bool grad_enabled = false;  // grad mode during the call (false in a checkpoint's first forward)
  torch::Tensor mask;         // bool, CPU, the site's shape; true = kept
  torch::Tensor known;        // bool, CPU; undefined when every position is known (explicit)
};

class DropoutTap {
 public:
  DropoutTap(DropoutImpl impl, std::array<double, kNumDropoutSites> p) : impl_(impl), p_(p) {}
  void begin_step(int step) { step_ = step; }
  torch::Tensor apply(const torch::Tensor& x, int layer, DropoutSite site);
  const std::vector<MaskRecord>& records() const { return records_; }

 private:
  DropoutImpl impl_;
  std::array<double, kNumDropoutSites> p_;
  int step_ = 0;
  std::vector<MaskRecord> records_;
};

// The masks that `call` (0 = the first forward) of every site drew at `step`, as the reference
// consumes them; sites without a record (rate 0) stay identity.
DropoutMasks reference_masks(const std::vector<MaskRecord>& records, const ModelConfig& cfg,
                             const std::array<double, kNumDropoutSites>& p, int step, int call = 0);

}  // namespace ckv
