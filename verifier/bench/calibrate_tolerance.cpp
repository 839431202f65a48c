// verifier/bench/calibrate_tolerance.cpp: measures how far LibTorch gradients at a given precision lie
// from the Eigen fp64 reference over generated Cases (plan none, one step), the evidence behind the
// vs_reference rows of verifier/tolerance.cpp.
// Usage: calibrate_tolerance [N=600] [fp32|bf16|fp16] [RTOL ATOL]   (RTOL ATOL: try a candidate row instead of the table's)
// Prints quantiles of two per-case metrics:
//   worst-tensor: max over tensors of max_i |a_i - e_i| / max(max_i |e_i|, 1e-3 * largest |e| in the model)
//   global-L2:    ||a - e||_2 / ||e||_2 over all parameter gradients and x.grad together
//   table-use:    max over elements of |a - e| / (atol' + rtol * |e|) with the table's current row for this
//                 precision (atol' = atol scaled by scaled_to_tensor): below 1 passes, and 1 / table-use is
//                 the margin left (printed only where the table has an applicable row)
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "properties/generators.hpp"
#include "verifier/compat.hpp"
#include "verifier/tolerance.hpp"
#include "verifier/runner.hpp"

using namespace ckv;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::max(10, std::atoi(argv[1])) : 600;
  const std::string name = argc > 2 ? argv[2] : "bf16";
  Precision prec;
  if (name == "fp32")
    prec = Precision::fp32;
  else if (name == "bf16")
    prec = Precision::bf16;
  else if (name == "fp16" && compat::kCpuFp16Autocast)
    prec = Precision::fp16;
  else {
    std::fprintf(stderr, "calibrate_tolerance: precision must be fp32|bf16%s\n",
                 compat::kCpuFp16Autocast ? "|fp16" : "");
    return 2;
  }
  const auto gen = gen_case(CaseGenOptions{});
  Tolerance table = tolerance_for(prec, Comparison::vs_reference);
  if (argc > 4) table = {std::atof(argv[3]), std::atof(argv[4]), "candidate from the command line", true};
  std::vector<double> worst_tensor, global_l2, table_use;
  for (int i = 0; i < n; ++i) {
    Case c = gen(rc::Random(static_cast<uint64_t>(i) + 1), 100).value();
    c.precision = prec;
    c.steps = 1;
    c.plan = Plan{};
    const RunObservation run = run_case(c, nullptr);
    const DropoutMasks masks = reference_masks(run.masks, c.model, c.dropout, 0);
    const ReferenceResult ref = reference_forward_backward(c.model, run.initial_params, run.data, masks);
    std::vector<std::pair<const std::vector<double>*, const std::vector<double>*>> pairs;
    for (size_t k = 0; k < ref.grads.items.size(); ++k)
      pairs.emplace_back(&run.steps[0].grads.items[k].data, &ref.grads.items[k].data);
    pairs.emplace_back(&run.steps[0].dx, &ref.dx);
    double largest = 0.0;
    for (const auto& [a, e] : pairs)
      for (double v : *e) largest = std::max(largest, std::abs(v));
    double worst = 0.0, num = 0.0, den = 0.0, use = 0.0;
    for (const auto& [a, e] : pairs) {
      const Tolerance t = scaled_to_tensor(table, *e);
      double scale = 1e-3 * largest, err = 0.0;
      for (size_t k = 0; k < e->size(); ++k) {
        const double d = (*a)[k] - (*e)[k];
        scale = std::max(scale, std::abs((*e)[k]));
        err = std::max(err, std::abs(d));
        num += d * d;
        if (table.applicable) use = std::max(use, std::abs(d) / (t.atol + t.rtol * std::abs((*e)[k])));
        den += (*e)[k] * (*e)[k];
      }
      worst = std::max(worst, err / std::max(scale, 1e-300));
    }
    worst_tensor.push_back(worst);
    global_l2.push_back(std::sqrt(num / std::max(den, 1e-300)));
    table_use.push_back(use);
    if (use > 1.0) std::printf("over the table (use %.3g): %s\n", use, to_line(c).c_str());
  }
  auto report = [n](const char* label, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::printf("%-13s median %.3g  p90 %.3g  p99 %.3g  max %.3g\n", label, v[static_cast<size_t>(n / 2)],
                v[static_cast<size_t>(n * 9 / 10)], v[static_cast<size_t>(n * 99 / 100)], v.back());
  };
  std::printf("%s vs fp64 reference over %d generated cases:\n", name.c_str(), n);
  report("worst-tensor", worst_tensor);
  report("global-L2", global_l2);
  if (table.applicable) {
    std::printf("table-use for rtol %.3g, atol %.3g (x tensor scale):\n", table.rtol, table.atol);
    report("table-use", table_use);
  }
  return 0;
}
