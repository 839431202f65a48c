// reference/finite_diff.hpp: the reference's self-check. Central finite differences in fp64 of the
// forward loss against the hand-written backward, for every parameter and for the input x.
//
// Metric, per tensor t: rel_err = max_i |fd_i - an_i| / max(max_i |an_i|, max_i |fd_i|, 1e-3 * G),
// with G the largest |an| over all tensors of the model: the worst elementwise error relative to the
// tensor's gradient scale (an L-infinity normalised error). The floor 1e-3 * G exists for tensors
// whose true gradient is zero (the key bias: softmax is invariant to adding a constant per row), where
// the finite differences are pure rounding noise (~1e-11). A transposed or mis-scaled gradient
// anywhere in a tensor is an O(1) error under this metric.
#pragma once

#include <string>
#include <vector>

#include "reference/transformer.hpp"

namespace ckv {

struct FdTensorReport {
  std::string name;  // parameter name, or "x"
  double rel_err = 0.0;
  double max_abs_err = 0.0;
  int64_t worst_index = -1;              // flat index of the largest |fd - an|
  double analytic = 0.0, numeric = 0.0;  // at worst_index
};

struct FdReport {
  std::vector<FdTensorReport> tensors;
  const FdTensorReport& worst() const;
  std::string describe() const;  // one line per tensor, worst first
};

FdReport finite_difference_check(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                                 const DropoutMasks& masks, const ReferenceOptions& options = {}, double step = 1e-5);

}  // namespace ckv
