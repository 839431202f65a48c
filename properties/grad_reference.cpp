// properties/grad_reference.cpp: grad-reference. At every step, the run under test's losses, the
// gradients of its trainable parameters and x.grad match the independent fp64 reference fed the first
// forward's masks, within a bound built from the fp32 evaluation of the same reference (tolerance.hpp).
#include "properties/grad_reference.hpp"

#include <fmt/format.h>

#include "properties/property.hpp"
#include "properties/tolerance.hpp"

namespace ckv {
namespace {
const char* kName = "grad-reference";

std::vector<std::string> dims_of(const NamedArray& a) {
  if (a.shape.size() == 2) return {"row", "col"};
  return {"i"};
}

struct Tensor {
  TensorView view;
  const std::vector<double>* actual;
  const std::vector<double>* e64;
  Fp32Evaluations e32;
};

Finding judge(const Observations& o) {
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
    const StepRecord& t = o.test.steps[s];
    const ExpectedStep &e64 = ref.fp64.at(s), &e32 = ref.fp32.at(s), &e32p = ref.fp32_perturbed.at(s);
    // Backward order, head first: the first tensor that differs is where backward first went wrong.
    std::vector<std::vector<double>> losses(4 * t.losses.size());
    std::vector<Tensor> tensors;
    for (size_t m = 0; m < t.losses.size(); ++m) {
      std::vector<double>* l = &losses[4 * m];
      l[0] = {t.losses[m]}, l[1] = {e64.losses[m]}, l[2] = {e32.losses[m]}, l[3] = {e32p.losses[m]};
      tensors.push_back({{fmt::format("loss (micro {})", m), {}, {}}, &l[0], &l[1], {&l[2], &l[3]}});
    }
    for (size_t k = e64.grads.items.size(); k-- > 0;) {
      if (!o.trainable[k]) continue;
      const NamedArray& g = e64.grads.items[k];
      tensors.push_back({{g.name + ".grad", g.shape, dims_of(g)},
                         &t.grads.items[k].data,
                         &g.data,
                         {&e32.grads.items[k].data, &e32p.grads.items[k].data}});
    }
    if (!c.input_frozen)
      for (size_t m = 0; m < t.dx.size(); ++m)
        tensors.push_back(
            {{fmt::format("x.grad (micro {})", m), {c.batch, c.seq, c.model.input_width()}, {"b", "t", "c"}},
             &t.dx[m],
             &e64.dx[m],
             {&e32.dx[m], &e32p.dx[m]}});
    // BatchNorm's running statistics after the step, against the reference's model of their update.
    for (size_t k = 0; k < e64.batchnorm.items.size(); ++k) {
      const NamedArray& a = e64.batchnorm.items[k];
      tensors.push_back({{a.name + " (after the step)", a.shape, {"i"}},
                         &t.ledger.batchnorm.items.at(k).data,
                         &a.data,
                         {&e32.batchnorm.items.at(k).data, &e32p.batchnorm.items.at(k).data}});
    }
    std::vector<const std::vector<double>*> all64;
    std::vector<Fp32Evaluations> all32;
    for (const auto& x : tensors) all64.push_back(x.e64), all32.push_back(x.e32);
    const StepConditioning cond = step_conditioning(all64, all32);
    const double growth = e64.max_activation / std::max(ref.fp64.front().max_activation, 1e-300);
    for (const auto& x : tensors) {
      ReferenceCheck k;
      k.step = static_cast<int>(s);
      ReferenceBound bound = reference_tolerance(*x.e64, x.e32, cond);
      if (growth > kDivergence)
        bound = {{}, false, fmt::format("training has diverged (activations grew {:.1e}x since step 0)", growth)};
      k.checkable = bound.checkable;
      k.why_not = bound.why_not;
      k.result.view = x.view;
      if (k.checkable) k.result = compare_values(x.view, *x.actual, *x.e64, bound.tol);
      out.checks.push_back(std::move(k));
    }
  }
  return out;
}

Property grad_reference_property() {
  return {
      kName,
      "losses, trainable parameter gradients and x.grad match the Eigen fp64 reference fed the first-forward masks, "
      "within a bound from the reference's own fp32 evaluation (fp32 cases without gradient penalty)",
      judge};
}

}  // namespace ckv
