// properties/refuses_inplace.cpp: refuses-inplace. When the input of a checkpointed segment (its hidden
// state, or the key mask: inplace_on) is modified in place between its forward and its backward, in any
// micro-batch (inplace_micro), the recompute must not silently use the new value:
// either backward fails with an error (a version check, as torch's checkpoint and ckverify's builtin
// do), or it completes with the gradients of the forward that ran (an implementation that recomputes
// from its own copy of the input, e.g. a clone per call or torch.autograd.graph.save_on_cpu). The
// second is judged against the same forward and backward with the input left alone.
#include <fmt/format.h>

#include "properties/compare.hpp"
#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "refuses-inplace";

Finding judge(const Observations& o) {
  const InplaceExperiment& e = o.inplace_exp;
  if (!e.ran && e.forward_failed)
    return Finding::fail(kName, 0, "the experiment's step 0 forward",
                         "the implementation raised in a second run of the run under test's step 0, before the "
                         "experiment changed anything, where the run under test did not (state kept across runs?): " +
                             e.why_not);
  if (!e.ran) return Finding::not_applicable(kName, e.why_not);
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
  const Tolerance tol = baseline_tolerance(o.c.precision);
  auto differs = [&](const std::string& detail) {
    return Finding::fail(kName, 0, where,
                         what +
                             ", with gradients that are not those of the forward that ran (the recompute did not "
                             "use the input the forward saw): " +
                             detail);
  };
  if (e.grad_defined != e.expected_grad_defined) return differs("which parameters have a gradient");
  if (e.grads.items.size() != e.expected_grads.items.size()) return differs("another number of gradients");
  for (size_t k = 0; k < e.expected_grads.items.size(); ++k) {
    const NamedArray& x = e.expected_grads.items[k];
    const auto r = compare_values({x.name + ".grad", x.shape, {}}, e.grads.items[k].data, x.data, tol);
    if (!r.ok()) return differs(r.message());
  }
  if (e.dx.size() != e.expected_dx.size()) return differs("x.grad defined in one run only");
  if (const auto r = compare_values({"x.grad", {}, {}}, e.dx, e.expected_dx, tol); !r.ok()) return differs(r.message());
  return Finding::pass(kName,
                       "backward completed with the gradients of the forward that ran (the implementation recomputes "
                       "from its own copy of the input)");
}
}  // namespace

Property refuses_inplace_property() {
  return {kName,
          "a checkpointed segment's input modified in place before backward makes backward fail, or backward yields "
          "the gradients of the forward that ran (a recompute from the implementation's own copy); never a recompute "
          "from the new value",
          judge};
}

}  // namespace ckv
