// verifier/tolerance.hpp: the one tolerance table (DESIGN.md, "Tolerances"). Keyed by the precision
// of the run under test and the kind of comparison; rtol and atol always as a pair, and every entry
// says why it is what it is. A comparison passes elementwise when |actual - expected| <= atol + rtol*|expected|.
#pragma once

#include <string>
#include <vector>

#include "verifier/case.hpp"

namespace ckv {

enum class Comparison {
  vs_reference,  // LibTorch (any precision) against the Eigen fp64 reference, same masks
  vs_baseline,   // checkpointed against non-checkpointed LibTorch, same device and precision
};

struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
  std::string why;
  bool applicable = true;  // false: no bound makes this comparison a useful check; `why` says why
  bool exact() const { return rtol == 0.0 && atol == 0.0; }
};

Tolerance tolerance_for(Precision p, Comparison k);

// vs_reference comparisons measure atol in units of the tensor's scale: atol * max(1, max_i |expected_i|).
// Rounding error in a gradient element grows with the magnitudes summed into it, which are bounded by
// the tensor's largest element, not by the element itself (a small entry of a large-gradient tensor
// carries the rounding of its large neighbours' products).
Tolerance scaled_to_tensor(const Tolerance& t, const std::vector<double>& expected);

}  // namespace ckv
