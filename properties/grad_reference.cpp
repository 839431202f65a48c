// properties/grad_reference.cpp: grad-reference. At every step, the run under test's losses, the
// gradients of its trainable parameters and x.grad match the independent fp64 reference fed the first
// forward's masks, within a bound built from the fp32 evaluation of the same reference (tolerance.hpp).
// Not applicable where the run under test reproduced plain autograd bit for bit (observe(), run.hpp):
// the verdict there would be the baseline's.
#include "properties/grad_reference.hpp"

#include <fmt/format.h>

#include "properties/property.hpp"
#include "properties/tolerance.hpp"

namespace ckv {
namespace {
const char* kName = "grad-reference";

Finding judge(const Observations& o) {
  if (!o.reference.off_shape.empty())
    return Finding::fail(kName, 0, "the first forwards' draws", o.reference.off_shape);
  const ReferenceChecks rc = reference_checks(o);
  if (!rc.applicable) return Finding::not_applicable(kName, rc.why_not);
  int checked = 0, skipped = 0;
  std::string skip_reason;
  for (const auto& k : rc.checks) {
    if (!k.checkable) {
      if (skip_reason.empty()) skip_reason = fmt::format("step {} {}: {}", k.step, k.result.view.label, k.why_not);
      ++skipped;
      continue;
    }
    ++checked;
    if (!k.result.ok())
      return Finding::fail(kName, k.step, fmt::format("step {} {}", k.step, k.result.view.label), k.result.message());
  }
  if (checked == 0) return Finding::not_applicable(kName, "no tensor is checkable in fp32: " + skip_reason);
  std::string summary =
      fmt::format("{} step(s): {} tensor(s) within their fp32-conditioned bounds", o.test.steps.size(), checked);
  if (skipped) summary += fmt::format("; {} not checkable ({})", skipped, skip_reason);
  return Finding::pass(kName, summary);
}
std::string diverged(double growth) {
  return fmt::format("training has diverged (activations grew {:.1e}x since step 0)", growth);
}
}  // namespace

ReferenceChecks reference_checks(const Observations& o) {
  ReferenceChecks out;
  const ReferenceRecord& ref = o.reference;
  const Case& c = o.c;
  if (!ref.computed) return {false, ref.why_not, {}};
  if (c.model.norm == NormKind::layer && c.model.d_model <= 2)
    return {
        false,
        "LayerNorm over d <= 2 features leaves only rounding noise in the gradients through it (its output does not "
        "depend on its input)",
        {}};
  for (size_t s = 0; s < o.test.steps.size(); ++s) {
    const double growth = ref.fp64.at(s).max_activation / std::max(ref.fp64.front().max_activation, 1e-300);
    const bool evaluated = s < ref.fp32.size() && ref.fp32[s].has_value();
    if (!evaluated) {
      // The fp32 evaluations were not made: every tensor of the step is within the floor (run.hpp), as the
      // comparisons that decided so show (made again where the records were built by hand).
      std::vector<CompareResult> made;
      const std::vector<CompareResult>* floor = s < ref.floor.size() && !ref.floor[s].empty() ? &ref.floor[s] : nullptr;
      if (!floor) made = floor_comparisons(o, s).results, floor = &made;
      for (const CompareResult& r : *floor) {
        ReferenceCheck k;
        k.step = static_cast<int>(s);
        k.result = r;
        k.result.tol.why += " (within it, the fp32 evaluations cannot change the verdict and were not made)";
        if (growth > kDivergence) k.checkable = false, k.why_not = diverged(growth);
        out.checks.push_back(std::move(k));
      }
      continue;
    }
    const std::vector<ReferenceTensor> tensors = reference_tensors(o, s);
    std::vector<const std::vector<double>*> all64;
    std::vector<Fp32Evaluations> all32;
    for (const auto& x : tensors) {
      all64.push_back(&x.e64);
      all32.emplace_back();
      for (const auto& e : x.e32) all32.back().push_back(&e);
    }
    const StepConditioning cond = step_conditioning(all64, all32);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const ReferenceTensor& x = tensors[i];
      ReferenceCheck k;
      k.step = static_cast<int>(s);
      const bool diverging = growth > kDivergence;
      const ReferenceBound bound = diverging ? ReferenceBound{} : reference_tolerance(x.e64, all32[i], cond);
      k.checkable = bound.checkable && !diverging;
      k.why_not = diverging ? diverged(growth) : bound.why_not;
      k.result.view = x.view;
      if (k.checkable) k.result = compare_values(x.view, x.actual, x.e64, bound.tol);
      out.checks.push_back(std::move(k));
    }
  }
  return out;
}

Property grad_reference_property() {
  return {
      kName,
      "losses, trainable parameter gradients and x.grad match the Eigen fp64 reference fed the first-forward masks, "
      "within a bound from the reference's own fp32 evaluation (fp32 cases without gradient penalty where the run "
      "under test is not plain autograd's bit for bit)",
      judge};
}

}  // namespace ckv
