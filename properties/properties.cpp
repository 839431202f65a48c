// properties/properties.cpp: see properties.hpp.
#include "properties/properties.hpp"

#include <fmt/format.h>

#include "verifier/compat.hpp"
#include "verifier/model.hpp"

namespace ckv {
namespace {
std::vector<std::string> dims_of(const NamedArray& a) {
  if (a.shape.size() == 2) return {"row", "col"};
  return {"i"};
}
}  // namespace

std::vector<CompareResult> reference_comparisons(const RunObservation& run, const int step,
                                                 const ReferenceFaults& faults) {
  const Case& c = run.c;
  const ParamSet& params = step == 0 ? run.initial_params : run.steps.at(static_cast<size_t>(step - 1)).params_after;
  const DropoutMasks masks = reference_masks(run.masks, c.model, c.dropout, step);
  const ReferenceResult ref = reference_forward_backward(c.model, params, run.data, masks, faults);
  const StepObservation& so = run.steps.at(static_cast<size_t>(step));
  const Tolerance base_tol = tolerance_for(c.precision, Comparison::vs_reference);
  const auto tol_for = [&](const std::vector<double>& expected) { return scaled_to_tensor(base_tol, expected); };
  std::vector<CompareResult> out;
  out.push_back(compare_values({"loss", {}, {}}, {so.loss}, {ref.loss}, tol_for({ref.loss})));
  // Backward order (head first, layer 0 last): the first tensor that diverges is where backward first
  // went wrong, not a downstream consequence of it.
  for (size_t k = ref.grads.items.size(); k-- > 0;) {
    const NamedArray& g = ref.grads.items[k];
    out.push_back(
        compare_values({g.name + ".grad", g.shape, dims_of(g)}, so.grads.items.at(k).data, g.data, tol_for(g.data)));
  }
  out.push_back(
      compare_values({"x.grad", {c.batch, c.seq, c.model.d_model}, {"b", "t", "c"}}, so.dx, ref.dx, tol_for(ref.dx)));
  return out;
}

Finding grad_reference(const RunObservation& run, const ReferenceFaults& faults) {
  Finding f;
  f.property = "grad-reference";
  if (const Tolerance t = tolerance_for(run.c.precision, Comparison::vs_reference); !t.applicable) {
    f.applicable = false;
    f.detail = "not applicable at prec=" + std::string(to_string(run.c.precision)) + ": " + t.why;
    return f;
  }
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

namespace {
Finding fail(const char* property, int step, std::string where, std::string detail) {
  return {property, false, std::move(where), std::move(detail), step};
}
std::vector<double> defined_flags(const std::vector<bool>& v) {
  return std::vector<double>(v.begin(), v.end());
}
}  // namespace

Finding grad_baseline(const RunObservation& base, const RunObservation& test) {
  const Tolerance tol = tolerance_for(test.c.precision, Comparison::vs_baseline);
  const Case& c = test.c;
  for (size_t s = 0; s < test.steps.size(); ++s) {
    const StepObservation &b = base.steps.at(s), &t = test.steps.at(s);
    const int step = static_cast<int>(s);
    std::vector<CompareResult> rs;
    rs.push_back(compare_values({"loss", {}, {}}, {t.loss}, {b.loss}, tol));
    std::vector<std::string> names;
    for (const auto& a : t.grads.items) names.push_back(a.name);
    rs.push_back(compare_values({"grad_defined", {static_cast<int64_t>(names.size())}, {"param"}},
                                defined_flags(t.grad_defined), defined_flags(b.grad_defined), tol));
    if (!rs.back().ok()) {
      const int64_t i = rs.back().r.max_abs_index;
      return fail("grad-baseline", step, fmt::format("step {} {}.grad", step, names.at(static_cast<size_t>(i))),
                  fmt::format("{}.grad is {} with checkpointing but {} without", names.at(static_cast<size_t>(i)),
                              t.grad_defined.at(static_cast<size_t>(i)) ? "defined" : "undefined (no gradient)",
                              b.grad_defined.at(static_cast<size_t>(i)) ? "defined" : "undefined"));
    }
    for (size_t k = t.grads.items.size(); k-- > 0;) {
      const auto& g = t.grads.items[k];
      rs.push_back(compare_values({g.name + ".grad", g.shape, dims_of(g)}, g.data, b.grads.items.at(k).data, tol));
    }
    rs.push_back(compare_values({"x.grad", {c.batch, c.seq, c.model.d_model}, {"b", "t", "c"}}, t.dx, b.dx, tol));
    for (size_t k = 0; k < t.params_after.items.size(); ++k) {
      const auto& p = t.params_after.items[k];
      rs.push_back(compare_values({p.name + " (after step)", p.shape, dims_of(p)}, p.data,
                                  b.params_after.items.at(k).data, tol));
    }
    for (const auto& r : rs)
      if (!r.ok()) return fail("grad-baseline", step, fmt::format("step {} {}", step, r.view.label), r.message());
  }
  return {"grad-baseline", true, "", fmt::format("{} step(s) bitwise equal to the baseline", test.steps.size()), -1};
}

Finding rng_replay(const RunObservation& run) {
  size_t compared = 0;
  for (const MaskRecord& r : run.masks) {
    if (r.call == 0) continue;
    const MaskRecord* first = nullptr;
    for (const MaskRecord& o : run.masks)
      if (o.step == r.step && o.layer == r.layer && o.site == r.site && o.call == 0) first = &o;
    const std::string site = fmt::format("step {} layer{} {} call {}", r.step, r.layer, to_string(r.site), r.call);
    if (!first) return fail("rng-replay", r.step, site, "a recompute call without a first-forward call");
    torch::Tensor known = torch::ones_like(r.mask);
    if (r.known.defined()) known = known & r.known;
    if (first->known.defined()) known = known & first->known;
    const torch::Tensor diff = (r.mask != first->mask) & known;
    const int64_t n = diff.sum().item<int64_t>();
    ++compared;
    if (n > 0) {
      const int64_t flat = diff.reshape({-1}).nonzero().index({0, 0}).item<int64_t>();
      CompareResult where{{"mask", r.mask.sizes().vec(), {}}, {}, {}};
      if (r.site == DropoutSite::attn_probs)
        where.view.dims = {"b", "h", "t", "j"};
      else
        where.view.dims = {"b", "t", "c"};
      return fail("rng-replay", r.step, site,
                  fmt::format("recomputed dropout mask differs from the first forward's at {} of {} known positions "
                              "({:.1f}%), first at index {} (first forward {}, recompute {})",
                              n, known.sum().item<int64_t>(),
                              100.0 * static_cast<double>(n) / static_cast<double>(r.mask.numel()), where.index(flat),
                              first->mask.reshape({-1})[flat].item<bool>() ? "kept" : "dropped",
                              r.mask.reshape({-1})[flat].item<bool>() ? "kept" : "dropped"));
    }
  }
  return {"rng-replay", true, "", fmt::format("{} recomputed mask(s) equal to the first forward's", compared), -1};
}

Finding recompute_count(const RunObservation& run) {
  for (size_t s = 0; s < run.steps.size(); ++s)
    for (size_t g = 0; g < run.segments.size(); ++g) {
      const int want = run.segments[g].checkpointed ? 2 : 1;
      const int got = run.steps[s].segment_calls.at(g);
      if (got != want) {
        const auto& u = run.segments[g].units;
        return fail(
            "recompute-count", static_cast<int>(s),
            fmt::format("step {} segment {} (layers {}..{})", s, g, u.front().layer, u.back().layer),
            fmt::format("forward ran {} time(s), expected {} ({})", got, want,
                        run.segments[g].checkpointed ? "checkpointed: forward + one recompute" : "not checkpointed"));
      }
    }
  return {
      "recompute-count", true, "",
      fmt::format("{} segment(s) x {} step(s) ran the expected number of times", run.segments.size(), run.steps.size()),
      -1};
}

Finding exception_safe(const Case& c, CheckpointImpl& impl) {
  const torch::Device device = parse_device(c.device);
  torch::manual_seed(c.seed);
  torch::nn::Linear lin(8, 8);
  lin->to(device);
  const torch::Tensor x = torch::randn({4, 8}, torch::TensorOptions().device(device)).requires_grad_(true);
  int calls = 0;
  const SegmentFn fn = [&](const torch::Tensor& in) {
    if (++calls == 2) throw std::runtime_error("planted failure in recompute");
    return torch::dropout(lin->forward(in), 0.5, /*train=*/true);
  };
  torch::Tensor out;
  {
    compat::ScopedAutocastState ac(compat::AutocastState::current().with(device.type(), c.precision != Precision::fp32,
                                                                         autocast_dtype(c.precision)));
    out = impl.run(fn, x, lin->parameters());
  }
  torch::manual_seed(c.seed + 1);  // a backward-time RNG state distinct from the forward's
  const torch::Tensor rng_before = compat::default_generator(torch::Device(torch::kCPU)).get_state();
  const compat::AutocastState ac_before = compat::AutocastState::current();
  // The autograd engine resets thread-local state around each node, which would hide a leak of grad
  // mode or autocast; so the node is applied directly, as the engine would, with grad mode off.
  torch::NoGradGuard engine_like;
  bool threw = false;
  try {
    (*out.grad_fn())({torch::ones_like(out)});
  } catch (const std::exception&) {
    threw = true;
  }
  std::string leaks;
  if (!torch::equal(compat::default_generator(torch::Device(torch::kCPU)).get_state(), rng_before))
    leaks += " CPU RNG state;";
  if (compat::AutocastState::current() != ac_before) leaks += " autocast state;";
  if (torch::GradMode::is_enabled()) leaks += " grad mode (left enabled);";
  compat::AutocastState::apply_default();
  if (!threw) return fail("exception-safe", 0, "recompute", "the planted exception in recompute did not propagate");
  if (!leaks.empty())
    return fail("exception-safe", 0, "recompute", "after a throwing recompute these were not restored:" + leaks);
  return {"exception-safe", true, "", "RNG, autocast and grad mode restored after a throwing recompute", -1};
}

std::vector<Finding> check_case(const Case& c, CheckpointImpl& impl) {
  const RunObservation base = run_case(c, nullptr);
  const RunObservation test = run_case(c, &impl);
  return {rng_replay(test), recompute_count(test), grad_baseline(base, test), grad_reference(test),
          exception_safe(c, impl)};
}

}  // namespace ckv
