// verifier/bench/calibrate_tolerance.cpp: the evidence behind the grad-reference bound
// (properties/tolerance.hpp). Over N fp32 Cases it measures, per case, how much of its allowance the
// worst tensor uses (max over tensors of max|LibTorch - fp64| / allowed; below 1 passes), how far the
// fp32 reference itself is from fp64 (worst tensor, relative to the tensor's scale), and how many
// tensors were too ill-conditioned to check. Every case over its allowance is printed as a line.
// Usage: calibrate_tolerance [N=600] [envelope|wide]
//   envelope: the generator `ckverify check` uses; wide: far outside it (deep, narrow and wide stacks,
//   dropout up to 0.99, learning rates from 1e-8 to 100, vocab 1).
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "properties/generators.hpp"
#include "properties/grad_reference.hpp"
#include "properties/tolerance.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/run.hpp"

using namespace ckv;

namespace {
rc::Gen<Case> gen_wide() {
  using namespace rc;
  return gen::map(
      gen::tuple(gen::inRange(1, 25), gen::element(1, 2, 4), gen::element(1, 2, 4, 8, 16), gen::inRange(1, 17),
                 gen::inRange(1, 33), gen::element(0.0, 0.5, 0.9, 0.99), gen::element(1e-8, 0.05, 1.0, 100.0),
                 gen::inRange(1, 4), gen::inRange(1, 13), gen::inRange<uint64_t>(0, uint64_t{1} << 53),
                 gen_case(CaseGenOptions{{}, "builtin", "cpu", false, false, ""})),
      [](const auto& t) {
        Case c = std::get<10>(t);
        c.model.layers = std::get<0>(t);
        c.model.heads = std::get<1>(t);
        c.model.d_model = std::get<1>(t) * std::get<2>(t);
        c.model.ffn_mult = std::get<3>(t);
        c.model.vocab = std::get<4>(t);
        c.dropout = {std::get<5>(t), 0.0, std::get<5>(t), std::get<5>(t)};
        c.lr = std::get<6>(t);
        c.steps = std::get<7>(t);
        c.seq = std::get<8>(t);
        c.seed = std::get<9>(t);
        if (!c.plan.invalid_for(c.model.layers).empty()) c.plan = Plan{};
        return c;
      });
}
}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::max(10, std::atoi(argv[1])) : 600;
  const std::string mode = argc > 2 ? argv[2] : "envelope";
  if (mode != "envelope" && mode != "wide") {
    std::fprintf(stderr, "calibrate_tolerance: mode must be envelope|wide\n");
    return 2;
  }
  const auto gen = mode == "wide" ? gen_wide() : gen_case(CaseGenOptions{{}, "builtin", "cpu", false, false, ""});
  auto impl = make_builtin();
  std::vector<double> use;
  int unchecked = 0, tensors = 0, not_applicable = 0;
  for (int i = 0; i < n; ++i) {
    Case c = gen(rc::Random(static_cast<uint64_t>(i) + 1), 100).value();
    c.precision = Precision::fp32;
    c.gp = 0.0;
    const Observations o = observe(c, *impl, nullptr, ReferenceUse::always);
    const ReferenceChecks rc = reference_checks(o);
    if (!rc.applicable) {
      ++not_applicable;
      continue;
    }
    double worst_use = 0.0;
    for (const auto& k : rc.checks) {
      ++tensors;
      if (!k.checkable) {
        ++unchecked;
        continue;
      }
      worst_use = std::max(worst_use, k.result.r.max_abs / std::max(k.result.tol.atol, 1e-300));
    }
    use.push_back(worst_use);
    if (worst_use > 1.0) std::printf("over the allowance (use %.3g): %s\n", worst_use, to_line(c).c_str());
  }
  auto report = [](const char* label, std::vector<double> v) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    const size_t k = v.size();
    std::printf("%-24s median %.3g  p90 %.3g  p99 %.3g  max %.3g\n", label, v[k / 2], v[k * 9 / 10], v[k * 99 / 100],
                v.back());
  };
  std::printf("fp32 vs fp64 reference over %d %s cases (%d not applicable, %d of %d tensors not checkable):\n", n,
              mode.c_str(), not_applicable, unchecked, tensors);
  report("allowance used", use);
  return 0;
}
