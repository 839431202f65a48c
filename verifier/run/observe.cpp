// verifier/run/observe.cpp: observe(), everything one Case yields for the properties (run.hpp): the
// run under test and the baseline in lockstep, the experiments, the resume run, the reference design's
// floor and the fp64 reference; and the plan a strategy made.
#include "properties/tolerance.hpp"
#include "verifier/impls/faults/reentrant.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/trainer.hpp"

#include <sstream>

#include "verifier/model/shard.hpp"

namespace ckv {
using namespace run_detail;
namespace {
// How long a rank whose run under test failed waits for the others to agree on it (RankRunFailed).
constexpr std::chrono::milliseconds kFailedRankWait{5000};
// What the strategy made of the block stack, read off what the run under test recomputed.
void apply_effective_plan(Observations& o) {
  o.strategy = true;
  const size_t S = o.segments.size();
  std::vector<bool> recomputed(S, false);
  for (const auto& r : o.test.segment_calls)
    if (r.phase > 0 && r.segment >= 0 && static_cast<size_t>(r.segment) < S)
      recomputed[static_cast<size_t>(r.segment)] = true;
  for (size_t s = 0; s < S; ++s) o.segments[s].checkpointed = recomputed[s];
  // Which blocks each (step, micro-batch) recomputed: a strategy may change its plan as it goes.
  std::map<std::pair<int, int>, std::set<int>> per_call;
  for (const auto& r : o.test.segment_calls)
    if (r.phase > 0) per_call[{r.step, r.micro}].insert(r.segment);
  for (int step = 0; step < o.c.steps && !o.strategy_plan_varies; ++step)
    for (int m = 0; m < o.c.micro; ++m)
      if (per_call[{step, m}] != per_call[{0, 0}]) o.strategy_plan_varies = true;
  // The checkpoints it made in step 0, micro-batch 0 (the one the experiments replay).
  int previous = -2;
  for (const auto& r : o.test.segment_calls) {
    if (r.step != 0 || r.phase != 1 || r.micro != 0) continue;
    if (o.strategy_groups.empty() || r.segment != previous + 1)
      o.strategy_groups.push_back({r.segment, r.segment});
    else
      o.strategy_groups.back().second = r.segment;
    previous = r.segment;
  }
  std::sort(o.strategy_groups.begin(), o.strategy_groups.end());
}

// The last checkpointed segment through which gradient flows (recomputed first in backward), or -1.
// Under a strategy: the first block of the last checkpoint it made in step 0, micro-batch 0 (what the
// experiments replay), so that the in-place change reaches a checkpoint's own input, not a tensor
// inside it.
int experiment_segment(const Observations& o) {
  if (o.strategy) {
    for (auto g = o.strategy_groups.rbegin(); g != o.strategy_groups.rend(); ++g)
      if (g->first >= 0 && static_cast<size_t>(g->first) < o.grad_flows.size() &&
          o.grad_flows[static_cast<size_t>(g->second)])
        return g->first;
    return -1;
  }
  for (size_t s = o.segments.size(); s-- > 0;)
    if (o.segments[s].checkpointed && o.grad_flows[s]) return static_cast<int>(s);
  return -1;
}

// Whether every gradient and x.grad of the run under test is within the tightest fixed bound
// grad-baseline applies (reorder_tolerance of the step's largest gradient): then the measured floor
// cannot change the verdict, and the reference design is not run (a correct implementation pays for it
// only on ill-conditioned steps).
bool within_fixed_bound(const Observations& o) {
  const int paths = o.c.gp > 0.0 ? 2 : 1;
  auto within = [](const std::vector<double>& t, const std::vector<double>& b, double atol) {
    if (t.size() != b.size()) return true;  // judged by grad-baseline itself (defined vs undefined)
    for (size_t i = 0; i < t.size(); ++i)
      if (!(std::abs(t[i] - b[i]) <= atol) && !(t[i] == b[i])) return false;
    return true;
  };
  for (size_t s = 0; s < o.test.steps.size() && s < o.baseline.steps.size(); ++s) {
    const StepRecord &t = o.test.steps[s], &b = o.baseline.steps[s];
    const double atol = reorder_tolerance(o.c.precision, paths, step_gradient_scale(b)).atol;
    for (size_t k = 0; k < b.grads.items.size() && k < t.grads.items.size(); ++k)
      if (b.grad_defined[k] && t.grad_defined[k] && !within(t.grads.items[k].data, b.grads.items[k].data, atol))
        return false;
    for (size_t m = 0; m < b.dx.size() && m < t.dx.size(); ++m)
      if (!within(t.dx[m], b.dx[m], atol)) return false;
  }
  return true;
}

// Observations::design: the reference reentrant checkpoint in lockstep with the run under test's
// parameters, on Cases where its gradients can be judged against the baseline's.
void run_design_floor(Observations& o, const GlobalStateCheck& entry, const ParallelRun* par) {
  const Case& c = o.c;
  if (o.test.steps.empty()) {
    o.design_why_not = "the run under test completed no step";
  } else if (within_fixed_bound(o)) {
    o.design_why_not = "every gradient of the run under test is within the fixed rounding bound";
  } else if (c.hook != Hook::none) {
    o.design_why_not =
        "a reentrant checkpoint runs gradient hooks once per nested backward (hook=" + std::string(to_string(c.hook)) +
        ")";
  } else if (o.strategy) {
    o.design_why_not = "a strategy chose what to checkpoint";
  }
  if (!o.design_why_not.empty()) return;
  try {
    const RestoreGlobalState restore{entry};
    // A reentrant design can cost far more than the run under test (nested backwards through shared
    // parameters under a gradient penalty): it stops between steps past a budget, and the fixed bound
    // alone judges, so that the floor never turns a Case into a per-case timeout.
    double test_s = 0.0;
    for (const StepTime& t : o.test.times) test_s += t.forward + t.backward + t.optimizer;
    const double budget_s = std::max(5.0, 4.0 * test_s);
    // One design in lockstep into `out`; "" when it ran to the end, else why it stopped.
    auto run_design = [&](faults::ReentrantVariant variant, RunRecord& out) -> std::string {
      const auto start = std::chrono::steady_clock::now();
      faults::ReentrantCheckpoint reentrant(variant);
      Trainer d(c, o, &reentrant, Mode::normal, -1, par);
      for (size_t s = 0; s < o.test.steps.size(); ++s) {
        // On ranks every step ends in an agreement: a step that raised on one rank stops the design on all.
        std::string failed;
        try {
          out.steps.push_back(d.step(static_cast<int>(s)));
        } catch (const std::exception& e) {
          if (!par) throw;
          failed = first_line(e.what());
        }
        if (par && !par->all(failed.empty())) {
          for (const std::string& f : par->strings(failed))
            if (!f.empty()) throw std::runtime_error(f);
        }
        d.load(o.test.steps[s]);  // gathered on ranks: load() keeps this rank's slice
        const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (s + 1 < o.test.steps.size() && (par ? par->any(spent > budget_s) : spent > budget_s)) {
          out = RunRecord{};
          return fmt::format("the reference reentrant run took {:.1f} s, past its budget of {:.1f} s", spent, budget_s);
        }
      }
      d.finish(out, nullptr);
      if (par) par->gather(out);
      return "";
    };
    o.design_why_not = run_design({}, o.design);
    if (!o.design_why_not.empty()) return;
    o.design_ran = true;
    if (c.precision != Precision::fp32 && c.gp == 0.0) {
      faults::ReentrantVariant leaf;
      leaf.leaf_inputs = true;  // correct without a gradient penalty (it loses the second-order term)
      try {
        const RestoreGlobalState restore_leaf{entry};
        o.design_leaf_ran = run_design(leaf, o.design_leaf).empty();
      } catch (const std::exception&) {
        o.design_leaf = RunRecord{};  // the first design's floor alone
      }
    }
  } catch (const std::exception& e) {
    o.design = RunRecord{};
    o.design_why_not = "the reference reentrant run failed: " + first_line(e.what());
  }
}
// On ranks (parallel.hpp), after the lockstep runs: what only the ranks' own records show (the masks
// each rank drew, the replicated parameters on every rank, each run's collectives), then the records
// gathered into the unsharded model's.
void observe_ranks(Observations& o, const ParallelRun& par, const Trainer& base, const Trainer& test) {
  ParallelRecord& r = o.parallel;
  r.ran = true, r.ranks = par.size();
  const bool completed = par.all(o.test.completed);
  if (!completed) {
    r.why_not = "the run under test did not complete on every rank";
  } else if (!par.same_calls(o.test)) {
    r.why_not = "the ranks' runs under test drew dropout masks at other calls or shapes";
  } else {
    // Each tensor-parallel group and each shard's replicas judge their own; every rank gets every line.
    std::vector<std::string> mine;
    if (const dist::Group* tp = par.tp_group())
      mine = parallel_consistency(*tp, o.test.sites, o.c.dropout, test.model());
    if (const dist::Group* dp = par.dp_group())
      for (std::string& line : replica_consistency(*dp, test.model())) mine.push_back(std::move(line));
    std::string joined;
    for (const std::string& v : mine) joined += (joined.empty() ? "" : "\n") + v;
    const std::vector<std::string> all = par.strings(joined);
    std::set<std::string> seen;  // the ranks of one group report the same lines
    for (size_t k = 0; k < all.size(); ++k) {
      std::istringstream lines(all[k]);
      for (std::string line; std::getline(lines, line);)
        if (!line.empty() && seen.insert(line).second) r.consistency.push_back(line);
    }
    r.judged = true;
  }
  if (completed) {
    const std::vector<std::string> mine = dist::ledger_violations(base.collectives(), test.collectives());
    std::string joined;
    for (const std::string& v : mine) joined += (joined.empty() ? "" : "\n") + v;
    const std::vector<std::string> all = par.strings(joined);
    for (size_t k = 0; k < all.size(); ++k) {
      std::istringstream lines(all[k]);
      for (std::string line; std::getline(lines, line);)
        if (!line.empty()) r.ledger.push_back("rank " + std::to_string(k) + ": " + line);
    }
    r.ledger_judged = true;
  }
  for (const dist::CollectiveRecord& rec : test.collectives())
    ++(rec.pass == dist::Pass::forward ? r.forward : rec.pass == dist::Pass::recompute ? r.recompute : r.backward);
  par.gather(o.baseline);
  r.masks_gathered = par.gather(o.test);
}

// What an experiment that ran on every rank found, as rank 0 found it, on every rank (the decisions
// after it read it alike); `ran` only where it ran on every rank.
void agree_on_rank0(const ParallelRun& par, ThrowExperiment& e) {
  const bool ran = par.all(e.ran);
  const std::vector<double> flags =
      par.rank0({static_cast<double>(e.segment), e.forward_failed ? 1.0 : 0.0, e.recomputed ? 1.0 : 0.0,
                 e.threw ? 1.0 : 0.0, e.planted_message_seen ? 1.0 : 0.0});
  const std::vector<std::string> messages = par.strings(e.ran ? e.message : e.why_not);
  e.segment = static_cast<int>(flags[0]);
  e.forward_failed = flags[1] != 0.0, e.recomputed = flags[2] != 0.0, e.threw = flags[3] != 0.0;
  e.planted_message_seen = flags[4] != 0.0;
  if (!ran && e.ran) {
    e.ran = false;
    for (size_t k = 0; k < messages.size(); ++k)
      if (!messages[k].empty()) {
        e.why_not = "on rank " + std::to_string(k) + ": " + messages[k];
        break;
      }
  } else if (ran) {
    e.message = messages[0];
  }
}
}  // namespace

namespace {
BaselineProgress baseline_progress = nullptr;
}  // namespace
void set_baseline_progress(BaselineProgress f) {
  baseline_progress = f;
}
BaselineProgress get_baseline_progress() {
  return baseline_progress;
}

Observations observe(const Case& c, CheckpointImpl& impl, const ParallelRun* par, ReferenceUse reference) {
  if ((c.ranks() > 1) != (par != nullptr))
    throw std::logic_error(c.ranks() > 1 ? "observe: a Case with tp or dp > 1 runs as ranks (run_rank_case)"
                                         : "observe: ranks for a Case with tp=dp=1");
  check_environment(c);
  if (impl.is_strategy()) check_strategy_case(c);
  Observations o = prepare(c);
  // The two runs advance in lockstep, and the baseline takes each step from the parameters the run
  // under test reached: every step is then compared on its own, even after a tolerated difference
  // (a shared parameter's gradient summed in another order) has moved the parameters apart.
  const GlobalStateCheck entry;
  // The run under test keeps the experiments' target segment's first arguments for the throw experiment
  // (a strategy's target is known only once it has run).
  Trainer base(c, o, nullptr, Mode::normal, -1, par),
      test(c, o, &impl, Mode::normal, impl.is_strategy() ? -1 : experiment_segment(o), par);
  // The baseline's masks, ReLU sides and noise tell only whether the run under test reproduced it, where
  // the reference could be evaluated (fp32 without a penalty): no property reads them.
  base.record_sites(c.precision == Precision::fp32 && c.gp == 0.0);
  const std::exception* test_error = nullptr;
  std::unique_ptr<TracedError> saved;  // the test run's exception, its traceback taken while it is there
  std::optional<MemoryReporting> reporting(std::in_place);  // the two runs' memory (memory-saved)
  double baseline_s = 0.0;
  double test_failed_at = 0.0;                                // steady_clock seconds (RankRunFailed)
  if (baseline_progress) baseline_progress(0, c.steps, 0.0);  // set up: the runs start
  for (int s = 0; s < c.steps && !test_error; ++s) {
    try {
      const auto start = std::chrono::steady_clock::now();
      o.baseline.steps.push_back(base.step(s));
      baseline_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (baseline_progress) baseline_progress(s + 1, c.steps, baseline_s);
    } catch (const std::exception& e) {
      const std::string msg = first_line(e.what());
      if (is_out_of_memory(e)) throw EnvironmentError("the baseline run ran out of memory: " + msg);
      throw std::runtime_error("the baseline run (no checkpointing) failed: " + msg);
    }
    try {
      o.test.steps.push_back(test.step(s));
    } catch (const std::exception& e) {
      if (is_out_of_memory(e))
        throw EnvironmentError("the run under test ran out of memory (" + first_line(e.what()) +
                               ") where the baseline did not: give the run more memory (memory-saved judges how "
                               "much a checkpoint keeps on Cases that fit)");
      saved = std::make_unique<TracedError>(e.what(), exception_trace(e));
      test_failed_at = steady_seconds();
      entry.restore();
      test_error = saved.get();
    }
    // On ranks: the run under test stops on every rank where it failed on one (the others would wait
    // for it in the next collective); the failure is gathered with the records. Where it failed inside a
    // collective on some ranks only, the others wait in that collective instead, and the agreement fails.
    if (par) {
      bool all_completed = false;
      try {
        // A rank whose run failed waits a short while: ranks that failed alike arrive at once, and one
        // still running waits in a collective of the step for this rank, which never comes.
        all_completed = par->all(test_error == nullptr, test_error ? std::optional(kFailedRankWait) : std::nullopt);
      } catch (const std::exception&) {
        if (test_error) throw RankRunFailed(first_line(test_error->what()), test_failed_at);
        throw;
      }
      if (!all_completed && !test_error) {
        saved = std::make_unique<TracedError>("stopped: another rank's run under test failed", "");
        test_error = saved.get();
      }
    }
    if (test_error) break;
    const StepRecord &t = o.test.steps.back(), &b = o.baseline.steps.back();
    if (t.params_after.items != b.params_after.items || t.ledger.batchnorm.items != b.ledger.batchnorm.items ||
        t.optimizer.items != b.optimizer.items)
      base.load(t, /*shard_record=*/par != nullptr);
  }
  reporting.reset();
  base.finish(o.baseline, nullptr);
  test.finish(o.test, test_error);
  if (par) observe_ranks(o, *par, base, test);
  if (impl.is_strategy()) apply_effective_plan(o);
  run_design_floor(o, entry, par);

  const int target = experiment_segment(o);
  if (target < 0) {
    o.throw_exp.why_not = o.inplace_exp.why_not =
        o.strategy ? "the strategy checkpointed no block with gradient flowing through it in step 0, micro-batch 0"
                   : "no checkpointed segment has gradient flowing through it";
  } else {
    // An experiment whose forward raised: out of memory is the environment's; otherwise it did not run,
    // which is a finding where the run under test completed that same forward (not under a strategy,
    // which may choose differently on a second run).
    auto forward_failed = [&](auto& experiment, const std::exception& e) {
      if (is_out_of_memory(e)) throw EnvironmentError("the experiments ran out of memory: " + first_line(e.what()));
      experiment.why_not = "its forward failed: " + first_line(e.what());
      experiment.forward_failed = o.test.completed && !o.strategy;
    };
    // Runs the experiment of `mode` into `experiment` (the Trainer's result that `result` picks).
    auto run_experiment = [&](Mode mode, auto result, auto& experiment) {
      try {
        const RestoreGlobalState restore{entry};
        Trainer t(c, o, &impl, mode, target, par);
        t.experiment();
        experiment = result(t);
        experiment.ran = true, experiment.segment = target;
      } catch (const std::exception& e) {
        forward_failed(experiment, e);
      }
    };
    const bool kept = o.test.completed && test.kept_target_args();
    if (par ? par->all(kept) : kept) {
      try {
        const RestoreGlobalState restore{entry};
        test.throw_experiment();
        o.throw_exp = test.throw_result;
        o.throw_exp.ran = true, o.throw_exp.segment = target;
      } catch (const std::exception& e) {
        forward_failed(o.throw_exp, e);
      }
    } else {
      run_experiment(
          Mode::throw_in_recompute, [](const Trainer& t) { return t.throw_result; }, o.throw_exp);
    }
    if (par) agree_on_rank0(*par, o.throw_exp);
    if (c.inplace) {
      run_experiment(
          Mode::inplace_input, [](const Trainer& t) { return t.inplace_result; }, o.inplace_exp);
      const bool param = c.inplace_on == InplaceOn::param;
      if (o.inplace_exp.ran && !o.inplace_exp.threw) {
        // Backward went through: correct only if the implementation recomputed from its own copy of the
        // input, i.e. its gradients are those of the forward it ran (the input left alone). Parameters
        // edited between micro-batches: those of plain autograd with the same edit.
        try {
          const RestoreGlobalState restore{entry};
          Trainer r(c, o, param ? nullptr : &impl, param ? Mode::inplace_input : Mode::inplace_reference, target);
          r.experiment();
          o.inplace_exp.reference_ran = !r.inplace_result.threw;
          o.inplace_exp.reference_error = r.inplace_result.message;
          o.inplace_exp.expected_grads = std::move(r.inplace_result.grads);
          o.inplace_exp.expected_grad_defined = std::move(r.inplace_result.grad_defined);
          o.inplace_exp.expected_dx = std::move(r.inplace_result.dx);
        } catch (const std::exception& e) {
          o.inplace_exp.reference_ran = false;
          o.inplace_exp.reference_error = "its forward failed: " + first_line(e.what());
        }
      }
      if (param && o.inplace_exp.ran) {
        // The same micro-batches without the edit, plainly and through the implementation (which tells
        // whether the edit explains what the implementation did: a raise or other gradients).
        auto unedited = [&](CheckpointImpl* which) {
          ExperimentGradients g;
          try {
            const RestoreGlobalState restore{entry};
            Trainer u(c, o, which, Mode::inplace_reference, target);
            u.experiment();
            g.ran = !u.inplace_result.threw, g.error = u.inplace_result.message;
            g.grads = std::move(u.inplace_result.grads);
            g.grad_defined = std::move(u.inplace_result.grad_defined);
            g.dx = std::move(u.inplace_result.dx);
          } catch (const std::exception& e) {
            if (is_out_of_memory(e))
              throw EnvironmentError("the experiments ran out of memory: " + first_line(e.what()));
            g.error = "its forward failed: " + first_line(e.what());
          }
          return g;
        };
        o.inplace_exp.plain_unedited = unedited(nullptr), o.inplace_exp.impl_unedited = unedited(&impl);
      }
    } else {
      o.inplace_exp.why_not = "the case does not ask for it (inplace=false)";
    }
  }

  if (c.resume == 0) {
    o.resume_exp.why_not = "the case does not ask for it (resume=0)";
  } else if (!o.test.completed) {
    o.resume_exp.why_not = "the run under test did not complete";
  } else {
    const ImplInfo* info = find_impl(c.impl);
    const StateFault fault = info ? info->state_fault : StateFault::none;
    o.resume_exp.ran = true;
    o.resume_exp.position = c.resume;
    try {
      const RestoreGlobalState restore{entry};
      // The state goes through the file format (encoded, verified, decoded) in memory: no file I/O per
      // case; cli_tests carries it through real files and separate processes.
      std::string bytes;
      {
        Trainer first(c, o, &impl, Mode::normal, -1, par);
        first.advance_to(first.local_position(c.resume));
        bytes = encode_state(first.save_state(fault));
      }
      Trainer second(c, o, &impl, Mode::normal, -1, par);
      second.load_state(decode_state(bytes, c));
      o.resume_exp.steps = second.advance_to(second.local_position(c.steps * c.micro));
    } catch (const std::exception& e) {
      o.resume_exp.error = first_line(e.what());
    }
    if (par) {  // each rank saved and resumed its own shard: the steps gathered, an error named by rank
      RunRecord r;
      r.completed = o.resume_exp.error.empty();
      r.error = o.resume_exp.error;
      r.steps = std::move(o.resume_exp.steps);
      par->gather(r);
      o.resume_exp.steps = std::move(r.steps);
      o.resume_exp.error = r.completed ? "" : r.error;
    }
  }

  if (par && par->rank() != 0)
    o.reference.why_not = "rank 0 compares the gathered records with the reference";
  else if (!o.test.completed)
    o.reference.why_not = "the run under test did not complete";
  else if (c.precision != Precision::fp32)
    o.reference.why_not = "prec=" + std::string(to_string(c.precision)) +
                          ": the reference does not model autocast's casts (grad-baseline is the AMP check)";
  else if (c.gp > 0.0)
    o.reference.why_not = "gp>0: the reference has no second derivatives (grad-baseline checks the penalty)";
  else if (std::string off = off_case_shapes(c, o.test); !off.empty())
    o.reference.why_not = o.reference.off_shape = off + " (the run under test's forward ran at other shapes)";
  else if (reference == ReferenceUse::where_it_judges && reproduces_bitwise(o.test, o.baseline))
    o.reference.why_not =
        "the run under test reproduced plain autograd bit for bit (losses, gradients, x.grad, BatchNorm statistics, "
        "the first forward's draws): the reference would judge ckverify's model and LibTorch here, not the "
        "implementation";
  else {
    for (int s = 0; s < c.steps; ++s) {
      o.reference.fp64.push_back(expected_step(o, s, RefScalar::fp64));
      o.reference.fp32.emplace_back();
      FloorComparisons floor = floor_comparisons(o, static_cast<size_t>(s));
      if (!floor.decides)
        o.reference.fp32.back() =
            Fp32Evaluation{expected_step(o, s, RefScalar::fp32), expected_step(o, s, RefScalar::fp32, {}, true)};
      o.reference.floor.push_back(floor.decides ? std::move(floor.results) : std::vector<CompareResult>{});
    }
    o.reference.computed = true;
  }
  return o;
}

std::string describe_effective_plan(const Observations& o) {
  auto span = [](int a, int b) { return a == b ? std::to_string(a) : fmt::format("{}..{}", a, b); };
  std::string ck, plain;
  if (o.strategy && !o.strategy_groups.empty()) {
    for (const auto& [a, b] : o.strategy_groups) ck += (ck.empty() ? "" : ", ") + span(a, b);
  } else {
    for (size_t s = 0; s < o.segments.size(); ++s)
      if (o.segments[s].checkpointed) ck += (ck.empty() ? "" : ", ") + std::to_string(s);
  }
  for (size_t s = 0; s < o.segments.size(); ++s)
    if (!o.segments[s].checkpointed) plain += (plain.empty() ? "" : ", ") + std::to_string(s);
  // What the run recomputed, not what the strategy meant: a block run inside a checkpoint whose
  // recompute ran another block reads as never recomputed.
  if (ck.empty()) return "no block recomputed in backward";
  return "block(s) " + ck + " recomputed in backward" + (plain.empty() ? "" : "; " + plain + " never recomputed");
}

}  // namespace ckv
