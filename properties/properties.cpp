// properties/properties.cpp: see properties.hpp.
#include "properties/properties.hpp"

#include <fmt/format.h>

namespace ckv {
namespace {
std::vector<std::string> dims_of(const NamedArray& a) {
  if (a.shape.size() == 2) return {"row", "col"};
  return {"i"};
}
}  // namespace

std::vector<CompareResult> reference_comparisons(const RunObservation& run, const int step, const ReferenceFaults& faults) {
  const Case& c = run.c;
  const ParamSet& params = step == 0 ? run.initial_params : run.steps.at(static_cast<size_t>(step - 1)).params_after;
  DropoutMasks masks = DropoutMasks::none(c.model.layers);
  masks.p = c.dropout;
  for (const auto& r : run.masks) {
    if (r.step != step || r.call != 0) continue;
    const torch::Tensor f = r.mask.to(torch::kDouble).contiguous();
    masks.masks[static_cast<size_t>(r.layer)][static_cast<size_t>(r.site)].assign(f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
  }
  const ReferenceResult ref = reference_forward_backward(c.model, params, run.data, masks, faults);
  const StepObservation& so = run.steps.at(static_cast<size_t>(step));
  const Tolerance tol = tolerance_for(c.precision, Comparison::vs_reference);
  std::vector<CompareResult> out;
  out.push_back(compare_values({"loss", {}, {}}, {so.loss}, {ref.loss}, tol));
  // Backward order (head first, layer 0 last): the first tensor that diverges is where backward first
  // went wrong, not a downstream consequence of it.
  for (size_t k = ref.grads.items.size(); k-- > 0;) {
    const NamedArray& g = ref.grads.items[k];
    out.push_back(compare_values({g.name + ".grad", g.shape, dims_of(g)}, so.grads.items.at(k).data, g.data, tol));
  }
  out.push_back(compare_values({"x.grad", {c.batch, c.seq, c.model.d_model}, {"b", "t", "c"}}, so.dx, ref.dx, tol));
  return out;
}

Finding grad_reference(const RunObservation& run, const ReferenceFaults& faults) {
  Finding f;
  f.property = "grad-reference";
  for (int s = 0; s < static_cast<int>(run.steps.size()); ++s)
    for (const CompareResult& r : reference_comparisons(run, s, faults))
      if (!r.ok()) {
        f.held = false;
        f.step = s;
        f.where = fmt::format("step {} {}", s, r.view.label);
        f.detail = r.message();
        return f;
      }
  f.detail = fmt::format("{} step(s): loss, {} parameter gradients and x.grad within tolerance", run.steps.size(),
                         run.initial_params.items.size());
  return f;
}

}  // namespace ckv
