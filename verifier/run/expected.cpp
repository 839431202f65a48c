// verifier/run/expected.cpp: what the independent reference expects of the run under test (run.hpp:
// expected_step, reference_tensors, floor_comparisons, off_case_shapes), whether it needs the reference
// at all (reproduces_bitwise), and the gradient scale the bounds are built from.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "properties/tolerance.hpp"
#include "verifier/run/trainer.hpp"

namespace ckv {
namespace {
// The running statistics every BatchNorm module starts from (mean 0, variance 1, no batches).
ParamSet initial_batchnorm(const ModelConfig& c) {
  ParamSet out;
  if (!c.has(kBatchNorm)) return out;
  for (int l = 0; l < c.layers; ++l) {
    if (c.param_layer(l) != l) continue;
    const std::string L = "layer" + std::to_string(l) + ".bn.";
    out.items.push_back({L + "running_mean", {c.d_model}, std::vector<double>(static_cast<size_t>(c.d_model), 0.0)});
    out.items.push_back({L + "running_var", {c.d_model}, std::vector<double>(static_cast<size_t>(c.d_model), 1.0)});
    out.items.push_back({L + "num_batches_tracked", {1}, {0.0}});
  }
  return out;
}
}  // namespace

std::string off_case_shapes(const Case& c, const RunRecord& r) {
  auto off = [&](const char* what, int step, int micro, int layer, const torch::Tensor& t,
                 const std::vector<int64_t>& want) -> std::string {
    if (!t.defined() || t.sizes().vec() == want) return "";
    return fmt::format("step {} micro-batch {}: the {} of layer {} has shape {} where the Case's is {}", step, micro,
                       what, layer, c10::str(t.sizes()), c10::str(c10::IntArrayRef(want)));
  };
  const int64_t dff = c.model.d_ff();
  for (const auto& x : r.sites)
    if (x.call == 0 && x.phase == 0)
      if (auto e = off(("dropout mask at " + std::string(to_string(x.site))).c_str(), x.step, x.micro, x.layer, x.mask,
                       dropout_site_shape(c.model, c.batch, seq_of(c, x.micro), x.site));
          !e.empty())
        return e;
  for (const auto& x : r.relu)
    if (x.call == 0)
      if (auto e = off("ReLU pattern", x.step, x.micro, x.layer, x.positive, {c.batch, seq_of(c, x.micro), dff});
          !e.empty())
        return e;
  for (const auto& x : r.noise)
    if (x.call == 0)
      if (auto e = off("noise", x.step, x.micro, x.layer, x.eps, {c.batch, seq_of(c, x.micro), c.model.d_model});
          !e.empty())
        return e;
  for (const auto& x : r.jitter)
    if (x.call == 0)
      if (auto e = off("jitter", x.step, x.micro, x.layer, x.eps, {c.batch, seq_of(c, x.micro), 1}); !e.empty())
        return e;
  return "";
}

namespace {
bool same_tensor(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && torch::equal(a, b));
}
// The records of the first forward's draws (call 0: those reference_masks reads), equal in order.
template <class Call, class Same>
bool same_first_draws(const std::vector<Call>& t, const std::vector<Call>& b, Same same) {
  auto next = [](const std::vector<Call>& v, size_t i) {
    while (i < v.size() && v[i].call != 0) ++i;
    return i;
  };
  size_t i = next(t, 0), j = next(b, 0);
  for (; i < t.size() && j < b.size(); i = next(t, i + 1), j = next(b, j + 1)) {
    const Call &x = t[i], &y = b[j];
    if (x.step != y.step || x.micro != y.micro || x.layer != y.layer || !same(x, y)) return false;
  }
  return i == t.size() && j == b.size();
}
}  // namespace

bool reproduces_bitwise(const RunRecord& t, const RunRecord& b) {
  if (!t.completed || !b.completed || t.steps.size() != b.steps.size()) return false;
  for (size_t s = 0; s < t.steps.size(); ++s) {
    const StepRecord &x = t.steps[s], &y = b.steps[s];
    if (x.losses != y.losses || x.grads.items != y.grads.items || x.grad_defined != y.grad_defined || x.dx != y.dx ||
        x.ledger.batchnorm.items != y.ledger.batchnorm.items)
      return false;
  }
  return same_first_draws(
             t.sites, b.sites,
             [](const SiteCall& x, const SiteCall& y) { return x.site == y.site && same_tensor(x.mask, y.mask); }) &&
         same_first_draws(t.relu, b.relu,
                          [](const ReluCall& x, const ReluCall& y) { return same_tensor(x.positive, y.positive); }) &&
         same_first_draws(t.noise, b.noise,
                          [](const NoiseCall& x, const NoiseCall& y) { return same_tensor(x.eps, y.eps); }) &&
         same_first_draws(t.jitter, b.jitter,
                          [](const NoiseCall& x, const NoiseCall& y) { return same_tensor(x.eps, y.eps); });
}

ExpectedStep expected_step(const Observations& o, int step, RefScalar scalar, const ReferenceFaults& faults,
                           bool perturb) {
  const Case& c = o.c;
  const ParamSet& start = step == 0 ? o.initial_params : o.test.steps.at(static_cast<size_t>(step - 1)).params_after;
  // Copies only where the inputs are perturbed.
  std::optional<ParamSet> nudged_params;
  std::optional<std::vector<CaseData>> nudged_data;
  if (perturb) {
    nudged_params = start, nudged_data = o.data;
    SplitMix64 sign(stream_seed(c.seed, "perturb.step" + std::to_string(step)));
    auto nudge = [&](double& v) { v *= 1.0 + ((sign.next() & 1) ? 1.0 : -1.0) * 0x1p-21; };
    for (auto& a : nudged_params->items) std::for_each(a.data.begin(), a.data.end(), nudge);
    for (auto& d : *nudged_data) std::for_each(d.x.begin(), d.x.end(), nudge);
  }
  const ParamSet& params = perturb ? *nudged_params : start;
  const std::vector<CaseData>& data = perturb ? *nudged_data : o.data;
  ExpectedStep e;
  e.grads = zeros_like(params);
  e.batchnorm =
      step == 0 ? initial_batchnorm(c.model) : o.test.steps.at(static_cast<size_t>(step - 1)).ledger.batchnorm;
  for (int m = 0; m < c.micro; ++m) {
    const DropoutMasks masks =
        reference_masks(o.test.sites, o.test.relu, o.test.noise, o.test.jitter, c.model, c.dropout, step, m);
    const ReferenceResult r = reference_forward_backward(c.model, params, data[static_cast<size_t>(m)], masks,
                                                         ReferenceOptions{faults, scalar, 1.0 / c.micro, m});
    // BatchNorm's running statistics: one update per layer per forward, in forward order.
    for (size_t l = 0; l < r.bn_mean.size(); ++l) {
      const std::string L = "layer" + std::to_string(c.model.param_layer(static_cast<int>(l))) + ".bn.";
      auto& mean = e.batchnorm.at(L + "running_mean").data;
      auto& var = e.batchnorm.at(L + "running_var").data;
      for (size_t j = 0; j < mean.size(); ++j) {
        mean[j] = (1.0 - kBatchNormMomentum) * mean[j] + kBatchNormMomentum * r.bn_mean[l][j];
        var[j] = (1.0 - kBatchNormMomentum) * var[j] + kBatchNormMomentum * r.bn_var[l][j];
      }
      e.batchnorm.at(L + "num_batches_tracked").data[0] += 1.0;
    }
    e.losses.push_back(r.loss);
    e.dx.push_back(r.dx);
    for (const auto& out : r.layer_out)
      for (double v : out) e.max_activation = std::max(e.max_activation, std::abs(v));
    for (double v : r.logits) e.max_activation = std::max(e.max_activation, std::abs(v));
    for (size_t k = 0; k < r.grads.items.size(); ++k)
      for (size_t i = 0; i < r.grads.items[k].data.size(); ++i)
        e.grads.items[k].data[i] += apply_hook(c.hook, r.grads.items[k].data[i]);
  }
  return e;
}

double apply_hook(Hook h, double g) {
  switch (h) {
    case Hook::none:
      return g;
    case Hook::scale:
      return g * 0.5;
    case Hook::clip:
      return std::min(std::max(g, -kClipHook), kClipHook);
  }
  return g;
}

double step_gradient_scale(const StepRecord& b) {
  double scale = b.hook_input_max;
  for (size_t k = 0; k < b.grads.items.size(); ++k)
    if (b.grad_defined[k])
      for (double v : b.grads.items[k].data) scale = std::max(scale, std::abs(v));
  for (const auto& d : b.dx)
    for (double v : d) scale = std::max(scale, std::abs(v));
  return scale;
}

std::vector<ReferenceTensor> reference_tensors(const Observations& o, size_t s) {
  const ReferenceRecord& ref = o.reference;
  const Case& c = o.c;
  const StepRecord& t = o.test.steps.at(s);
  const ExpectedStep& e64 = ref.fp64.at(s);
  std::vector<const ExpectedStep*> e32;
  if (s < ref.fp32.size() && ref.fp32[s]) e32 = {&ref.fp32[s]->plain, &ref.fp32[s]->perturbed};
  auto evaluations = [&](auto pick) {
    std::vector<std::vector<double>> out;
    for (const ExpectedStep* e : e32) out.push_back(pick(*e));
    return out;
  };
  std::vector<ReferenceTensor> out;
  for (size_t m = 0; m < t.losses.size(); ++m)
    out.push_back({{fmt::format("loss (micro {})", m), {}, {}},
                   {t.losses[m]},
                   {e64.losses.at(m)},
                   evaluations([m](const ExpectedStep& e) { return std::vector<double>{e.losses.at(m)}; })});
  for (size_t k = e64.grads.items.size(); k-- > 0;) {
    if (!o.trainable.at(k)) continue;
    const NamedArray& g = e64.grads.items[k];
    const std::vector<std::string> dims =
        g.shape.size() == 2 ? std::vector<std::string>{"row", "col"} : std::vector<std::string>{"i"};
    out.push_back(
        {{g.name + ".grad", g.shape, dims}, t.grads.items.at(k).data, g.data, evaluations([k](const ExpectedStep& e) {
           return e.grads.items.at(k).data;
         })});
  }
  if (!c.input_frozen)
    for (size_t m = 0; m < t.dx.size(); ++m)
      out.push_back({{fmt::format("x.grad (micro {})", m),
                      {c.batch, seq_of(c, static_cast<int>(m)), c.model.input_width()},
                      {"b", "t", "c"}},
                     t.dx[m],
                     e64.dx.at(m),
                     evaluations([m](const ExpectedStep& e) { return e.dx.at(m); })});
  for (size_t k = 0; k < e64.batchnorm.items.size(); ++k) {
    const NamedArray& a = e64.batchnorm.items[k];
    out.push_back({{a.name + " (after the step)", a.shape, {"i"}},
                   t.ledger.batchnorm.items.at(k).data,
                   a.data,
                   evaluations([k](const ExpectedStep& e) { return e.batchnorm.items.at(k).data; })});
  }
  return out;
}

FloorComparisons floor_comparisons(const Observations& o, size_t s) {
  const std::vector<ReferenceTensor> tensors = reference_tensors(o, s);
  std::vector<const std::vector<double>*> all64;
  for (const auto& x : tensors) all64.push_back(&x.e64);
  const double model_scale = reference_model_scale(all64);
  FloorComparisons out;
  for (const auto& x : tensors) {
    if (!std::all_of(x.e64.begin(), x.e64.end(), [](double v) { return std::isfinite(v); })) out.decides = false;
    out.results.push_back(compare_values(x.view, x.actual, x.e64, reference_floor_tolerance(x.e64, model_scale)));
    if (!out.results.back().ok()) out.decides = false;
  }
  return out;
}

}  // namespace ckv
