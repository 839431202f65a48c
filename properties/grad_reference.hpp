// properties/grad_reference.hpp: the comparisons grad-reference makes, exposed so that the calibration
// tool (verifier/bench/calibrate_tolerance) measures exactly what the property judges.
#pragma once

#include <string>
#include <vector>

#include "properties/compare.hpp"
#include "verifier/run/run.hpp"

namespace ckv {

struct ReferenceCheck {
  int step = 0;
  bool checkable = true;
  std::string why_not;   // when not checkable
  CompareResult result;  // when checkable: the tensor vs fp64, under the fp32-conditioned bound
};

struct ReferenceChecks {
  bool applicable = true;
  std::string why_not;
  std::vector<ReferenceCheck> checks;  // per step: losses, trainable parameter gradients (head first), x.grad
};

ReferenceChecks reference_checks(const Observations& o);

}  // namespace ckv
