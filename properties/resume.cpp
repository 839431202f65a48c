// properties/resume.cpp: resume. The run under test, saved to a state file after `resume` micro-batches,
// loaded into a freshly built model and optimizer and continued, ends every later step exactly as the
// uninterrupted run under test does: losses of the micro-batches it ran, which parameters got
// gradients, every gradient, the parameters and the optimizer state after the update, and the whole
// side-effect ledger (counters, log, BatchNorm running statistics, every generator's position).
#include <fmt/format.h>

#include "properties/compare.hpp"
#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "resume";

// The first array of `actual` that differs from `expected`, as a one-line message ("" when equal).
std::string first_difference(const ParamSet& actual, const ParamSet& expected, const Tolerance& tol,
                             const std::string& suffix, std::string& where) {
  if (actual.items.size() != expected.items.size()) {
    where = "state" + suffix;
    return fmt::format("{} arrays where the uninterrupted run has {}", actual.items.size(), expected.items.size());
  }
  for (size_t k = 0; k < expected.items.size(); ++k) {
    const NamedArray& e = expected.items[k];
    const auto r = compare_values({e.name + suffix, e.shape, {}}, actual.items[k].data, e.data, tol);
    if (!r.ok()) {
      where = e.name + suffix;
      return r.message();
    }
  }
  return "";
}

Finding judge(const Observations& o) {
  const Case& c = o.c;
  const ResumeExperiment& r = o.resume_exp;
  if (!r.ran) return Finding::not_applicable(kName, r.why_not);
  const int M = c.micro, first = r.position / M;
  const std::string at =
      fmt::format("resumed after micro-batch {} (step {}, micro-batch {})", r.position, first, r.position % M);
  if (!r.error.empty()) return Finding::fail(kName, first, "resumed run", "the run " + at + " failed: " + r.error);
  const size_t expected_steps = static_cast<size_t>(c.steps - first);
  if (r.steps.size() != expected_steps)
    return Finding::fail(
        kName, first, "resumed run",
        fmt::format("the run {} completed {} step(s), the uninterrupted run {}", at, r.steps.size(), expected_steps));
  const Tolerance tol = baseline_tolerance(c.precision);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const int step = first + static_cast<int>(i);
    const StepRecord &a = r.steps[i], &e = o.test.steps.at(static_cast<size_t>(step));
    auto fail = [&](const std::string& where, const std::string& what) {
      return Finding::fail(kName, step, fmt::format("step {} {}", step, where),
                           fmt::format("{}: {} differs from the uninterrupted run: {}", at, where, what));
    };
    for (int m = a.first_micro; m < M; ++m) {
      const size_t mi = static_cast<size_t>(m);
      // Through compare_values, so a diverged run's NaN or Inf loss equals the same non-finite loss
      // (a plain != calls NaN unequal to itself: a false positive on every diverging fp16/bf16 Case).
      const std::string label = fmt::format("loss (micro {})", m);
      if (const auto r = compare_values({label, {}, {}}, {a.losses.at(mi)}, {e.losses.at(mi)}, tol); !r.ok())
        return fail(label, r.message());
    }
    std::string where;
    if (a.grad_defined != e.grad_defined) return fail("gradients", "which parameters have a gradient");
    if (a.hook_calls != e.hook_calls) return fail("hook calls", "gradient hook call counts");
    if (std::string d = first_difference(a.grads, e.grads, tol, ".grad", where); !d.empty()) return fail(where, d);
    if (std::string d = first_difference(a.params_after, e.params_after, tol, " (after the update)", where); !d.empty())
      return fail(where, d);
    if (std::string d = first_difference(a.optimizer, e.optimizer, tol, "", where); !d.empty())
      return fail(where + " (optimizer state)", d);
    const Ledger &la = a.ledger, &le = e.ledger;
    if (std::string d = first_difference(la.batchnorm, le.batchnorm, tol, "", where); !d.empty()) return fail(where, d);
    for (int l = 0; l < c.model.layers; ++l) {
      const size_t li = static_cast<size_t>(l);
      if (la.counter[li] != le.counter[li])
        return fail(fmt::format("layer{} counter", l), fmt::format("{} vs {}", la.counter[li], le.counter[li]));
      if (la.external[li] != le.external[li])
        return fail(fmt::format("layer{} external counter", l),
                    fmt::format("{} vs {}", la.external[li], le.external[li]));
    }
    if (la.log != le.log) return fail("log", fmt::format("{} bytes vs {} bytes", la.log.size(), le.log.size()));
    if (const std::string d = la.rng.differences(le.rng); !d.empty())
      return fail("generators", "the position of these generators: " + d);
  }
  return Finding::pass(kName, fmt::format("{}: {} step(s) equal to the uninterrupted run", at, r.steps.size()));
}
}  // namespace

Property resume_property() {
  return {kName,
          "the run under test saved after resume= micro-batches, loaded into a fresh model and optimizer and "
          "continued, ends every later step as the uninterrupted run does: losses, gradients, parameters, optimizer "
          "state and side-effect ledger, bitwise on CPU",
          judge};
}

}  // namespace ckv
