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
  std::string where;     // first diverging tensor or site, for example "step 0 layer1.attn.wq.weight.grad"
  std::string detail;    // the one-line comparison message (STYLE.md) or a sentence
  int step = -1;
};

// grad-reference: at every step, LibTorch's loss, parameter gradients and input gradient match the
// Eigen fp64 reference fed the first-forward masks of that step, within tolerance_for(precision,
// vs_reference). `faults` plants errors in the reference (only to show this check catches them).
Finding grad_reference(const RunObservation& run, const ReferenceFaults& faults = {});

// All comparisons grad_reference makes for one step, in backward order: loss, parameter gradients from
// the head down to layer 0, then x.grad.
std::vector<CompareResult> reference_comparisons(const RunObservation& run, int step, const ReferenceFaults& faults = {});

}  // namespace ckv
