// verifier/run/amp_audit.cpp: see amp_audit.hpp.
#include "verifier/run/amp_audit.hpp"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include "properties/tolerance.hpp"
#include "verifier/impls/faults/reentrant.hpp"
#include "verifier/run/run.hpp"

namespace ckv {
namespace {

// The parameter group of a layout name: "layer3.attn.wq.weight" -> "layer3"; "head.weight" -> "head".
// With weights tied across blocks every block uses layer0's parameters: that group is "blocks".
std::string group_of(const std::string& name, Tie tie) {
  std::string g = name.substr(0, name.find('.'));
  return tie == Tie::blocks && g == "layer0" ? "blocks" : g;
}

struct GroupStats {
  double diff2 = 0.0, ref2 = 0.0, diff_max = 0.0, ref_max = 0.0;
  double rel_l2() const {
    if (ref2 == 0.0) return diff2 == 0.0 ? 0.0 : INFINITY;
    return std::sqrt(diff2 / ref2);
  }
  double max_rel() const {
    if (ref_max == 0.0) return diff_max == 0.0 ? 0.0 : INFINITY;
    return diff_max / ref_max;
  }
};

// Per group, `actual` against `expected` (same layout); `only`: the parameters to compare (those that got
// a gradient: a frozen parameter has none in LibTorch while the reference differentiates everything).
std::map<std::string, GroupStats> compare_groups(const ParamSet& actual, const ParamSet& expected, Tie tie,
                                                 const std::vector<bool>* only = nullptr) {
  std::map<std::string, GroupStats> out;
  for (size_t k = 0; k < expected.items.size(); ++k) {
    GroupStats& g = out[group_of(expected.items[k].name, tie)];
    if (only && !only->at(k)) continue;
    const auto &a = actual.items.at(k).data, &e = expected.items[k].data;
    for (size_t i = 0; i < e.size(); ++i) {
      // Non-finite values: the same NaN or infinity on both sides is no difference; one side only is
      // an infinite one.
      if (!std::isfinite(a[i]) || !std::isfinite(e[i])) {
        const bool same = (std::isnan(a[i]) && std::isnan(e[i])) || a[i] == e[i];
        if (!same) g.diff2 = g.diff_max = INFINITY;
        continue;
      }
      const double d = a[i] - e[i];
      g.diff2 += d * d, g.ref2 += e[i] * e[i];
      g.diff_max = std::max(g.diff_max, std::abs(d)), g.ref_max = std::max(g.ref_max, std::abs(e[i]));
    }
  }
  return out;
}

RunRecord run_or_throw(const Case& c, CheckpointImpl* impl, const std::string& what) {
  RunRecord r = train(c, impl);
  if (!r.completed || r.steps.empty()) throw std::runtime_error(what + " failed: " + r.error);
  return r;
}

// The fp64 reference of step 0 of run `r` of Case `c`, fed that run's own masks.
ExpectedStep reference_for(const Case& c, const RunRecord& r) {
  Observations o;
  o.c = c;
  o.initial_params = make_params(c.model, c.seed);
  for (int m = 0; m < c.micro; ++m) o.data.push_back(make_case_data(c.model, c.batch, seq_of(c, m), c.seed, m));
  o.test = r;
  return expected_step(o, 0, RefScalar::fp64);
}

double loss_of(const std::vector<double>& losses) {
  double s = 0.0;
  for (double l : losses) s += l;
  return s;
}

}  // namespace

AmpAudit audit_amp(const Case& given, CheckpointImpl& impl) {
  Case base = given;
  base.steps = 1, base.resume = 0, base.gp = 0.0;                                    // step 0 against the reference
  base.inplace = false, base.inplace_on = InplaceOn::input, base.inplace_micro = 0;  // no in-place experiment
  if (base.plan.kind == PlanKind::none) base.plan = Plan{PlanKind::every_block, 0};
  check_environment(base);
  AmpAudit a;
  a.case_line = to_line(base);
  a.plan = base.plan.to_string();
  const int threads = torch::get_num_threads();
  a.threads_a = threads;
  a.threads_b = threads == 1 ? std::max(2u, std::thread::hardware_concurrency()) : 1;
  const Tie tie = base.model.tie;
  // Plot positions: one per block (one for all of them when they share their weights), then the rest.
  const int positions = tie == Tie::blocks ? 1 : base.model.layers;
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    Case c = base;
    c.precision = p;
    const std::string name(to_string(p));
    if (p == Precision::fp16 && c.device == "cpu" && !compat::kCpuFp16Autocast) {
      a.skipped.push_back(name + ": CPU fp16 autocast needs LibTorch >= 2.3 (this build has " TORCH_VERSION ")");
      continue;
    }
#if !CKV_TORCH_AT_LEAST(2, 0)
    if (p == Precision::bf16 && c.device == "cpu" && c.model.tie == Tie::head) {
      a.skipped.push_back(name + ": a tied head in bf16 on cpu needs LibTorch >= 2.0 (this build has " TORCH_VERSION
                                 ")");
      continue;
    }
#endif
    a.precisions.push_back(name);
    Case plain = c;
    plain.impl = "builtin";
    plain.plan = Plan{};
    const RunRecord none = run_or_throw(plain, nullptr, name + " without checkpointing");
    const RunRecord ckpt = train(c, &impl);
    if (!ckpt.completed || ckpt.steps.empty()) {
      a.failed.push_back(name + ": the run under test (" + c.impl + ", plan " + a.plan + ") failed: " + ckpt.error);
      continue;
    }
    torch::set_num_threads(a.threads_b);
    RunRecord other;
    try {
      other = run_or_throw(plain, nullptr, name + " without checkpointing, other thread count");
    } catch (...) {
      torch::set_num_threads(threads);
      throw;
    }
    torch::set_num_threads(threads);

    if (const std::string off = off_case_shapes(c, ckpt); !off.empty()) {
      a.failed.push_back(name + ": the run under test (" + c.impl + ", plan " + a.plan +
                         ") ran its forward at other shapes: " + off);
      continue;
    }
    const ExpectedStep ref_none = reference_for(plain, none), ref_ckpt = reference_for(c, ckpt);
    const auto err_none = compare_groups(none.steps[0].grads, ref_none.grads, tie, &none.steps[0].grad_defined);
    const auto err_ckpt = compare_groups(ckpt.steps[0].grads, ref_ckpt.grads, tie, &ckpt.steps[0].grad_defined);
    const auto drift = compare_groups(ckpt.steps[0].grads, none.steps[0].grads, tie);
    const auto floor = compare_groups(other.steps[0].grads, none.steps[0].grads, tie);
    // The design floor: the reference reentrant checkpoints' drift, where they apply.
    std::map<std::string, double> design;
    if (c.hook != Hook::none) {
      a.design_notes.push_back(name + ": no design floor (a reentrant checkpoint runs gradient hooks twice)");
    } else {
      for (const bool leaves : {false, true}) {
        faults::ReentrantVariant v;
        v.leaf_inputs = leaves;
        faults::ReentrantCheckpoint reference(v);
        const RunRecord d = train(c, &reference);
        if (!d.completed || d.steps.empty()) {
          a.design_notes.push_back(name + ": a reference reentrant run failed (" + d.error.substr(0, 120) +
                                   "); its design floor is left out");
          continue;
        }
        for (const auto& [group, e] : compare_groups(d.steps[0].grads, none.steps[0].grads, tie))
          design[group] = std::max(design[group], e.rel_l2());
      }
    }
    auto position_of = [&](const std::string& g) {
      if (g == "blocks") return 0;
      if (g.rfind("layer", 0) == 0) return std::stoi(g.substr(5));
      return g == "norm_f" ? positions : positions + 1;
    };
    for (const auto& [group, e] : err_none) {
      AmpRow r;
      r.precision = name, r.group = group, r.position = position_of(group);
      r.floor = floor.at(group).rel_l2();
      r.rel_l2 = e.rel_l2(), r.max_rel = e.max_rel();
      a.rows.push_back(r);
      r.checkpointed = true;
      r.rel_l2 = err_ckpt.at(group).rel_l2(), r.max_rel = err_ckpt.at(group).max_rel();
      r.drift = drift.at(group).rel_l2();
      r.design = design.count(group) ? design.at(group) : 0.0;
      r.allowed = amp_drift_allowance(r.floor, r.design);
      a.rows.push_back(r);
      if (!(r.drift <= r.allowed))
        a.exceeded.push_back(
            fmt::format("{} {}: checkpoint drift {:.3e} > allowed {:.3e} (noise floor {:.3e}, design "
                        "floor {:.3e})",
                        name, group, r.drift, r.allowed, r.floor, r.design));
    }
    const double l64n = loss_of(ref_none.losses), l64c = loss_of(ref_ckpt.losses);
    a.loss_error.emplace_back(name + "/none", std::abs(loss_of(none.steps[0].losses) - l64n) / std::abs(l64n));
    a.loss_error.emplace_back(name + "/checkpointed", std::abs(loss_of(ckpt.steps[0].losses) - l64c) / std::abs(l64c));
  }
  return a;
}

}  // namespace ckv
