// reference/finite_diff.cpp: central differences of reference_loss (see finite_diff.hpp).
#include "reference/finite_diff.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace ckv {
namespace {
FdTensorReport compare(const std::string& name, const std::vector<double>& analytic, const std::vector<double>& numeric,
                       double floor) {
  FdTensorReport r;
  r.name = name;
  double scale = std::max(floor, 1e-300);
  for (size_t i = 0; i < analytic.size(); ++i) {
    scale = std::max({scale, std::abs(analytic[i]), std::abs(numeric[i])});
    const double e = std::abs(analytic[i] - numeric[i]);
    if (e > r.max_abs_err || r.worst_index < 0) {
      r.max_abs_err = e;
      r.worst_index = static_cast<int64_t>(i);
      r.analytic = analytic[i];
      r.numeric = numeric[i];
    }
  }
  r.rel_err = r.max_abs_err / scale;
  return r;
}
}  // namespace

const FdTensorReport& FdReport::worst() const {
  return *std::max_element(tensors.begin(), tensors.end(),
                           [](const auto& a, const auto& b) { return a.rel_err < b.rel_err; });
}

std::string FdReport::describe() const {
  std::vector<const FdTensorReport*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->rel_err > b->rel_err; });
  std::ostringstream os;
  os.precision(6);
  for (const auto* t : order)
    os << t->name << ": rel_err " << t->rel_err << " max_abs_err " << t->max_abs_err << " at flat index "
       << t->worst_index << " (analytic " << t->analytic << ", numeric " << t->numeric << ")\n";
  return os.str();
}

FdReport finite_difference_check(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                                 const DropoutMasks& masks, const ReferenceOptions& faults, double step) {
  const ReferenceResult an = reference_forward_backward(cfg, params, data, masks, faults);
  double largest = 0.0;
  for (const auto& g : an.grads.items)
    for (double v : g.data) largest = std::max(largest, std::abs(v));
  for (double v : an.dx) largest = std::max(largest, std::abs(v));
  const double floor = 1e-3 * largest;
  FdReport report;
  ParamSet p = params;
  for (size_t k = 0; k < p.items.size(); ++k) {
    auto& values = p.items[k].data;
    std::vector<double> numeric(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const double keep = values[i];
      values[i] = keep + step;
      const double up = reference_loss(cfg, p, data, masks, faults);
      values[i] = keep - step;
      const double down = reference_loss(cfg, p, data, masks, faults);
      values[i] = keep;
      numeric[i] = (up - down) / (2.0 * step);
    }
    report.tensors.push_back(compare(p.items[k].name, an.grads.items[k].data, numeric, floor));
  }
  CaseData d = data;
  std::vector<double> numeric(d.x.size());
  for (size_t i = 0; i < d.x.size(); ++i) {
    const double keep = d.x[i];
    d.x[i] = keep + step;
    const double up = reference_loss(cfg, params, d, masks, faults);
    d.x[i] = keep - step;
    const double down = reference_loss(cfg, params, d, masks, faults);
    d.x[i] = keep;
    numeric[i] = (up - down) / (2.0 * step);
  }
  report.tensors.push_back(compare("x", an.dx, numeric, floor));
  return report;
}

}  // namespace ckv
