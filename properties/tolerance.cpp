// properties/tolerance.cpp: the table itself (see tolerance.hpp).
#include "properties/tolerance.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ckv {
namespace {
double largest(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}
// Machine epsilon of the dtype gradients are accumulated in.
double accumulation_eps(Precision p) {
  switch (p) {
    case Precision::fp32:
      return std::numeric_limits<float>::epsilon();
    case Precision::bf16:
      return 0x1p-7;
    case Precision::fp16:
      return 0x1p-10;
  }
  return 0.0;
}
constexpr double kFp32Eps = std::numeric_limits<float>::epsilon();
}  // namespace

Tolerance baseline_tolerance(Precision p) {
  if (p == Precision::fp32)
    return {0.0, 0.0, "a checkpoint replays the same fp32 kernels on the same inputs: bitwise equal on CPU"};
  return {0.0, 0.0, "an autocast recompute replays the same casts and kernels: bitwise equal on CPU"};
}

Tolerance shared_gradient_tolerance(Precision p, int uses, double step_scale) {
  const double atol = kSharedFactor * uses * accumulation_eps(p) * step_scale;
  return {0.0, atol,
          fmt::format("contributions along {} paths may be summed in another order{}", uses,
                      p == Precision::fp32 ? "" : " and in fp32 instead of the autocast dtype")};
}

Tolerance reorder_tolerance(Precision p, int paths, double step_scale) {
  double eps = kSharedFactor * kReorderPaths * paths * kFp32Eps;
  if (p != Precision::fp32) eps = std::max(eps, kSharedFactor * kAutocastReorderPaths * paths * accumulation_eps(p));
  return {0.0, eps * step_scale,
          fmt::format("a correct checkpoint may sum a gradient's contributions in another order (rounding of the "
                      "step's largest gradient{})",
                      p == Precision::fp32 ? "" : ", in fp32 and in the autocast dtype")};
}

Tolerance parameter_edit_tolerance(Precision p, int paths, int uses, double step_scale, double edit_effect) {
  const double share = p == Precision::fp32 ? kParamEditShare : kAutocastParamEditShare;
  const Tolerance rounding =
      looser(shared_gradient_tolerance(p, uses, step_scale), reorder_tolerance(p, paths, step_scale));
  const Tolerance edit{
      0.0, share * edit_effect,
      fmt::format("{} of the {:.3g} by which the edit moves plain autograd's gradients", share, edit_effect)};
  return looser(rounding, edit);
}

Tolerance design_floor_tolerance(double deviation) {
  return {0.0, kDesignFloorFactor * deviation,
          fmt::format("{} x the {:.3g} by which ckverify's reference reentrant checkpoint moves it on this step",
                      kDesignFloorFactor, deviation)};
}

Tolerance looser(const Tolerance& a, const Tolerance& b) {
  return a.atol >= b.atol ? a : b;
}

Tolerance adam_update_tolerance(const Tolerance& gradient, double lr) {
  return {2.0 * kFp32Eps, 2.0 * lr, "the Adam update of " + gradient.why};
}

Tolerance shared_update_tolerance(const Tolerance& gradient, double lr) {
  return {2.0 * kFp32Eps, lr * gradient.atol, "the SGD update of " + gradient.why};
}

namespace {
// The largest finite |fp32 - fp64| over the evaluations; `finite` reports whether they all were.
double fp32_error(const std::vector<double>& e64, const Fp32Evaluations& e32, bool* finite = nullptr) {
  double err = 0.0;
  bool all = true;
  for (const auto* ev : e32)
    for (size_t i = 0; i < e64.size(); ++i) {
      const double a = e64[i], b = (*ev)[i];
      all = all && std::isfinite(b);
      if (std::isfinite(a) && std::isfinite(b)) err = std::max(err, std::abs(a - b));
    }
  if (finite) *finite = all;
  return err;
}
}  // namespace

double reference_model_scale(const std::vector<const std::vector<double>*>& e64) {
  double m = 0.0;
  for (const auto* t : e64) m = std::max(m, largest(*t));
  return m;
}

Tolerance reference_floor_tolerance(const std::vector<double>& e64, double model_scale) {
  static const std::string why = fmt::format("{} fp32 eps of the step's largest gradient", kReferenceFloor);
  return {0.0, kReferenceFloor * kFp32Eps * std::max(largest(e64), model_scale), why};
}

StepConditioning step_conditioning(const std::vector<const std::vector<double>*>& e64,
                                   const std::vector<Fp32Evaluations>& e32) {
  StepConditioning c;
  c.model_scale = reference_model_scale(e64);
  for (size_t k = 0; k < e64.size(); ++k) {
    const double scale = largest(*e64[k]);
    if (scale < 1e-3 * c.model_scale || scale == 0.0) continue;
    const double err = fp32_error(*e64[k], e32[k]);
    if (err / scale > c.spread) c.spread = err / scale, c.worst = std::to_string(k);
  }
  return c;
}

ReferenceBound reference_tolerance(const std::vector<double>& e64, const Fp32Evaluations& e32,
                                   const StepConditioning& step) {
  ReferenceBound b;
  bool finite64 = true, finite32 = true;
  for (double v : e64) finite64 = finite64 && std::isfinite(v);
  const double err32 = fp32_error(e64, e32, &finite32);
  const double scale = largest(e64);
  if (!finite64) return {{}, false, "the fp64 reference itself is not finite"};
  if (!finite32) return {{}, false, "fp32 overflows on this case (the fp32 reference evaluation is not finite)"};
  if (kReferenceFactor * step.spread > kReferenceCap)
    return {{},
            false,
            fmt::format("fp32 rounding alone moves some gradient of this step by {:.2e} of its scale: the step is too "
                        "ill-conditioned in fp32 to check",
                        step.spread)};
  if (kReferenceFactor * err32 > kReferenceCap * std::max(scale, 1e-3 * step.model_scale))
    return {{},
            false,
            fmt::format("fp32 rounding alone moves it by {:.2e} of its scale: too ill-conditioned in fp32 to check",
                        scale > 0 ? err32 / scale : err32)};
  const double floor = reference_floor_tolerance(e64, step.model_scale).atol;
  const double noise = std::max(err32, step.spread * scale);
  b.tol = {0.0, kReferenceFactor * noise + floor,
           fmt::format("{} x max(the fp32 reference's own error {:.3g}, the step's fp32 spread {:.3g} x scale) + {} "
                       "fp32 eps of the step's largest gradient",
                       kReferenceFactor, err32, step.spread, kReferenceFloor)};
  return b;
}

double amp_drift_allowance(double noise_floor, double design_floor) {
  // A design floor that is not finite (a reference run overflowed) allows nothing beyond the noise floor.
  if (!std::isfinite(design_floor)) return noise_floor;
  return std::max(noise_floor, kAmpDesignFactor * design_floor);
}

}  // namespace ckv
