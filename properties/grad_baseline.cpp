// properties/grad_baseline.cpp: grad-baseline. The run under test and the non-checkpointed run of the
// same Case agree at every step: each micro-batch's loss, whether each parameter received a gradient,
// how often each parameter's gradient hook ran, every parameter gradient, each micro-batch's x.grad, and
// the parameters after the optimizer step. Losses bitwise on CPU, fp32 and autocast alike; gradients
// within rounding of a different summation order (reorder_tolerance), and further where a
// gradient's contributions arrive along several paths: a parameter read in several places, and every
// gradient under a gradient penalty (tolerance.hpp says why). Where ckverify's reference reentrant checkpoint
// ran on the Case (Observations::design; under autocast without a penalty also its form recomputing from
// detached leaves, design_leaf, as torch's use_reentrant=True does), a gradient may also move by a
// multiple of what the correct designs move it (design_floor_tolerance, the larger of the two), and one
// that a design too makes non-finite where the
// baseline is finite (an overflow of its summation order under autocast) is not judged. The baseline
// takes each step from the parameters the run under test reached (run.hpp), so every step is judged on
// its own.
#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "properties/compare.hpp"
#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "grad-baseline";

std::vector<std::string> dims_of(const NamedArray& a) {
  if (a.shape.size() == 2) return {"row", "col"};
  return {"i"};
}

// How many units (and the head) read each parameter, in layout order.
std::vector<int> parameter_uses(const Observations& o) {
  const ParamSet& layout = o.initial_params;
  std::vector<int> uses(layout.items.size(), 0);
  auto count = [&](const std::vector<std::string>& names) {
    for (const auto& n : names)
      for (size_t i = 0; i < layout.items.size(); ++i)
        if (layout.items[i].name == n) ++uses[i];
  };
  const auto& m = o.c.model;
  for (const auto& seg : o.segments)
    for (const Unit& u : seg.units) {
      if (u.part == BlockPart::embed) count(part_param_names(m, ModelPart::input_projection));
      if (u.part == BlockPart::whole || u.part == BlockPart::attn)
        count(part_param_names(m, ModelPart::block_attn, u.layer));
      if (u.part == BlockPart::whole || u.part == BlockPart::ffn)
        count(part_param_names(m, ModelPart::block_ffn, u.layer));
    }
  count(part_param_names(m, ModelPart::head));
  return uses;
}

// How far the reference reentrant design moved `design` from `base`: the largest finite |difference|,
// and whether it made some value non-finite that the baseline has finite.
struct Deviation {
  double largest = 0.0;
  bool overflowed = false;
};
Deviation deviation(const std::vector<double>& design, const std::vector<double>& base) {
  Deviation d;
  for (size_t i = 0; i < design.size() && i < base.size(); ++i) {
    if (!std::isfinite(base[i])) continue;
    if (!std::isfinite(design[i]))
      d.overflowed = true;
    else
      d.largest = std::max(d.largest, std::abs(design[i] - base[i]));
  }
  return d;
}

Finding judge(const Observations& o) {
  if (!o.test.completed) return Finding::not_applicable(kName, "the run under test did not complete");
  const Case& c = o.c;
  const Tolerance exact = baseline_tolerance(c.precision);
  // A gradient penalty adds a second backward path (through the first backward's graph) to every
  // gradient; where paths meet, contributions may be summed in another order by a correct checkpoint.
  const int paths = c.gp > 0.0 ? 2 : 1;
  std::vector<int> uses = parameter_uses(o);
  for (int& u : uses) u *= paths;
  const auto& names = o.initial_params.items;
  int unjudged = 0;  // gradients the reference design too made non-finite
  for (size_t s = 0; s < o.test.steps.size(); ++s) {
    const StepRecord &b = o.baseline.steps.at(s), &t = o.test.steps.at(s);
    const int step = static_cast<int>(s);
    // The largest |gradient| of the step (a clipping hook's unclipped input included: the rounding
    // comes from the unclipped gradients), for every rounding bound.
    const double step_scale = step_gradient_scale(b);
    const Tolerance reorder = reorder_tolerance(c.precision, paths, step_scale);
    const StepRecord* design = o.design_ran && s < o.design.steps.size() ? &o.design.steps[s] : nullptr;
    const StepRecord* leaf = o.design_leaf_ran && s < o.design_leaf.steps.size() ? &o.design_leaf.steps[s] : nullptr;
    // How far the reference designs moved a tensor from the baseline's: the larger of the two.
    auto design_deviation = [&](auto pick, const std::vector<double>& base) {
      Deviation d = deviation(pick(*design), base);
      if (leaf) {
        const Deviation l = deviation(pick(*leaf), base);
        d.largest = std::max(d.largest, l.largest), d.overflowed = d.overflowed || l.overflowed;
      }
      return d;
    };
    std::vector<std::optional<Tolerance>> grad_tols(names.size());  // as judged (none: not judged)
    auto failed = [&](const CompareResult& r) {
      return Finding::fail(kName, step, fmt::format("step {} {}", step, r.view.label), r.message());
    };
    for (size_t m = 0; m < t.losses.size(); ++m) {
      const auto r = compare_values({fmt::format("loss (micro {})", m), {}, {}}, {t.losses[m]}, {b.losses[m]}, exact);
      if (!r.ok()) return failed(r);
    }
    for (size_t k = 0; k < names.size(); ++k)
      if (t.grad_defined[k] != b.grad_defined[k])
        return Finding::fail(kName, step, fmt::format("step {} {}.grad", step, names[k].name),
                             fmt::format("{}.grad is {} with checkpointing but {} without", names[k].name,
                                         t.grad_defined[k] ? "defined" : "undefined (no gradient)",
                                         b.grad_defined[k] ? "defined" : "undefined"));
    for (size_t k = 0; k < names.size(); ++k)
      if (t.hook_calls[k] != b.hook_calls[k])
        return Finding::fail(kName, step, fmt::format("step {} {} gradient hook", step, names[k].name),
                             fmt::format("the gradient hook of {} ran {} time(s) in the step with checkpointing, {} "
                                         "without (it must run once per backward)",
                                         names[k].name, t.hook_calls[k], b.hook_calls[k]));
    // Backward order (head first): the first tensor that differs is where backward first went wrong.
    for (size_t k = names.size(); k-- > 0;) {
      if (!b.grad_defined[k]) continue;
      const auto& g = t.grads.items[k];
      const auto& e = b.grads.items[k].data;
      Tolerance tol =
          uses[k] > 1 ? looser(shared_gradient_tolerance(c.precision, uses[k], step_scale), reorder) : reorder;
      if (design) {
        const Deviation d = design_deviation(
            [k](const StepRecord& r) -> const std::vector<double>& { return r.grads.items[k].data; }, e);
        if (d.overflowed) {
          ++unjudged;
          continue;
        }
        tol = looser(tol, design_floor_tolerance(d.largest));
      }
      grad_tols[k] = tol;
      const auto r = compare_values({g.name + ".grad", g.shape, dims_of(g)}, g.data, e, tol);
      if (!r.ok()) return failed(r);
    }
    for (size_t m = 0; m < b.dx.size(); ++m) {
      if (b.dx[m].empty() && t.dx[m].empty()) continue;
      const std::string label = fmt::format("x.grad (micro {})", m);
      if (b.dx[m].size() != t.dx[m].size())
        return Finding::fail(
            kName, step, fmt::format("step {} {}", step, label),
            fmt::format("{} is {} with checkpointing but {} without", label, t.dx[m].empty() ? "undefined" : "defined",
                        b.dx[m].empty() ? "undefined" : "defined"));
      Tolerance tol = paths > 1 ? looser(shared_gradient_tolerance(c.precision, paths, step_scale), reorder) : reorder;
      if (design && m < design->dx.size() && (!leaf || m < leaf->dx.size())) {
        const Deviation d =
            design_deviation([m](const StepRecord& r) -> const std::vector<double>& { return r.dx[m]; }, b.dx[m]);
        if (d.overflowed) {
          ++unjudged;
          continue;
        }
        tol = looser(tol, design_floor_tolerance(d.largest));
      }
      const auto r =
          compare_values({label, {c.batch, seq_of(c, static_cast<int>(m)), c.model.input_width()}, {"b", "t", "c"}},
                         t.dx[m], b.dx[m], tol);
      if (!r.ok()) return failed(r);
    }
    for (size_t k = 0; k < names.size(); ++k) {
      const auto& p = t.params_after.items[k];
      Tolerance tol = exact;
      // A parameter whose gradient was bitwise equal must be bitwise equal after the step; one whose
      // gradient moved within its bound may move by what the optimizer makes of that.
      if (b.grad_defined[k] && t.grads.items[k].data != b.grads.items[k].data) {
        if (!grad_tols[k]) continue;  // its gradient was not judged: nor is the update made of it
        const Tolerance& g = *grad_tols[k];
        tol = c.opt == Optimizer::adam ? adam_update_tolerance(g, c.lr) : shared_update_tolerance(g, c.lr);
      }
      const auto r = compare_values({p.name + " (after the step)", p.shape, dims_of(p)}, p.data,
                                    b.params_after.items[k].data, tol);
      if (!r.ok()) return failed(r);
    }
  }
  std::string summary = fmt::format("{} step(s) equal to the non-checkpointed run", o.test.steps.size());
  if (o.design_ran) summary += " (gradients within the reference reentrant checkpoint's measured floor)";
  if (unjudged > 0)
    summary +=
        fmt::format("; {} gradient(s) not judged: the reference reentrant checkpoint overflows them too", unjudged);
  return Finding::pass(kName, summary);
}
}  // namespace

Property grad_baseline_property() {
  return {kName,
          "loss, which parameters get gradients, hook calls, every gradient, x.grad and the parameters after each "
          "step equal the non-checkpointed run: losses bitwise on CPU, gradients within rounding of another "
          "summation order (shared parameters within their multi-path bound)",
          judge};
}

}  // namespace ckv
