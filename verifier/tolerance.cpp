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
      // fp32 vs fp64 through a few layers of matmul/softmax/norm: relative error a few 1e-6 on
      // O(1) values; gradients summed over B*T rows lose a little more. (PyTorch's own fp32 default is
      // 1.3e-6/1e-5 for a single op; a whole model needs one decade more.)
      return {2e-4, 2e-5, "fp32 model vs fp64 reference: accumulated rounding over the layer stack"};
    case Precision::bf16:
    case Precision::fp16:
      // Measured over 600 generated bf16 cases (CPU, plan none): the worst tensor's error is O(1) of its
      // scale (median 27%, max 234%) and the relative L2 error of all gradients together has median
      // 1.7%, p99 38%, max 70%. No bound both passes correct runs and catches bugs, so this
      // comparison is reported as not applicable; grad-baseline (bitwise) is the autocast check.
      return {0.0, 0.0, "autocast gradients vs fp64: no useful bound at these sizes (relative L2 p99 38%)", false};
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
