// verifier/run/bench.hpp: what a plan costs (`ckverify bench`). The seeds insist that a checkpoint plan
// is chosen on measured peak memory, step time, tokens/s and numerical agreement together, never on
// theory alone. For one Case, a list of plans and one or more implementations, every (plan,
// implementation) pair trains the Case with the model's instruments off, all of them step by step in
// turn (the order rotating every round, so that a shared machine's drifting speed slows every row
// alike), and this records per row:
//   - memory (memory.hpp, bytes on the Case's device): parameters, gradients, optimizer state, what
//     the forward keeps for backward, the step's peak above its start, and the total peak;
//   - time: forward, backward (recompute included) and optimizer, median over the repeats, with the
//     spread; tokens/s; the recompute overhead against the no-checkpoint run, next to the overhead
//     recomputing alone is expected to cost, T_fwd(recomputed units) / (T_fwd + T_bwd) measured on that
//     run (an estimate, not a ceiling: an implementation may cost more, or less by overlapping);
//   - the overhead as the median of the per-round ratios step(row) / step(none), with a
//     distribution-free 95% confidence interval; with several implementations, each one's step time
//     against the first one's on the same plan, likewise. Rounds go on past the minimum until every
//     interval is within the target width, or a round or time cap is reached (the result says which);
//   - the loss curve: every plan trains the same model on the same data, so the curves must coincide;
//   - optionally the largest batch that fits a memory budget, with its tokens/s.
// The growth law (activation peak against depth, `none` and `sqrt`) is measured on the same block with
// its parameters frozen, so parameter gradients (which grow like L whatever the plan) stay out of it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "properties/tolerance.hpp"
#include "verifier/case/case.hpp"
#include "verifier/impls/interface.hpp"

namespace ckv {

// A confidence interval for a median; `coverage` is the interval's exact coverage probability (0.95 or
// more), or below 0.95 when there are too few samples for a 95% interval ([min, max] then).
struct Interval {
  double lo = 0.0, hi = 0.0, coverage = 0.0;
  bool contains(double x) const { return lo <= x && x <= hi; }
};
// The distribution-free (order-statistic) interval for the median of `v`: the k-th smallest and the
// k-th largest value, k the largest index whose binomial(n, 1/2) coverage is still >= `confidence`. It
// assumes nothing about the distribution, so a noisy machine's outliers widen it instead of moving it.
Interval median_interval(std::vector<double> v, double confidence = 0.95);
inline constexpr int kMinIntervalSamples = 6;  // the fewest samples with a 95% interval ([min, max]: 96.9%)

// An implementation benchmarked (the CLI's --impl, one or more).
struct BenchImpl {
  std::string label;
  std::function<std::unique_ptr<CheckpointImpl>()> make;
};

class ParallelRun;

struct BenchOptions {
  // Rounds: `warmup` untimed, then at least `repeats` timed ones, and more (up to `max_repeats`, within
  // `time_cap_s` seconds of timed rounds) until every interval's half-width is at most `target` (relative).
  int warmup = 1, repeats = 8, max_repeats = 60;
  double time_cap_s = 300.0, target = 0.02;
  int64_t memory_budget = 0;  // bytes; 0: no budget search
  bool growth = false;        // also measure the growth law
  std::vector<int> growth_layers = {4, 9, 16, 25, 36};
  std::function<void(const std::string&)> progress;  // "step 2/6: every2"
  // Strategies measured beside the plans (check --strategy): each trains the Case with plan=block, the
  // strategy deciding what to checkpoint; labelled as given.
  struct Strategy {
    std::string label;
    std::function<std::unique_ptr<CheckpointImpl>()> make;
  };
  std::vector<Strategy> strategies;
  // A Case with tp or dp > 1: this rank's ParallelRun (every rank calls run_bench alike). Every row trains
  // this rank's shard and replica; rank 0 decides when the rounds stop, and the others follow. With tp > 1
  // every checkpointed row is also run with the selective plan (tpkeep=reduced). Not with growth or a
  // memory budget.
  const ParallelRun* par = nullptr;
};

// On ranks: the collectives one timed step issued on this rank in one pass (forward, recompute,
// backward), averaged over the timed rounds.
struct PassCollectives {
  double count = 0.0, kib = 0.0, ms = 0.0;  // per step: how many, KiB in all, ms inside them
};

struct PlanBench {
  std::string plan;
  std::string impl;  // the implementation's label ("" for none and for strategies)
  bool completed = false;
  std::string error;
  int64_t params = 0, grads = 0, optimizer = 0;  // bytes
  int64_t forward_kept = 0;                      // what the forward keeps for backward (first micro-batch)
  int64_t step_peak = 0;                         // the step's peak above its start
  int64_t total_peak = 0;                        // parameters + optimizer + the step's peak
  double saving = 0.0;                           // 1 - total_peak / total_peak(none)
  double step_s = 0.0, spread = 0.0;             // median step time; (max - min) / median
  double forward_s = 0.0, backward_s = 0.0, optimizer_s = 0.0;  // medians
  double tokens_per_s = 0.0;
  std::vector<double> step_times;  // per timed round, seconds
  double overhead = 0.0;           // median over the rounds of step / step(none), minus 1
  Interval overhead_ci;            // its 95% interval (minus 1 too)
  double overhead_expected = -1;   // -1: not computable for this plan (units differ from none's)
  std::vector<double> losses;      // per step (summed over micro-batches)
  double loss_divergence = 0.0;    // max over steps |loss - loss(none)| / max(|loss(none)|, 1e-12)
  int budget_batch = 0;            // largest batch within the budget (0: none fits, or no budget)
  int64_t budget_peak = 0;
  double budget_tokens_per_s = 0.0;
  // With a budget: what bounded the batch found, or why none was ("" without a budget).
  std::string budget_note;
  PassCollectives forward_collectives, recompute_collectives, backward_collectives;  // on ranks (rank 0's)
  std::string verified;         // the gate's verdict on this plan or strategy (the CLI's --verify-cases); "" not run
  std::string verified_detail;  // a failure's shrunk Case line and finding
};

struct GrowthPoint {
  int layers = 0;
  int64_t none = 0, sqrt = 0;  // the step's peak above its start, block parameters frozen
};

// peak(L) = c + a * L^k, fitted: least squares over k in (0, 3] (step 0.01), c and a linear.
struct GrowthFit {
  double k = 0.0, c = 0.0, a = 0.0;
};

// One implementation against the first on the same plan: the median over the rounds of
// step(impl) / step(first), with its interval.
struct ImplComparison {
  std::string plan, impl, against;
  double ratio = 1.0;
  Interval ci;
};

struct BenchResult {
  std::string case_line;
  int tp = 1, dp = 1;              // a Case run as tp x dp ranks: memory, times and collectives are rank 0's
  std::vector<std::string> impls;  // labels, in --impl order
  int rounds = 0;                  // timed rounds run
  bool converged = false;          // every interval within the target
  std::string stopped;             // why the rounds stopped
  std::vector<ImplComparison> comparisons;
  int tokens_per_step = 0;
  std::vector<PlanBench> plans;
  std::vector<GrowthPoint> growth;
  GrowthFit fit_none, fit_sqrt;       // all zero when fewer than 3 depths were measured
  std::string growth_stopped;         // why the growth law stops short (a depth this machine cannot run)
  std::string growth_failed;          // the implementation failed at a depth (a finding: exit 1)
  std::vector<std::string> diverged;  // plans whose loss curve left none's (beyond kLossTolerance)
};

inline constexpr double kLossTolerance = kBenchLossTolerance;  // relative (properties/tolerance.hpp)

// The preset of seed 001's lab: 20 blocks of LayerNorm -> Linear(D,4D) -> ReLU -> Linear(4D,D) +
// residual (attn=off), D=256, batch 2, seq 1024 on CPU (activations outweigh the parameters, as at the
// seed's size); the seed's D=2048, batch 2, seq 2048 on CUDA.
Case seed_lab_case(const std::string& device);
// Its plans: none; checkpoint every n = 1, 2, 4, 8; segments 1, 2, 4, 10, 20; hybrid from 0, 5, 10, 15.
std::vector<Plan> seed_lab_plans();
// The plans benchmarked for any other Case: none, block, every2, sqrt, seg2 (those valid for it).
std::vector<Plan> default_bench_plans(const Case& c);
// The order in which round `round` runs the n rows: rotated by round / 2, and reversed in odd rounds, so
// that over every 2n rounds each row runs right after each of its neighbours as often as right before
// it (a row that always ran after the same one would inherit its warm caches: two identical
// implementations then differ by their order alone).
std::vector<size_t> bench_round_order(size_t n, int round);

// Throws EnvironmentError when the Case cannot run here; std::runtime_error when the none run fails.
BenchResult run_bench(const Case& c, const std::vector<Plan>& plans, const std::vector<BenchImpl>& impls,
                      const BenchOptions& options);

// Fits peak = c + a * L^k to (L, peak) points (at least 3; otherwise all zero).
GrowthFit fit_growth(const std::vector<std::pair<double, double>>& points);

}  // namespace ckv
