// verifier/run/bench.cpp: see bench.hpp.
#include "verifier/run/bench.hpp"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "verifier/run/memory.hpp"
#include "verifier/run/run.hpp"

namespace ckv {
namespace {

// Gives the memory malloc kept from finished runs back to the system (`ckverify bench` lets malloc
// keep what it frees during a run, and check_environment compares the next Case with what is free).
void release_free_memory() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

std::string validation_error(const Case& c) {
  try {
    validate(c);
    return "";
  } catch (const CaseError& e) {
    return e.what();
  }
}

Plan plan_of(const std::string& s) {
  Plan p;
  std::string error;
  if (!Plan::parse(s, p, error)) throw std::logic_error("bench: bad built-in plan " + s + ": " + error);
  return p;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Measured {
  RunRecord record;
  PlanBench bench;
  std::vector<double> unit_forward;  // medians per unit
};

// Reduces one plan's record (steps = warmup + repeats).
Measured reduce(const Case& c, RunRecord r, int warmup) {
  Measured m;
  m.bench.plan = c.plan.to_string();
  m.record = std::move(r);
  const RunRecord& rec = m.record;
  PlanBench& b = m.bench;
  b.completed = rec.completed;
  b.error = rec.error;
  if (!rec.completed || rec.memory.steps.empty() || rec.steps.size() != static_cast<size_t>(c.steps)) {
    if (b.error.empty()) b.error = "the run recorded " + std::to_string(rec.steps.size()) + " of its steps";
    b.completed = false;
    return m;
  }
  const size_t first = std::min(static_cast<size_t>(warmup), rec.memory.steps.size() - 1);
  const StepMemory& s = rec.memory.steps.at(first);
  b.params = rec.memory.params, b.grads = rec.memory.grads, b.optimizer = rec.memory.optimizer;
  b.forward_kept = s.after_forward - s.before;
  b.step_peak = s.peak - s.before;
  b.total_peak = b.params + b.optimizer + s.peak;
  std::vector<double> step, fwd, bwd, upd;
  std::vector<std::vector<double>> units;
  for (size_t k = first; k < rec.times.size(); ++k) {
    const StepTime& t = rec.times[k];
    fwd.push_back(t.forward), bwd.push_back(t.backward), upd.push_back(t.optimizer);
    step.push_back(t.forward + t.backward + t.optimizer);
    units.resize(t.unit_forward.size());
    for (size_t u = 0; u < t.unit_forward.size() && u < units.size(); ++u) units[u].push_back(t.unit_forward[u]);
  }
  b.step_s = median(step), b.forward_s = median(fwd), b.backward_s = median(bwd), b.optimizer_s = median(upd);
  const auto [lo, hi] = std::minmax_element(step.begin(), step.end());
  b.spread = b.step_s > 0 ? (*hi - *lo) / b.step_s : 0.0;
  const double tokens = static_cast<double>(c.batch) * c.seq * c.micro;
  b.tokens_per_s = b.step_s > 0 ? tokens / b.step_s : 0.0;
  for (const auto& st : rec.steps) {
    double l = 0.0;
    for (double x : st.losses) l += x;
    b.losses.push_back(l);
  }
  for (const auto& u : units) m.unit_forward.push_back(median(u));
  return m;
}

// Trains `c` (its plan, steps = warmup + repeats) on its own and reduces the record.
Measured measure(const Case& c, CheckpointImpl* impl, int warmup) {
  TrainOptions opt;
  opt.record_sites = false;
  release_free_memory();
  return reduce(c, train(c, impl, opt), warmup);
}

// Trains every Case of `cases` (one per plan) step by step in turn, so that a machine whose speed
// drifts during the benchmark (shared, throttled) slows every plan alike, and reduces each record.
std::vector<Measured> measure_interleaved(const std::vector<Case>& cases,
                                          const std::vector<std::unique_ptr<CheckpointImpl>>& impls, int warmup,
                                          const std::function<void(const std::string&)>& say) {
  release_free_memory();
  MemoryReporting reporting;
  std::vector<std::unique_ptr<TrainingRun>> runs;
  std::vector<std::string> errors(cases.size());
  std::vector<std::vector<StepRecord>> steps_done(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    runs.push_back(std::make_unique<TrainingRun>(cases[i], impls[i].get()));
    runs.back()->record_sites(false);
  }
  const int steps = cases.front().steps, micro = cases.front().micro;
  for (int s = 0; s < steps; ++s)
    for (size_t i = 0; i < runs.size(); ++i) {
      if (!errors[i].empty()) continue;
      if (say) say(fmt::format("step {}/{}: {}", s + 1, steps, cases[i].plan.to_string()));
      try {
        for (StepRecord& r : runs[i]->advance_to((s + 1) * micro)) steps_done[i].push_back(std::move(r));
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
  std::vector<Measured> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::runtime_error err(errors[i]);
    RunRecord r = runs[i]->record(errors[i].empty() ? nullptr : &err);
    r.steps = std::move(steps_done[i]);
    out.push_back(reduce(cases[i], std::move(r), warmup));
  }
  return out;
}

// Units in checkpointed segments (those the backward recomputes), by forward index; empty when the
// plan cuts the stack into other units than `reference` has.
std::vector<bool> recomputed_units(const Case& c, const Plan& p, size_t reference_units) {
  const auto segs = p.segments(c.model.layers, c.model.attention, c.model.tie == Tie::head);
  std::vector<bool> out;
  for (const auto& s : segs)
    for (size_t k = 0; k < s.units.size(); ++k) out.push_back(s.checkpointed);
  if (out.size() != reference_units) out.clear();
  return out;
}

// The largest batch (<= kMaxBatch) whose total peak fits `budget`, measured: peak is affine in the batch
// (activations scale with it, parameters and optimizer state do not), so two runs give the line and the
// candidate is then confirmed (or stepped down) by running it.
void budget_search(const Case& c, CheckpointImpl* impl, int64_t budget, const BenchOptions& o, PlanBench& b) {
  constexpr int kMaxBatch = 1024;
  auto peak_at = [&](int batch) {
    Case k = c;
    k.batch = batch;
    k.steps = 1;
    Measured m = measure(k, impl, 0);
    return m.bench.completed ? m.bench.total_peak : std::numeric_limits<int64_t>::max();
  };
  const int b0 = c.batch;
  const int64_t p0 = b.total_peak, p1 = peak_at(2 * b0);
  if (p1 == std::numeric_limits<int64_t>::max() || p1 <= p0) return;
  const double per = static_cast<double>(p1 - p0) / b0, fixed = static_cast<double>(p0) - per * b0;
  int cand = static_cast<int>(std::floor((static_cast<double>(budget) - fixed) / per));
  cand = std::min(cand, kMaxBatch);
  for (int tries = 0; tries < 4 && cand >= 1; ++tries) {
    Case k = c;
    k.batch = cand;
    if (!validation_error(k).empty()) {
      --cand;
      continue;
    }
    Measured m = measure(k, impl, o.warmup);
    if (m.bench.completed && m.bench.total_peak <= budget) {
      b.budget_batch = cand, b.budget_peak = m.bench.total_peak, b.budget_tokens_per_s = m.bench.tokens_per_s;
      return;
    }
    cand = std::max(cand - std::max(1, cand / 16), 0);
  }
}

}  // namespace

Case seed_lab_case(const std::string& device) {
  const bool cuda = device.rfind("cuda", 0) == 0;
  const int d = cuda ? 2048 : 256, seq = cuda ? 2048 : 1024;
  return case_from_line(fmt::format(
      "layers=20 d={} heads=1 ffn=4 vocab=16 norm=layernorm pos=pre attn=off act=relu loss=mse drop=0 batch=2 "
      "seq={} steps=6 lr=0.01 prec=fp32 device={} plan=none impl=builtin seed=1",
      d, seq, device));
}

std::vector<Plan> seed_lab_plans() {
  std::vector<Plan> out;
  for (const char* s : {"none", "every1", "every2", "every4", "every8", "seg1", "seg2", "seg4", "seg10", "seg20", "from0",
                        "from5", "from10", "from15"})
    out.push_back(plan_of(s));
  return out;
}

std::vector<Plan> default_bench_plans(const Case& c) {
  std::vector<Plan> out;
  for (const char* s : {"none", "block", "every2", "sqrt", "seg2"}) {
    const Plan p = plan_of(s);
    if (p.invalid_for(c.model.layers).empty() &&
        std::none_of(out.begin(), out.end(), [&](const Plan& q) { return q == p; }))
      out.push_back(p);
  }
  return out;
}

GrowthFit fit_growth(const std::vector<std::pair<double, double>>& points) {
  // For each k on a grid, c and a by linear least squares on (L^k, y); keep the k with the smallest
  // squared residual. The constant c is what every depth pays (the input, the head, the loss, backward's
  // temporaries); a plain log-log slope would fold it into the exponent.
  GrowthFit best;
  double best_res = std::numeric_limits<double>::infinity();
  const double n = static_cast<double>(points.size());
  if (points.size() < 3) return best;
  for (int i = 1; i <= 300; ++i) {
    const double k = i / 100.0;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [L, y] : points) {
      const double x = std::pow(L, k);
      sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    const double den = n * sxx - sx * sx;
    if (den == 0.0) continue;
    const double a = (n * sxy - sx * sy) / den, c = (sy - a * sx) / n;
    double res = 0;
    for (const auto& [L, y] : points) res += std::pow(y - c - a * std::pow(L, k), 2);
    if (a > 0 && res < best_res) best_res = res, best = {k, c, a};
  }
  return best;
}

BenchResult run_bench(const Case& c, const std::vector<Plan>& plans,
                      const std::function<std::unique_ptr<CheckpointImpl>()>& make_impl, const BenchOptions& o) {
  if (o.warmup < 0 || o.repeats < 1) throw std::invalid_argument("bench: warmup >= 0 and repeats >= 1");
  BenchResult out;
  Case base = c;
  base.steps = o.warmup + o.repeats;
  base.plan = Plan{};
  check_environment(base);
  out.case_line = to_line(base);
  out.tokens_per_step = base.batch * base.seq * base.micro;
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };

  // Every plan (none first: every plan is compared with it) trained step by step in turn.
  std::vector<Case> cases;
  std::vector<std::unique_ptr<CheckpointImpl>> impls;
  std::vector<Plan> order = {Plan{}};
  for (const Plan& p : plans)
    if (p != Plan{}) order.push_back(p);
  for (const Plan& p : order) {
    Case k = base;
    k.plan = p;
    cases.push_back(k);
    impls.push_back(p == Plan{} ? nullptr : make_impl());
  }
  for (const auto& s : o.strategies) {
    Case k = base;
    k.plan = Plan{PlanKind::every_block, 0};
    cases.push_back(k);
    impls.push_back(s.make());
  }
  const size_t total = o.growth ? 2 * o.growth_layers.size() : 0;
  size_t done = 0;
  std::vector<Measured> measured = measure_interleaved(cases, impls, o.warmup, o.progress);
  const Measured& none = measured.front();
  if (!none.bench.completed) throw std::runtime_error("bench: the run without checkpointing failed: " + none.bench.error);
  auto compare_with_none = [&](PlanBench& b) {
    b.saving = none.bench.total_peak > 0
                   ? 1.0 - static_cast<double>(b.total_peak) / static_cast<double>(none.bench.total_peak)
                   : 0.0;
    b.overhead = none.bench.step_s > 0 ? b.step_s / none.bench.step_s - 1.0 : 0.0;
    for (size_t s = 0; s < b.losses.size() && s < none.bench.losses.size(); ++s) {
      const double ref = none.bench.losses[s];
      b.loss_divergence = std::max(b.loss_divergence, std::abs(b.losses[s] - ref) / std::max(std::abs(ref), 1e-12));
    }
    if (!(b.loss_divergence <= kLossTolerance)) out.diverged.push_back(b.plan);
  };
  for (const Plan& p : plans) {
    size_t idx = 0;
    while (!(order[idx] == p)) ++idx;
    PlanBench b = measured[idx].bench;
    if (b.completed && p != Plan{}) {
      const std::vector<bool> rec = recomputed_units(cases[idx], p, none.unit_forward.size());
      if (!rec.empty() && none.bench.forward_s + none.bench.backward_s > 0) {
        double t = 0.0;
        for (size_t u = 0; u < rec.size(); ++u)
          if (rec[u]) t += none.unit_forward[u];
        b.overhead_bound = t / (none.bench.forward_s + none.bench.backward_s);
      }
    }
    if (b.completed) {
      compare_with_none(b);
      if (o.memory_budget > 0) {
        if (o.progress) say(fmt::format("memory budget: {}", b.plan));
        auto impl = p == Plan{} ? nullptr : make_impl();
        budget_search(cases[idx], impl.get(), o.memory_budget, o, b);
      }
    }
    out.plans.push_back(std::move(b));
  }
  for (size_t i = 0; i < o.strategies.size(); ++i) {
    PlanBench b = measured[order.size() + i].bench;
    b.plan = o.strategies[i].label;
    b.overhead_bound = -1;  // which units it recomputes is the strategy's choice
    if (b.completed) {
      compare_with_none(b);
      if (o.memory_budget > 0) {
        say(fmt::format("memory budget: {}", b.plan));
        auto impl = o.strategies[i].make();
        Case k = cases[order.size() + i];
        budget_search(k, impl.get(), o.memory_budget, o, b);
      }
    }
    out.plans.push_back(std::move(b));
  }

  if (o.growth) {
    std::vector<std::pair<double, double>> pn, ps;
    for (int layers : o.growth_layers) {
      GrowthPoint g;
      g.layers = layers;
      Case k = base;
      k.model.layers = layers;
      k.steps = 1;
      k.freeze = Freeze::blocks;
      k.model.tie = Tie::none;
      bool stop = false;
      for (const char* plan : {"none", "sqrt"}) {
        say(fmt::format("[{}/{}] growth L={} {}", ++done, total, layers, plan));
        k.plan = plan_of(plan);
        if (const std::string invalid = validation_error(k); !invalid.empty()) {
          out.growth_stopped = fmt::format("L={}: {}", layers, invalid);
          stop = true;
          break;
        }
        try {
          check_environment(k);
        } catch (const EnvironmentError& e) {
          out.growth_stopped = fmt::format("L={}: {}", layers, e.what());
          stop = true;
          break;
        }
        auto impl = k.plan == Plan{} ? nullptr : make_impl();
        Measured m = measure(k, impl.get(), 0);
        if (!m.bench.completed) {
          if (k.plan == Plan{})
            throw std::runtime_error(fmt::format("bench growth: L={} without checkpointing failed: {}", layers, m.bench.error));
          out.growth_failed = fmt::format("L={} plan {}: {}", layers, plan, m.bench.error);
          stop = true;
          break;
        }
        (k.plan == Plan{} ? g.none : g.sqrt) = m.bench.step_peak;
      }
      if (stop) break;
      pn.emplace_back(layers, static_cast<double>(g.none));
      ps.emplace_back(layers, static_cast<double>(g.sqrt));
      out.growth.push_back(g);
    }
    out.fit_none = fit_growth(pn);
    out.fit_sqrt = fit_growth(ps);
  }
  release_free_memory();
  return out;
}

}  // namespace ckv
