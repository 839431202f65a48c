// properties/properties.hpp: the checks, as pure functions from observations to Findings (DESIGN.md:
// "a new check is a new function over Observations, not a new code path in the runner"). The RapidCheck
// properties (properties/tests) and the `ckverify check` gate both call these.
#pragma once

#include <string>
#include <vector>

#include "reference/transformer.hpp"
#include "verifier/compare.hpp"
#include "verifier/runner.hpp"

namespace ckv {

struct Finding {
  std::string property;  // "grad-reference", "rng-replay", ...
  bool held = true;
  std::string where;   // first diverging tensor or site, for example "step 0 layer1.attn.wq.weight.grad"
  std::string detail;  // the one-line comparison message (STYLE.md) or a sentence
  int step = -1;
  bool applicable = true;  // false: the property does not apply to this Case (never counted as held)
};

// grad-reference: at every step, LibTorch's loss, parameter gradients and input gradient match the
// Eigen fp64 reference fed the first-forward masks of that step, within tolerance_for(precision,
// vs_reference). `faults` plants errors in the reference (only to show this check catches them).
Finding grad_reference(const RunObservation& run, const ReferenceFaults& faults = {});

// All comparisons grad_reference makes for one step, in backward order: loss, parameter gradients from
// the head down to layer 0, then x.grad.
std::vector<CompareResult> reference_comparisons(const RunObservation& run, int step,
                                                 const ReferenceFaults& faults = {});

// grad-baseline: checkpointed (`test`) vs non-checkpointed (`base`) run of the same Case: loss, every
// parameter gradient (and whether it is defined at all), x.grad at every step, and the parameters
// after every optimizer step, within tolerance_for(precision, vs_baseline) (bitwise on CPU).
Finding grad_baseline(const RunObservation& base, const RunObservation& test);

// rng-replay: every later call of a dropout site in a step (a recompute) drew the same mask as the
// first forward, at every position whose mask is known.
Finding rng_replay(const RunObservation& run);

// recompute-count: in every step each checkpointed segment's forward ran exactly twice, every other
// segment's exactly once.
Finding recompute_count(const RunObservation& run);

// exception-safe: a segment that throws during its recompute leaves the RNG state, the autocast state
// and grad mode exactly as they were before backward. Runs its own small experiment on `impl`.
Finding exception_safe(const Case& c, CheckpointImpl& impl);

// The gate for one Case: runs the baseline and `impl`, then every property above. Causes come before
// consequences: a recompute that drew a different mask (rng-replay) or ran the wrong number of times
// (recompute-count) also breaks the gradients, so those are reported first and name the site.
std::vector<Finding> check_case(const Case& c, CheckpointImpl& impl);

inline const std::vector<std::string>& property_names() {
  static const std::vector<std::string> v = {"rng-replay", "recompute-count", "grad-baseline", "grad-reference",
                                             "exception-safe"};
  return v;
}

}  // namespace ckv
