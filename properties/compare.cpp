// properties/compare.cpp: see compare.hpp.
#include "properties/compare.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace ckv {

std::string CompareResult::index(int64_t flat) const {
  if (flat < 0) return "()";
  std::vector<int64_t> idx(view.shape.size());
  for (size_t k = view.shape.size(); k-- > 0;) {
    const int64_t s = view.shape[k] > 0 ? view.shape[k] : 1;
    idx[k] = flat % s;
    flat /= s;
  }
  std::string out = "(";
  for (size_t k = 0; k < idx.size(); ++k) {
    if (k) out += ", ";
    if (k < view.dims.size()) out += view.dims[k] + "=";
    out += std::to_string(idx[k]);
  }
  return out + ")";
}

std::string CompareResult::message() const {
  const std::string threshold =
      tol.exact() ? std::string("bitwise equality") : fmt::format("|a-e| <= {:.3g} + {:.3g}*|e|", tol.atol, tol.rtol);
  std::string head = fmt::format("{}: ", view.label);
  auto values = [](int64_t n) { return n == 0 ? std::string("no values (undefined)") : fmt::format("{} values", n); };
  if (r.actual_size >= 0)
    return head + fmt::format("{} where {} were expected; nothing else compared", values(r.actual_size),
                              values(r.expected_size));
  if (r.nonfinite > 0)
    head += fmt::format("{} non-finite value(s), first at index {}. ", r.nonfinite, index(r.first_nonfinite_index));
  if (r.ok && r.nonfinite == 0)
    return head + fmt::format(
                      "OK, {} elements, greatest absolute difference {:.3e}, greatest relative {:.3e} "
                      "(allowed: {})",
                      r.total, r.max_abs, r.max_rel, threshold);
  const double share = r.total ? 100.0 * static_cast<double>(r.mismatched) / static_cast<double>(r.total) : 0.0;
  return head + fmt::format(
                    "Mismatched elements: {} / {} ({:.1f}%). Greatest absolute difference: {:.6e} at index {} "
                    "(actual {:.9g}, expected {:.9g}). Greatest relative difference: {:.6e} at index {} "
                    "(actual {:.9g}, expected {:.9g}). Allowed: {} ({}).",
                    r.mismatched, r.total, share, r.max_abs, index(r.max_abs_index), r.actual_at_abs, r.expected_at_abs,
                    r.max_rel, index(r.max_rel_index), r.actual_at_rel, r.expected_at_rel, threshold, tol.why);
}

CompareResult compare_values(const TensorView& view, const std::vector<double>& actual,
                             const std::vector<double>& expected, const Tolerance& tol) {
  CompareResult out{view, tol, {}};
  auto& r = out.r;
  if (actual.size() != expected.size()) {
    r.ok = false;
    r.actual_size = static_cast<int64_t>(actual.size()), r.expected_size = static_cast<int64_t>(expected.size());
    return out;
  }
  r.total = static_cast<int64_t>(actual.size());
  if (!actual.empty() && std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(double)) == 0) {
    // The same representations throughout (the common case of a correct checkpoint on CPU): nothing
    // mismatches under any tolerance; the report names the first finite element, as the loop below would.
    for (size_t i = 0; i < actual.size(); ++i)
      if (std::isfinite(actual[i])) {
        r.max_abs_index = r.max_rel_index = static_cast<int64_t>(i);
        r.actual_at_abs = r.expected_at_abs = r.actual_at_rel = r.expected_at_rel = actual[i];
        break;
      }
    r.ok = true;
    return out;
  }
  const size_t n = actual.size();
  const double* av = actual.data();
  const double* ev = expected.data();
  bool finite = true;  // every element of both: the loop needs no per-element classification
  for (size_t i = 0; i < n; ++i) finite &= std::isfinite(av[i]) & std::isfinite(ev[i]);
  if (finite && !tol.exact() && n > 0) {
    // The same statistics as the general loop below, in one branch-light pass (the reference floor
    // compares every gradient of every step this way).
    const double atol = tol.atol, rtol = tol.rtol;
    int64_t mismatched = 0, abs_index = 0, rel_index = -1;
    double max_abs = std::abs(av[0] - ev[0]), max_rel = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const double e = ev[i], abs_e = std::abs(e), abs_err = std::abs(av[i] - e);
      mismatched += abs_err > atol + rtol * abs_e;
      if (abs_err > max_abs) max_abs = abs_err, abs_index = static_cast<int64_t>(i);
      if (abs_err > 0.0) {
        const double rel_err = abs_err / std::max(abs_e, 1e-300);
        if (rel_err > max_rel || rel_index < 0) max_rel = rel_err, rel_index = static_cast<int64_t>(i);
      }
    }
    r.mismatched = mismatched, r.max_abs = max_abs, r.max_abs_index = abs_index;
    r.actual_at_abs = av[abs_index], r.expected_at_abs = ev[abs_index];
    if (rel_index < 0) rel_index = abs_index;  // no difference anywhere: as below
    r.max_rel = max_rel, r.max_rel_index = rel_index;
    r.actual_at_rel = av[rel_index], r.expected_at_rel = ev[rel_index];
    r.ok = mismatched == 0;
    return out;
  }
  for (size_t i = 0; i < n; ++i) {
    const double a = actual[i], e = expected[i];
    const auto fi = static_cast<int64_t>(i);
    if (std::isfinite(a) != std::isfinite(e) || (std::isnan(a) != std::isnan(e))) {
      ++r.nonfinite;
      ++r.mismatched;
      if (r.first_nonfinite_index < 0) r.first_nonfinite_index = fi;
      continue;
    }
    if (!std::isfinite(a)) {
      if (!(a == e || (std::isnan(a) && std::isnan(e)))) ++r.mismatched;
      continue;
    }
    const double abs_err = std::abs(a - e);
    const double rel_err = abs_err / std::max(std::abs(e), 1e-300);
    // Bitwise mode compares representations: -0.0 and +0.0 count as different (abs_err 0 there).
    const bool bad =
        tol.exact() ? (std::signbit(a) != std::signbit(e) || a != e) : abs_err > tol.atol + tol.rtol * std::abs(e);
    if (bad) ++r.mismatched;
    if (abs_err > r.max_abs || r.max_abs_index < 0) {
      r.max_abs = abs_err;
      r.max_abs_index = fi;
      r.actual_at_abs = a;
      r.expected_at_abs = e;
    }
    if (abs_err > 0.0 && (rel_err > r.max_rel || r.max_rel_index < 0)) {
      r.max_rel = rel_err;
      r.max_rel_index = fi;
      r.actual_at_rel = a;
      r.expected_at_rel = e;
    }
  }
  if (r.max_rel_index < 0) {  // no difference anywhere: report index of greatest |abs| for completeness
    r.max_rel_index = r.max_abs_index;
    r.actual_at_rel = r.actual_at_abs;
    r.expected_at_rel = r.expected_at_abs;
  }
  r.ok = r.mismatched == 0;
  return out;
}

}  // namespace ckv
