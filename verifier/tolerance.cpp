// verifier/tolerance.cpp: the table itself (see tolerance.hpp).
#include "verifier/tolerance.hpp"

#include <algorithm>
#include <cmath>

namespace ckv {

Tolerance tolerance_for(Precision p, Comparison k) {
  if (k == Comparison::vs_baseline) {
    if (p == Precision::fp32)
      return {0.0, 0.0, "checkpointing replays the same fp32 kernels on the same inputs: bitwise equal on CPU"};
    return {0.0, 0.0, "autocast recompute replays the same casts and kernels: bitwise equal on CPU"};
  }
  switch (p) {
    case Precision::fp32:
      // fp32 vs fp64 through the layer stack. Rounding is amplified by LayerNorm over few features in
      // deep stacks, so the error has a heavy tail: `calibrate_tolerance 8000 fp32` finds the worst
      // tensor error at median 7.8e-6 but max 2.2e-3 of the tensor's scale (d_model 4..8, 5..8 layers).
      // With this row (atol in tensor-scale units, scaled_to_tensor) the worst of those 8000 cases uses
      // 32% of the allowance and the 99th percentile 1.2%; the planted errors in the tests are O(1e-1..1).
      return {1e-3, 4e-4, "fp32 model vs fp64 reference: rounding over the layer stack, amplified by narrow LayerNorms"};
    // Measured with `calibrate_tolerance 600 <prec>` (CPU, plan none, one step): the worst tensor's
    // error is O(1) of its scale, and the relative L2 error of all gradients together is heavy-tailed.
    // No bound both passes correct runs and catches bugs, so the comparison is reported as not
    // applicable; grad-baseline (bitwise against the non-checkpointed autocast run) is the AMP check.
    case Precision::bf16:
      return {0.0, 0.0,
              "bf16 autocast vs fp64 has no useful bound at these sizes (global relative L2 over 600 cases: median "
              "1.7%, p99 38%, max 70%)",
              false};
    case Precision::fp16:
      return {0.0, 0.0,
              "fp16 autocast vs fp64 has no useful bound at these sizes (global relative L2 over 600 cases: median "
              "0.18%, p99 7%, max 32%)",
              false};
  }
  return {};
}

Tolerance scaled_to_tensor(const Tolerance& t, const std::vector<double>& expected) {
  double scale = 1.0;
  for (double v : expected)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  Tolerance out = t;
  out.atol *= scale;
  if (scale > 1.0) out.why += " (atol scaled by the tensor's largest |expected|)";
  return out;
}

}  // namespace ckv
