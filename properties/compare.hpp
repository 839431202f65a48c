// properties/compare.hpp: the one comparison function. Every property compares tensors through it, so
// every failure prints the same message (STYLE.md): label, mismatched count and share, greatest
// absolute and relative difference with the index mapped back to named dimensions, actual and expected
// values there, and the threshold with its reason. Non-finite values are checked first. Tensors of
// different sizes (a gradient that is undefined in one run) are a failed comparison that says so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "properties/tolerance.hpp"

namespace ckv {

struct TensorView {
  std::string label;  // for example "layer3.attn.wq.weight.grad"
  std::vector<int64_t> shape;
  std::vector<std::string> dims;  // names of the dimensions, for example {"b","t","c"}; may be empty
};

struct CompareStats {
  bool ok = true;
  int64_t actual_size = -1, expected_size = -1;  // set (and not ok) when the sizes differ: nothing compared
  int64_t total = 0, mismatched = 0, nonfinite = 0;
  double max_abs = 0.0, max_rel = 0.0;
  int64_t max_abs_index = -1, max_rel_index = -1, first_nonfinite_index = -1;
  double actual_at_abs = 0.0, expected_at_abs = 0.0, actual_at_rel = 0.0, expected_at_rel = 0.0;
};

struct CompareResult {
  TensorView view;
  Tolerance tol;
  CompareStats r;
  bool ok() const { return r.ok; }
  std::string index(int64_t flat) const;  // "(b=1, t=3, c=5)" or "(3, 5)"
  std::string message() const;            // one line (the STYLE.md failure message), also for passes
};

CompareResult compare_values(const TensorView& view, const std::vector<double>& actual,
                             const std::vector<double>& expected, const Tolerance& tol);

}  // namespace ckv
