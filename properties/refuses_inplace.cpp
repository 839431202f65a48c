// properties/refuses_inplace.cpp: refuses-inplace. When the input of a checkpointed segment (its hidden
// state, or the key mask: inplace_on) is modified in place between its forward and its backward, in any
// micro-batch (inplace_micro), the recompute must not silently use the new value:
// either backward fails with an error (a version check, as torch's checkpoint and ckverify's builtin
// do), or it completes with the gradients of the forward that ran (an implementation that recomputes
// from its own copy of the input, e.g. a clone per call or torch.autograd.graph.save_on_cpu). The
// second is judged against the same forward and backward with the input left alone. A segment's
// parameters edited between micro-batches (inplace_on=param) must leave the gradients plain autograd
// gives with the same edit.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "properties/compare.hpp"
#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "refuses-inplace";

// A completed run's gradients: parameters, which are defined, x.
struct Gradients {
  const ParamSet& grads;
  const std::vector<bool>& defined;
  const std::vector<double>& dx;
};
// `actual` against `expected`; "" when they match within tol.
std::string gradient_difference(const Gradients& actual, const Gradients& expected, const Tolerance& tol) {
  if (actual.defined != expected.defined) return "which parameters have a gradient";
  if (actual.grads.items.size() != expected.grads.items.size()) return "another number of gradients";
  for (size_t k = 0; k < expected.grads.items.size(); ++k) {
    const NamedArray& x = expected.grads.items[k];
    const auto r = compare_values({x.name + ".grad", x.shape, {}}, actual.grads.items[k].data, x.data, tol);
    if (!r.ok()) return r.message();
  }
  if (actual.dx.size() != expected.dx.size()) return "x.grad defined in one run only";
  if (const auto r = compare_values({"x.grad", {}, {}}, actual.dx, expected.dx, tol); !r.ok()) return r.message();
  return "";
}

// inplace_on=param: the target segment's parameters edited in place between micro-batches, no forward
// waiting for backward. Plain autograd completes with the new values' gradients for the later
// micro-batches; a checkpoint must too (refusing is a finding: training that edits its weights between
// micro-batches, as an EMA, a weight constraint or a pipeline's update does, would stop).
Finding judge_parameter_edit(const Observations& o) {
  const InplaceExperiment& e = o.inplace_exp;
  const int k = o.c.inplace_micro;
  const std::string where = fmt::format("step 0 micro {} segment {}", k, e.segment);
  const std::string what = fmt::format(
      "segment {}'s parameters were modified in place before micro-batch {}'s forward (every earlier backward done)",
      e.segment, k);
  const ExperimentGradients &plain = e.plain_unedited, &unedited = e.impl_unedited;
  // An implementation that raises, or whose gradients differ from plain autograd's, without the edit too
  // is wrong in a way the edit does not explain (completes' or grad-baseline's finding on the run under
  // test); this property blames edits.
  if (!unedited.ran)
    return Finding::not_applicable(kName, "the same micro-batches without the edit raised too: " + unedited.error);
  if (e.threw)
    return Finding::fail(kName, 0, where, what + ", and the run raised where plain autograd completes: " + e.message);
  if (!e.reference_ran)
    throw std::logic_error("refuses-inplace: plain autograd failed the parameter edit experiment: " +
                           e.reference_error);
  if (!plain.ran)
    throw std::logic_error("refuses-inplace: plain autograd failed the parameter edit experiment without the edit: " +
                           plain.error);
  // The edit's effect on plain autograd's gradients, and their scale, bound the comparison.
  double effect = 0.0, scale = o.baseline.steps.empty() ? 0.0 : step_gradient_scale(o.baseline.steps[0]);
  auto measure = [&](const std::vector<double>& edited, const std::vector<double>& unedited) {
    for (size_t i = 0; i < edited.size() && i < unedited.size(); ++i) {
      if (!std::isfinite(edited[i]) || !std::isfinite(unedited[i])) continue;
      effect = std::max(effect, std::abs(edited[i] - unedited[i]));
      scale = std::max(scale, std::abs(edited[i]));
    }
  };
  for (size_t k = 0; k < e.expected_grads.items.size() && k < plain.grads.items.size(); ++k)
    measure(e.expected_grads.items[k].data, plain.grads.items[k].data);
  measure(e.expected_dx, plain.dx);
  const int paths = o.c.gp > 0.0 ? 2 : 1;
  // Every parameter taken as read by every layer and the head (tie=blocks, a tied head), along every path.
  const int uses = paths * (o.c.model.layers + 2);
  const Tolerance tol = parameter_edit_tolerance(o.c.precision, paths, uses, scale, effect);
  if (const std::string d = gradient_difference({unedited.grads, unedited.grad_defined, unedited.dx},
                                                {plain.grads, plain.grad_defined, plain.dx}, tol);
      !d.empty())
    return Finding::not_applicable(
        kName, "without the edit the implementation's gradients already differ from plain autograd's (" + d +
                   "): grad-baseline judges that");
  if (const std::string d = gradient_difference({e.grads, e.grad_defined, e.dx},
                                                {e.expected_grads, e.expected_grad_defined, e.expected_dx}, tol);
      !d.empty())
    return Finding::fail(kName, 0, where,
                         what +
                             ", and the gradients are not plain autograd's with the same edit (a recompute from "
                             "parameter values other than those its forward read): " +
                             d);
  return Finding::pass(kName, "parameters edited between micro-batches: the gradients are plain autograd's");
}

Finding judge(const Observations& o) {
  const InplaceExperiment& e = o.inplace_exp;
  if (!e.ran && e.forward_failed)
    return Finding::fail(kName, 0, "the experiment's step 0 forward",
                         "the implementation raised in a second run of the run under test's step 0, before the "
                         "experiment changed anything, where the run under test did not (state kept across runs?): " +
                             e.why_not);
  if (!e.ran) return Finding::not_applicable(kName, e.why_not);
  if (o.c.inplace_on == InplaceOn::param) return judge_parameter_edit(o);
  const bool mask = o.c.inplace_on == InplaceOn::mask;
  const int micro = o.c.inplace_micro;
  const std::string where = fmt::format("step 0 micro {} segment {}", micro, e.segment);
  if (e.threw) return Finding::pass(kName, "backward refused: " + e.message);
  const std::string pending =
      o.c.sched == Schedule::ffbb && micro + 1 < o.c.micro
          ? fmt::format(" (with the forwards of micro-batches {}..{} also waiting for backward)", micro + 1,
                        o.c.micro - 1)
          : std::string();
  const std::string what =
      (mask ? fmt::format("the key mask every segment received was modified in place after micro-batch {}'s forward",
                          micro)
            : fmt::format("segment {}'s input was modified in place between micro-batch {}'s forward and its backward",
                          e.segment, micro)) +
      pending + " and backward completed without an error";
  if (!e.reference_ran)
    return Finding::fail(kName, 0, where,
                         what + ", but the same backward with it left alone failed: " + e.reference_error);
  if (const std::string d = gradient_difference({e.grads, e.grad_defined, e.dx},
                                                {e.expected_grads, e.expected_grad_defined, e.expected_dx},
                                                baseline_tolerance(o.c.precision));
      !d.empty())
    return Finding::fail(kName, 0, where,
                         what +
                             ", with gradients that are not those of the forward that ran (the recompute did not "
                             "use the input the forward saw): " +
                             d);
  return Finding::pass(kName,
                       "backward completed with the gradients of the forward that ran (the implementation recomputes "
                       "from its own copy of the input)");
}
}  // namespace

Property refuses_inplace_property() {
  return {kName,
          "a checkpointed segment's input modified in place before backward makes backward fail, or backward yields "
          "the gradients of the forward that ran (a recompute from the implementation's own copy); never a recompute "
          "from the new value. Parameters edited between micro-batches leave plain autograd's gradients",
          judge};
}

}  // namespace ckv
