// verifier/run/bench.cpp: see bench.hpp.
#include "verifier/run/bench.hpp"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "verifier/model/memory.hpp"
#include "verifier/run/parallel.hpp"
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

// Reduces one plan's record of `steps` steps (warmup + timed).
Measured reduce(const Case& c, RunRecord r, int warmup, int steps) {
  Measured m;
  m.bench.plan = c.plan.to_string();
  m.record = std::move(r);
  const RunRecord& rec = m.record;
  PlanBench& b = m.bench;
  b.completed = rec.completed;
  b.error = rec.error;
  if (!rec.completed || rec.memory.steps.empty() || rec.steps.size() != static_cast<size_t>(steps)) {
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
    b.step_times.push_back(step.back());
    units.resize(t.unit_forward.size());
    for (size_t u = 0; u < t.unit_forward.size() && u < units.size(); ++u) units[u].push_back(t.unit_forward[u]);
  }
  b.step_s = median(step), b.forward_s = median(fwd), b.backward_s = median(bwd), b.optimizer_s = median(upd);
  const auto [lo, hi] = std::minmax_element(step.begin(), step.end());
  b.spread = b.step_s > 0 ? (*hi - *lo) / b.step_s : 0.0;
  const double tokens = static_cast<double>(tokens_per_step(c));
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
  return reduce(c, train(c, impl, opt), warmup, c.steps);
}

double step_time(const StepTime& t) {
  return t.forward + t.backward + t.optimizer;
}

}  // namespace

std::vector<size_t> bench_round_order(size_t n, int round) {
  std::vector<size_t> order(n);
  const size_t shift = n == 0 ? 0 : static_cast<size_t>(round / 2) % n;
  for (size_t k = 0; k < n; ++k) order[k] = (k + shift) % n;
  if (round % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

namespace {
// Per-round ratios a[k] / b[k] over the timed rounds both have.
std::vector<double> paired_ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k)
    if (b[k] > 0) r.push_back(a[k] / b[k]);
  return r;
}

bool tight(const Interval& ci, double centre, double target) {
  return ci.coverage >= 0.95 && (ci.hi - ci.lo) / 2 <= target * std::max(std::abs(centre), 1e-12);
}

// Trains every Case of `cases` (one per row) step by step in turn, in bench_round_order, and reduces each
// record. Rounds past `o.repeats` timed ones go on until `tight_enough` says every interval is within the
// target (or a cap ends them).
std::vector<Measured> measure_interleaved(
    const std::vector<Case>& cases, const std::vector<std::unique_ptr<CheckpointImpl>>& impls, const BenchOptions& o,
    const std::function<bool(const std::vector<std::vector<double>>&)>& tight_enough, BenchResult& out) {
  release_free_memory();
  MemoryReporting reporting;
  std::vector<std::unique_ptr<TrainingRun>> runs;
  std::vector<std::string> errors(cases.size());
  std::vector<std::vector<StepRecord>> steps_done(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    runs.push_back(std::make_unique<TrainingRun>(cases[i], impls[i].get(), o.par));
    runs.back()->record_sites(false);
  }
  // On ranks: where each row's collectives of the timed rounds begin (the ledger is the run's own).
  std::vector<size_t> timed_collectives(cases.size(), 0);
  const int micro = cases.front().micro, max_steps = cases.front().steps;
  const size_t n = runs.size();
  using clock = std::chrono::steady_clock;
  clock::time_point timed_start = clock::now();
  int steps = 0;
  for (int s = 0; s < max_steps; ++s) {
    if (s == o.warmup) timed_start = clock::now();
    for (const size_t i : bench_round_order(n, s)) {
      if (!errors[i].empty()) continue;
      if (o.progress) o.progress(fmt::format("round {}/{}: {}", s + 1, max_steps, cases[i].plan.to_string()));
      if (s == o.warmup) timed_collectives[i] = runs[i]->collectives_issued();
      try {
        // Only the losses are kept: a step's record also holds every gradient and parameter in double,
        // which over many rounds of a large Case would not fit in memory.
        for (StepRecord& r : runs[i]->advance_to((s + 1) * micro)) {
          StepRecord kept;
          kept.losses = std::move(r.losses);
          steps_done[i].push_back(std::move(kept));
        }
      } catch (const std::exception& e) {
        if (is_out_of_memory(e))
          throw EnvironmentError(
              fmt::format("the run ran out of memory ({}): give it more memory, or bench a smaller Case",
                          std::string(e.what()).substr(0, std::string(e.what()).find('\n'))));
        // On ranks the row's peers wait in its collectives: the bench ends here (the CLI names the rank).
        if (o.par) throw std::runtime_error("plan " + cases[i].plan.to_string() + ": " + e.what());
        errors[i] = e.what();
      }
    }
    steps = s + 1;
    const int timed = steps - o.warmup;
    if (timed < o.repeats && timed < o.max_repeats) continue;
    std::vector<std::vector<double>> times(n);
    for (size_t i = 0; i < n; ++i) {
      if (!errors[i].empty()) continue;
      const RunRecord r = runs[i]->record();
      for (size_t t = static_cast<size_t>(o.warmup); t < r.times.size(); ++t) times[i].push_back(step_time(r.times[t]));
    }
    // 0: another round; 1: converged; 2: the round cap; 3: the time cap. On ranks, rank 0's timings
    // decide for every rank (each rank's own would differ, and the rounds must stay in step).
    double stop = tight_enough(times)                                                                ? 1
                  : timed >= o.max_repeats                                                           ? 2
                  : std::chrono::duration<double>(clock::now() - timed_start).count() > o.time_cap_s ? 3
                                                                                                     : 0;
    if (o.par) stop = o.par->rank0({stop}).at(0);
    if (stop == 1) {
      out.converged = true;
      out.stopped = fmt::format("every interval within +-{:.1f}% after {} timed rounds", 100.0 * o.target, timed);
      break;
    }
    if (stop == 2) {
      out.stopped = fmt::format("{} timed rounds (the most allowed) with an interval still wider than +-{:.1f}%", timed,
                                100.0 * o.target);
      break;
    }
    if (stop == 3) {
      out.stopped = fmt::format(
          "the time cap ({:.0f} s of timed rounds) after {} rounds, an interval still wider "
          "than +-{:.1f}%",
          o.time_cap_s, timed, 100.0 * o.target);
      break;
    }
  }
  out.rounds = steps - o.warmup;
  std::vector<Measured> measured;
  for (size_t i = 0; i < n; ++i) {
    const std::runtime_error err(errors[i]);
    RunRecord r = runs[i]->record(errors[i].empty() ? nullptr : &err);
    r.steps = std::move(steps_done[i]);
    measured.push_back(reduce(cases[i], std::move(r), o.warmup, steps));
    const int timed = steps - o.warmup;
    if (o.par && timed > 0) {  // on ranks a row that failed threw above
      for (const dist::CollectiveRecord& c : runs[i]->collectives(timed_collectives[i])) {
        PlanBench& b = measured.back().bench;
        PassCollectives& p = c.pass == dist::Pass::forward     ? b.forward_collectives
                             : c.pass == dist::Pass::recompute ? b.recompute_collectives
                                                               : b.backward_collectives;
        p.count += 1.0 / timed, p.kib += static_cast<double>(c.bytes) / 1024.0 / timed, p.ms += 1e3 * c.seconds / timed;
      }
    }
  }
  return measured;
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
  if (p1 == std::numeric_limits<int64_t>::max()) {
    b.budget_note = fmt::format("no batch searched: the run at batch {} did not complete", 2 * b0);
    return;
  }
  if (p1 <= p0) {
    b.budget_note = fmt::format("no batch searched: the peak does not grow from batch {} to {}", b0, 2 * b0);
    return;
  }
  const double per = static_cast<double>(p1 - p0) / b0, fixed = static_cast<double>(p0) - per * b0;
  const double fits = std::floor((static_cast<double>(budget) - fixed) / per);
  int cand = static_cast<int>(std::clamp(fits, 0.0, static_cast<double>(kMaxBatch)));
  const bool capped = fits > kMaxBatch;
  int64_t last_peak = 0;
  for (int tries = 0; tries < 4 && cand >= 1; ++tries) {
    Case k = c;
    k.batch = cand;
    if (const std::string why = validation_error(k); !why.empty()) {
      if (tries == 0 && b.budget_note.empty()) b.budget_note = "batch " + std::to_string(cand) + ": " + why;
      --cand;
      continue;
    }
    Measured m = measure(k, impl, o.warmup);
    if (m.bench.completed && m.bench.total_peak <= budget) {
      b.budget_batch = cand, b.budget_peak = m.bench.total_peak, b.budget_tokens_per_s = m.bench.tokens_per_s;
      // What stopped the batch from growing: the budget, or the largest batch the search tries (or a
      // batch the Case cannot take).
      b.budget_note = capped && cand == kMaxBatch
                          ? fmt::format("the largest batch searched ({}); the budget was not reached", kMaxBatch)
                      : b.budget_note.empty() ? "the budget"
                                              : b.budget_note + ", so smaller";
      return;
    }
    last_peak = m.bench.completed ? m.bench.total_peak : 0;
    cand = std::max(cand - std::max(1, cand / 16), 0);
  }
  auto size = [](double bytes) {
    return bytes < 1024.0 * 1024.0 ? fmt::format("{:.1f} KiB", bytes / 1024.0)
                                   : fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
  };
  b.budget_note =
      cand < 1 && last_peak == 0
          ? fmt::format("no batch fits: batch 1 needs about {} (from batches {} and {})", size(fixed + per), b0, 2 * b0)
          : fmt::format("no batch found within 4 tries (the last, peak {}, did not fit)",
                        size(static_cast<double>(last_peak)));
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
  for (const char* s : {"none", "every1", "every2", "every4", "every8", "seg1", "seg2", "seg4", "seg10", "seg20",
                        "from0", "from5", "from10", "from15"})
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

Interval median_interval(std::vector<double> v, double confidence) {
  Interval out;
  if (v.empty()) return out;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  // coverage([x_(k), x_(n+1-k)]) = 1 - 2 P(Binomial(n, 1/2) <= k - 1), k = 1, 2, ...
  std::vector<double> cdf(n + 1);
  double pmf = std::pow(0.5, static_cast<double>(n)), acc = 0.0;
  for (size_t j = 0; j <= n; ++j) {
    acc += pmf;
    cdf[j] = acc;
    pmf *= static_cast<double>(n - j) / static_cast<double>(j + 1);
  }
  size_t k = 1;
  while (k + 1 <= (n + 1) / 2 && 1.0 - 2.0 * cdf[k] >= confidence) ++k;
  out.lo = v[k - 1], out.hi = v[n - k];
  out.coverage = 1.0 - 2.0 * cdf[k - 1];
  return out;
}

BenchResult run_bench(const Case& c, const std::vector<Plan>& plans, const std::vector<BenchImpl>& bench_impls,
                      const BenchOptions& o) {
  if (o.warmup < 0 || o.repeats < 1 || o.max_repeats < o.repeats || !(o.target > 0) || !(o.time_cap_s >= 0))
    throw std::invalid_argument("bench: warmup >= 0, 1 <= repeats <= max_repeats, target > 0, time cap >= 0");
  if (bench_impls.empty()) throw std::invalid_argument("bench: no implementation");
  if (o.par && (o.growth || o.memory_budget > 0))
    throw std::invalid_argument("bench: the growth law and the memory budget are not measured on ranks");
  BenchResult out;
  Case base = c;
  base.steps = o.warmup + o.max_repeats;
  base.plan = Plan{};
  base.tpkeep = TpKeep::none;  // with tp > 1 every checkpointed row runs both ways
  out.tp = c.tp, out.dp = c.dp;
  check_environment(base);
  out.case_line = to_line(base);
  out.tokens_per_step = static_cast<int>(tokens_per_step(base));
  for (const BenchImpl& b : bench_impls) out.impls.push_back(b.label);
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };

  // Rows: none first (every row is compared with it), then every plan with every implementation, then
  // the strategies; all trained step by step in turn.
  // Under tensor parallelism the plans run again with the selective plan (tpkeep=reduced: the forward
  // all-reduces' outputs kept, only local ops recomputed), in a block of their own after them.
  struct Row {
    Plan plan;
    int impl = -1;      // index into bench_impls; -1: none or a strategy
    int strategy = -1;  // index into o.strategies
    bool kept = false;  // tpkeep=reduced
  };
  std::vector<Row> rows = {Row{}};
  for (const bool kept : {false, true}) {
    if (kept && base.tp < 2) break;
    for (const Plan& p : plans)
      if (p != Plan{})
        for (size_t k = 0; k < bench_impls.size(); ++k) rows.push_back({p, static_cast<int>(k), -1, kept});
  }
  for (size_t k = 0; k < o.strategies.size(); ++k)
    rows.push_back({Plan{PlanKind::every_block, 0}, -1, static_cast<int>(k)});
  std::vector<Case> cases;
  std::vector<std::unique_ptr<CheckpointImpl>> impls;
  for (const Row& row : rows) {
    Case k = base;
    k.plan = row.plan;
    if (row.kept) k.tpkeep = TpKeep::reduced;
    cases.push_back(k);
    impls.push_back(row.strategy >= 0 ? o.strategies[row.strategy].make()
                    : row.impl >= 0   ? bench_impls[row.impl].make()
                                      : nullptr);
  }
  // Pairs whose ratio is judged: every row against none, every implementation against the first.
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t r = 1; r < rows.size(); ++r) {
    pairs.emplace_back(r, 0);
    if (rows[r].impl > 0) pairs.emplace_back(r, r - rows[r].impl);
  }
  auto tight_enough = [&](const std::vector<std::vector<double>>& times) {
    for (const auto& [a, b] : pairs) {
      const std::vector<double> q = paired_ratios(times[a], times[b]);
      if (q.empty()) continue;  // a failed row: nothing to tighten
      if (!tight(median_interval(q), median(q), o.target)) return false;
    }
    return true;
  };
  auto any_judged = [&](const std::vector<Measured>& m) {
    for (const auto& [a, b] : pairs)
      if (!paired_ratios(m[a].bench.step_times, m[b].bench.step_times).empty()) return true;
    return pairs.empty();
  };
  std::vector<Measured> measured = measure_interleaved(cases, impls, o, tight_enough, out);
  if (!any_judged(measured)) {
    out.converged = false;
    out.stopped = fmt::format("{} rounds; no row but none completed, so no interval", out.rounds);
  }
  base.steps = o.warmup + out.rounds;  // the steps every row trained
  out.case_line = to_line(base);
  const Measured& none = measured.front();
  if (!none.bench.completed)
    throw std::runtime_error("bench: the run without checkpointing failed: " + none.bench.error);
  auto compare_with_none = [&](PlanBench& b) {
    b.saving = none.bench.total_peak > 0
                   ? 1.0 - static_cast<double>(b.total_peak) / static_cast<double>(none.bench.total_peak)
                   : 0.0;
    const std::vector<double> q = paired_ratios(b.step_times, none.bench.step_times);
    b.overhead = q.empty() ? 0.0 : median(q) - 1.0;
    b.overhead_ci = median_interval(q);
    b.overhead_ci.lo -= 1.0, b.overhead_ci.hi -= 1.0;
    for (size_t s = 0; s < b.losses.size() && s < none.bench.losses.size(); ++s) {
      const double ref = none.bench.losses[s];
      b.loss_divergence = std::max(b.loss_divergence, std::abs(b.losses[s] - ref) / std::max(std::abs(ref), 1e-12));
    }
    if (!(b.loss_divergence <= kLossTolerance))
      out.diverged.push_back(b.impl.empty() ? b.plan : b.plan + " (" + b.impl + ")");
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    PlanBench b = measured[r].bench;
    if (row.strategy >= 0) {
      b.plan = o.strategies[row.strategy].label;
      b.overhead_expected = -1;  // which units it recomputes is the strategy's choice
    } else {
      if (row.impl >= 0) b.impl = bench_impls[row.impl].label;
      if (row.kept) b.plan += " tpkeep=reduced";
      if (b.completed && row.plan != Plan{}) {
        const std::vector<bool> rec = recomputed_units(cases[r], row.plan, none.unit_forward.size());
        if (!rec.empty() && none.bench.forward_s + none.bench.backward_s > 0) {
          double t = 0.0;
          for (size_t u = 0; u < rec.size(); ++u)
            if (rec[u]) t += none.unit_forward[u];
          b.overhead_expected = t / (none.bench.forward_s + none.bench.backward_s);
        }
      }
    }
    if (b.completed) {
      if (r > 0) compare_with_none(b);
      if (o.memory_budget > 0) {
        say(fmt::format("memory budget: {}{}", b.plan, b.impl.empty() ? "" : " (" + b.impl + ")"));
        auto impl = row.strategy >= 0 ? o.strategies[row.strategy].make()
                    : row.impl >= 0   ? bench_impls[row.impl].make()
                                      : nullptr;
        Case k = cases[r];
        k.steps = o.warmup + o.repeats;
        budget_search(k, impl.get(), o.memory_budget, o, b);
      }
    }
    out.plans.push_back(std::move(b));
  }
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r].impl <= 0) continue;
    const PlanBench& a = out.plans[r];
    const PlanBench& first = out.plans[r - rows[r].impl];
    if (!a.completed || !first.completed) continue;
    ImplComparison cmp;
    cmp.plan = a.plan, cmp.impl = a.impl, cmp.against = first.impl;
    const std::vector<double> q = paired_ratios(a.step_times, first.step_times);
    cmp.ratio = q.empty() ? 1.0 : median(q);
    cmp.ci = median_interval(q);
    out.comparisons.push_back(cmp);
  }

  const size_t total = o.growth ? 2 * o.growth_layers.size() : 0;
  size_t done = 0;
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
        auto impl = k.plan == Plan{} ? nullptr : bench_impls.front().make();
        Measured m = measure(k, impl.get(), 0);
        if (!m.bench.completed) {
          if (k.plan == Plan{})
            throw std::runtime_error(
                fmt::format("bench growth: L={} without checkpointing failed: {}", layers, m.bench.error));
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
