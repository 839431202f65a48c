// verifier/run/run.hpp: the run stage (DESIGN.md: "Runners only record; properties only compare").
// observe() turns a Case into every observation the properties judge: the baseline training run (no
// checkpointing), the run under test (every checkpointed segment handed to the implementation), the
// reference's expectations (fp64 and fp32 evaluations fed the test run's first-forward masks), and the
// experiments that need a run of their own (a recompute made to throw; a segment input modified in
// place before backward). Nothing here judges.
//
// One training step, as both runs take it: zero the gradients; for each micro-batch (in the Case's
// schedule) run the forward under the Case's autocast, then its backward passes (one, or with a
// gradient penalty: autograd::grad w.r.t. x with create_graph, then backward of loss + penalty);
// then one SGD update.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "properties/compare.hpp"
#include "reference/transformer.hpp"
#include "verifier/case/case.hpp"
#include "verifier/case/environment_error.hpp"
#include "verifier/checkpoint/compat.hpp"
#include "verifier/checkpoint/rng.hpp"
#include "verifier/dist/collectives.hpp"
#include "verifier/impls/interface.hpp"
#include "verifier/model/site_tap.hpp"
#include "verifier/run/state.hpp"

namespace ckv {

// Throws EnvironmentError when this machine or build cannot run the Case.
void check_environment(const Case& c);

struct SegmentCallRecord {
  int step = 0, micro = 0, segment = 0;
  int phase = 0;  // 0: the forward; k >= 1: during backward pass k of that micro-batch
  bool grad_enabled = false;
  // The non-tensor arguments it received, as "arg 2 = 0, arg 3 = 2" (numbers as values, so an int that
  // came back as a whole double reads the same): a recompute must receive its forward's.
  std::string scalars;
};

// The side-effect ledger after a step: everything the side-effecting modules and the random stream
// left behind (reference/config.hpp, Effect).
struct Ledger {
  std::vector<int64_t> counter, external, cache_calls;  // per layer
  std::string log;                                      // the run's log file, whole
  ParamSet batchnorm;                                   // running statistics (model.hpp, batchnorm_state)
  RngState rng;                                         // the generators of every device
};

struct StepRecord {
  int first_micro = 0;                  // the first micro-batch this run ran (> 0: resumed inside the step)
  std::vector<double> losses;           // per micro-batch (already scaled by 1/micro)
  ParamSet grads;                       // after every backward pass of the step (zeros where undefined)
  std::vector<bool> grad_defined;       // per parameter, layout order
  std::vector<std::vector<double>> dx;  // per micro-batch: dloss/dx (empty when the input is frozen)
  std::vector<int> hook_calls;          // per parameter: gradient hook calls during the step
  double hook_input_max = 0.0;          // the largest |gradient| a hook received (before hook=clip clips it)
  ParamSet params_after;                // after the optimizer update
  ParamSet optimizer;                   // Adam's moments after the update (exp_avg.*, exp_avg_sq.*); empty for SGD
  Ledger ledger;                        // after the step
};

// Tensor memory of one training step of one run: the run's live bytes on the Case's device
// (memory.hpp) at the named points. Tensors that existed before the run's first step (parameters,
// data, optimizer moments) are not in these levels; MemoryRecord has their sizes.
struct StepMemory {
  int64_t before = 0;          // when the step began (the previous step's gradients released)
  int64_t after_forward = 0;   // when the step's first forward returned (its activations held)
  int64_t peak = 0;            // the largest level from the step's beginning to its optimizer update
  int64_t after_backward = 0;  // when the step's last backward returned and its loss was released
  int64_t carried = 0;         // live when the step began, allocated during the previous step (0 in the first)
  int64_t kept = 0;            // of those, still live after the step's end_step (kept for good, or a longer leak)
};
struct MemoryRecord {
  std::vector<StepMemory> steps;
  // The run's first forward: the level when the input was in place, and after each unit (in forward
  // order), relative to the step's `before`.
  int64_t forward_start = 0;
  std::vector<int64_t> unit_levels;
  std::vector<int64_t> segment_output;           // per segment: bytes of its output tensors (first forward)
  int64_t params = 0, grads = 0, optimizer = 0;  // bytes, at the end of the run
  // Bytes of one copy of the generator states on the Case's device (CPU: the CPU generator's state; on
  // CUDA the states are CPU tensors, so 0): a checkpoint that replays RNG keeps one per call.
  int64_t rng_state = 0;
};

// Wall time of one training step (CUDA: synchronized at each boundary).
struct StepTime {
  double forward = 0.0, backward = 0.0, optimizer = 0.0;  // seconds, summed over the micro-batches
  std::vector<double> unit_forward;  // the step's first forward: seconds per unit, in forward order
};

struct RunRecord {
  bool completed = false;
  std::string error;        // what the run threw (first line), when it did not complete
  std::string error_trace;  // the traceback behind it, where the implementation's runtime kept one
  int error_step = -1, error_micro = -1, error_phase = -1;
  std::vector<StepRecord> steps;  // the completed steps
  std::vector<SiteCall> sites;
  std::vector<ReluCall> relu;
  std::vector<NoiseCall> noise;
  std::vector<NoiseCall> jitter;  // rand=jitter's draws, every call
  std::vector<SegmentCallRecord> segment_calls;
  MemoryRecord memory;
  std::vector<StepTime> times;  // per completed step
};

// What the reference says one step of the run under test should have produced.
struct ExpectedStep {
  double max_activation = 0.0;          // the largest |block output| or |logit| over the micro-batches
  ParamSet batchnorm;                   // running statistics after the step (from the test's before it)
  std::vector<double> losses;           // per micro-batch
  ParamSet grads;                       // accumulated over micro-batches, gradient hooks applied
  std::vector<std::vector<double>> dx;  // per micro-batch
};
// The reference is evaluated three times per step: fp64 (the oracle), fp32 (what fp32 rounding does to
// this Case), and fp32 on inputs and parameters moved by a few ulps (how strongly the Case amplifies
// perturbations of that size: a chaotic step shows here even when the plain fp32 evaluation is lucky).
// The two fp32 evaluations of a step are made only where they can change grad-reference's verdict: a
// step whose every tensor is within the bound's floor of fp64 (tolerance.hpp, reference_floor_tolerance)
// holds whatever they would show, and its entry in fp32 is empty.
struct Fp32Evaluation {
  ExpectedStep plain, perturbed;
};
struct ReferenceRecord {
  bool computed = false;
  std::string why_not;  // when not computed
  // Not computed because the run under test drew its masks, ReLU patterns or noise at shapes other than
  // the Case's (off_case_shapes): a finding of grad-reference, not a reason to skip it.
  std::string off_shape;
  std::vector<ExpectedStep> fp64;
  std::vector<std::optional<Fp32Evaluation>> fp32;  // per step, as fp64
  // Per step without fp32 evaluations: floor_comparisons(), made to decide and judged by grad-reference
  // (empty where the evaluations were made).
  std::vector<std::vector<CompareResult>> floor;
};

struct GlobalState {
  RngState rng;
  compat::AutocastState autocast;
  bool grad_enabled = false;
  static GlobalState current();
};

// A recompute made to throw: the last checkpointed segment through which gradient flows raises in its
// first call during backward (step 0, micro-batch 0).
struct ThrowExperiment {
  bool ran = false;
  std::string why_not;
  // Not run because its forward (the run under test's own step 0, before anything is planted or edited)
  // raised although the run under test completed: the implementation behaves differently on a second
  // run of the same Case (why_not says how). A finding, not a reason to skip.
  bool forward_failed = false;
  int segment = -1;
  bool recomputed = false;  // the target segment's recompute ran (and raised the planted failure)
  bool threw = false;
  bool planted_message_seen = false;  // the exception that came out is the planted one
  std::string message;
  GlobalState before, after;  // around the backward call (the generators were moved on after the forward)
};
inline constexpr const char* kPlantedFailure = "ckverify: planted failure in the recompute";

// A segment input modified in place between forward and backward, in step 0 after the forward of
// micro-batch c.inplace_micro (Trainer::experiment): under inplace_on=input the hidden state that the last
// checkpointed segment through which gradient flows received gets a ramp added under no_grad; under
// inplace_on=mask the key mask every segment receives flips all keys but the first. Under
// inplace_on=param that segment's parameters get a ramp added before micro-batch c.inplace_micro's
// forward, after every earlier micro-batch's backward (Trainer::parameter_experiment).
// One run of an experiment: its gradients (parameters, which are defined, x), or what it raised.
struct ExperimentGradients {
  bool ran = false;
  std::string error;
  ParamSet grads;
  std::vector<bool> grad_defined;
  std::vector<double> dx;
};
struct InplaceExperiment {
  bool ran = false;
  std::string why_not;
  // Not run because its forward (the run under test's own step 0, before anything is planted or edited)
  // raised although the run under test completed: the implementation behaves differently on a second
  // run of the same Case (why_not says how). A finding, not a reason to skip.
  bool forward_failed = false;
  int segment = -1;
  bool threw = false;
  std::string message;
  // When backward completed: its gradients (parameters, x), and those of the same forward and backward
  // with the input left alone (a second run; reference_ran false when that one threw).
  ParamSet grads;
  std::vector<bool> grad_defined;
  std::vector<double> dx;
  bool reference_ran = false;
  std::string reference_error;
  ParamSet expected_grads;
  std::vector<bool> expected_grad_defined;
  std::vector<double> expected_dx;
  // inplace_on=param: the expected ones are plain autograd's with the same edit. Without it: plain
  // autograd's (the size of the edit's effect, which bounds the comparison) and the implementation's (a
  // run that differs from plain autograd already without the edit is grad-baseline's finding, not this one).
  ExperimentGradients plain_unedited, impl_unedited;
};

// The run under test saved to a state file after c.resume micro-batches, loaded into a freshly built
// model and optimizer and continued to the end (state.hpp). The saver is ckverify's own, or the broken
// one of a resume fault (ImplInfo::state_fault).
struct ResumeExperiment {
  bool ran = false;
  std::string why_not;
  std::string error;              // what the save, the load or the continued run threw
  int position = 0;               // micro-batches before the save
  std::vector<StepRecord> steps;  // the steps the resumed run completed: step position / micro on
};

// A Case with tp > 1 (parallel.hpp): what only the ranks' own records show, taken before they are
// gathered into the unsharded model's.
struct ParallelRecord {
  bool ran = false;  // the Case ran as ranks
  int ranks = 1;
  // parallel_consistency (model/shard.hpp) on the run under test: model-parallel masks differ between
  // ranks, replicated masks, parameters and gradients equal. Judged where every rank completed the same
  // calls; why_not says why not.
  bool judged = false;
  std::string why_not;
  std::vector<std::string> consistency;
  // The ledger rule (dist/collectives.hpp, ledger_violations) per rank, "rank 1: layer0.ffn: ...": the
  // run under test issued a backward collective more often than the baseline. Judged where every rank
  // completed.
  bool ledger_judged = false;
  std::vector<std::string> ledger;
  int forward = 0, recompute = 0, backward = 0;  // the run under test's collectives by pass (this rank)
  bool masks_gathered = false;  // the run under test's masks are the unsharded model's (else this rank's)
};

struct Observations {
  Case c;
  std::vector<Segment> segments;
  std::vector<bool> grad_flows;  // per segment: does any input or parameter of it require grad
  int passes = 1;                // backward passes per micro-batch
  std::vector<bool> trainable;   // per parameter, layout order
  ParamSet initial_params;
  std::vector<CaseData> data;  // per micro-batch
  RunRecord baseline, test;
  // Where some gradient of the run under test is outside grad-baseline's fixed rounding bound (of the
  // baseline's): ckverify's reference
  // reentrant checkpoint (impls/faults/reentrant.hpp, a correct design on hook=none Cases) run on the
  // same Case, taking each step from the run under test's parameters as the baseline does. How far it
  // moves each gradient is how far a correct checkpoint that sums in another order may move it on this
  // Case (grad-baseline's measured floor). design_why_not says why it did not run.
  RunRecord design;
  bool design_ran = false;
  std::string design_why_not;
  // Under autocast without a gradient penalty, also the design recomputing from detached leaves (as
  // torch's use_reentrant=True does: autocast caches one cast of a block input its consumers share, so
  // their gradients are summed in the autocast dtype); grad-baseline takes the larger of the two floors.
  RunRecord design_leaf;
  bool design_leaf_ran = false;
  ReferenceRecord reference;
  ThrowExperiment throw_exp;
  InplaceExperiment inplace_exp;
  ResumeExperiment resume_exp;
  // A strategy (CheckpointImpl::is_strategy) chose what to checkpoint: `segments` (one per block) then
  // holds the effective plan, a block counting as checkpointed when the run under test recomputed it,
  // and `strategy_groups` the checkpoints the strategy made, as [first, last] blocks recomputed together
  // (read off step 0, micro-batch 0's first backward pass).
  bool strategy = false;
  std::vector<std::pair<int, int>> strategy_groups;
  bool strategy_plan_varies = false;  // other blocks recomputed in another step or micro-batch
  ParallelRecord parallel;
};

// "block(s) 0..4, 5..9 recomputed in backward; 10, 11 never recomputed": the effective plan of a strategy
// Case (the checkpoints it made in step 0, micro-batch 0, as their recomputes show them).
std::string describe_effective_plan(const Observations& o);

// Runs everything. Throws EnvironmentError (check_environment, or the baseline itself runs out of
// memory) and std::runtime_error when the baseline fails otherwise (a ckverify bug, never a finding).
// A Case with tp > 1 runs on every one of its ranks with `par` (parallel.hpp); the observations come
// back gathered (the unsharded model's), the reference computed on rank 0 only.
// The fp64 reference is evaluated only where grad-reference can judge the implementation by it:
// not where the run under test reproduced the baseline (plain autograd) bit for bit in everything the
// reference reads and grad-reference compares (reproduces_bitwise), since its verdict there is the
// baseline's, on ckverify's own model and LibTorch, which model_tests judges. `always` evaluates it
// there too (those tests, and the tolerance calibration).
enum class ReferenceUse { where_it_judges, always };
class ParallelRun;
Observations observe(const Case& c, CheckpointImpl& impl, const ParallelRun* par = nullptr,
                     ReferenceUse reference = ReferenceUse::where_it_judges);
// Called by observe once both runs are set up (0 steps done) and after each step of the baseline (the run without
// checkpointing, which never runs the implementation): the steps done, of how many, and the seconds they took. A worker
// process reports it, so that at the per-case timeout ckverify tells a Case too slow for the timeout from a run under
// test that hangs (cli/workers.cpp). Null: nothing is called. On ranks, rank 0's progress reaches the process
// that started the ranks (check_case_as_ranks), which reports it through its own.
using BaselineProgress = void (*)(int done, int of, double seconds);
void set_baseline_progress(BaselineProgress f);
BaselineProgress get_baseline_progress();

// One tensor of step s that grad-reference compares with the reference, with its fp64 value and its
// fp32 evaluations (none where the step has none, ReferenceRecord).
struct ReferenceTensor {
  TensorView view;
  std::vector<double> actual, e64;
  std::vector<std::vector<double>> e32;
};
// In backward order, so that the first tensor that differs is where backward first went wrong: the
// losses per micro-batch, the trainable parameters' gradients head first, x.grad per micro-batch
// (unless the input is frozen), BatchNorm's running statistics after the step. Needs
// o.reference.fp64[s].
std::vector<ReferenceTensor> reference_tensors(const Observations& o, size_t s);
// Step s's tensors (reference_tensors, in order) compared with their fp64 values under the bound's floor
// (tolerance.hpp, reference_floor_tolerance). `decides`: every fp64 value is finite and every comparison
// held, so the fp32 evaluations cannot change grad-reference's verdict on the step and are not made.
struct FloorComparisons {
  std::vector<CompareResult> results;
  bool decides = true;
};
FloorComparisons floor_comparisons(const Observations& o, size_t s);

// One training run of the Case: with impl null (or plan none) nothing is checkpointed. Records
// instead of throwing when the run fails.
struct TrainOptions {
  // false: the dropout, ReLU and noise sites keep no records (sites, relu and noise stay empty), so that
  // time and memory measure the model alone (`ckverify bench`).
  bool record_sites = true;
};
RunRecord train(const Case& c, CheckpointImpl* impl, const TrainOptions& options = {});

// One training run driven by hand, micro-batch by micro-batch, with its state saved and loaded
// (`ckverify train`, the resume tests). impl null: nothing is checkpointed. With `par` (a Case with tp or
// dp > 1, on one of its ranks: `ckverify bench`) it runs this rank's shard and replica; positions stay
// the Case's (micro-batches of the whole step), and every rank advances alike.
class TrainingRun {
 public:
  TrainingRun(const Case& c, CheckpointImpl* impl, const ParallelRun* par = nullptr);
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;
  int position() const;  // micro-batches done
  int end() const;       // steps x micro
  // Runs micro-batches up to `position` (whole steps under sched=ffbb); returns the completed steps.
  std::vector<StepRecord> advance_to(int position);
  TrainingState state(StateFault fault) const;
  void load(const TrainingState& s);  // a fresh run only
  // Off: the model's sites keep no records (TrainOptions::record_sites).
  void record_sites(bool on);
  // What the run recorded so far (memory, times, steps' sites); `error`: the run stopped on it.
  RunRecord record(const std::exception* error = nullptr);
  // FNV-1a digest of the whole training state (parameters, accumulated gradients, optimizer, side
  // effects, generators, position), as 16 hex digits.
  std::string digest() const;
  // On ranks: the number of collectives this rank issued so far, and records [from, to) of them.
  size_t collectives_issued() const;
  std::vector<dist::CollectiveRecord> collectives(size_t from) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The largest |gradient| of a step: every defined parameter gradient, x.grad, and what a gradient hook
// received before it clipped (grad-baseline's scale for its rounding bounds).
double step_gradient_scale(const StepRecord& b);

// The gradient hook of the Case, as applied to a gradient.
double apply_hook(Hook h, double g);

// "" when every mask, ReLU pattern and noise draw the first forwards of run `r` recorded has the shape
// the Case gives its micro-batch; else the first that does not, in words (an implementation that ran
// the segments at other shapes, e.g. padded). The reference reads those records, so it needs this.
std::string off_case_shapes(const Case& c, const RunRecord& r);

// Whether the run under test `t` reproduced the baseline `b` bit for bit in everything grad-reference
// reads or compares: the same completed steps, each with equal losses, gradients (and which are
// defined), x.grad and BatchNorm statistics, and the same first-forward draws (masks, ReLU sides, noise
// and jitter eps). A NaN anywhere counts as a difference.
bool reproduces_bitwise(const RunRecord& t, const RunRecord& b);

// What the reference expects of step `step` of the run under test (its parameters before the step, the
// masks its first forward drew). `faults` plants errors in the reference (tests only).
// `perturb` moves every input and parameter by a few fp32 ulps (a fixed pseudo-random sign per element).
ExpectedStep expected_step(const Observations& o, int step, RefScalar scalar, const ReferenceFaults& faults = {},
                           bool perturb = false);

}  // namespace ckv
