// properties/tests/test_compare.cpp: the one comparison function's message and the tolerance table.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "properties/compare.hpp"
#include "properties/tolerance.hpp"

namespace ckv {
namespace {

TEST(Compare, MessageNamesIndexValuesAndThreshold) {
  const TensorView v{"layer1.ffn.fc1.weight.grad", {2, 3}, {"row", "col"}};
  const CompareResult r = compare_values(v, {1, 2, 3, 4, 5, 6.5}, {1, 2, 3, 4, 5, 6}, {1e-3, 1e-3, "test"});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.r.mismatched, 1);
  const std::string m = r.message();
  EXPECT_NE(m.find("Mismatched elements: 1 / 6 (16.7%)"), std::string::npos) << m;
  EXPECT_NE(m.find("at index (row=1, col=2)"), std::string::npos) << m;
  EXPECT_NE(m.find("actual 6.5, expected 6"), std::string::npos) << m;
  EXPECT_NE(m.find("|a-e| <= 0.001 + 0.001*|e|"), std::string::npos) << m;
  EXPECT_TRUE(compare_values(v, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}, {0, 0, "bitwise"}).ok());
  EXPECT_FALSE(compare_values(v, {1, 2, 3, 4, 5, std::nan("")}, {1, 2, 3, 4, 5, 6}, {1, 1, "loose"}).ok());
  EXPECT_FALSE(compare_values(v, {1, 2, 3, 4, 5, 6 + 1e-15}, {1, 2, 3, 4, 5, 6}, {0, 0, "bitwise"}).ok());
  EXPECT_FALSE(compare_values(v, {1, 2, 3, 4, 5, -0.0}, {1, 2, 3, 4, 5, 0.0}, {0, 0, "bitwise"}).ok());
  // A tensor undefined in one run (no values) is a failed comparison that says so, never an exception.
  const CompareResult missing = compare_values(v, {}, {1, 2, 3, 4, 5, 6}, {1, 1, "loose"});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("no values (undefined) where 6 values were expected"), std::string::npos)
      << missing.message();
}

// Identical representations take a shortcut (memcmp); what it reports must be what the element loop
// reports: NaN and infinities where both have them equal, the first finite element named, and a -0.0
// against +0.0 (different bits) still judged element by element.
TEST(Compare, IdenticalValuesReportAsTheElementLoopDoes) {
  const TensorView v{"t", {5}, {"i"}};
  const double nan = std::nan(""), inf = INFINITY;
  const CompareResult same = compare_values(v, {nan, inf, 2, 3, -4}, {nan, inf, 2, 3, -4}, {0, 0, "bitwise"});
  EXPECT_TRUE(same.ok());
  EXPECT_EQ(same.r.total, 5);
  EXPECT_EQ(same.r.mismatched, 0);
  EXPECT_EQ(same.r.nonfinite, 0);
  EXPECT_EQ(same.r.max_abs_index, 2);
  EXPECT_EQ(same.r.max_rel_index, 2);
  EXPECT_EQ(same.r.actual_at_abs, 2.0);
  // One element apart (not bitwise identical): the loop's figures for the same elements.
  const CompareResult near = compare_values(v, {nan, inf, 2, 3, -4}, {nan, inf, 2, 3, -4.5}, {1, 0, "loose"});
  EXPECT_TRUE(near.ok());
  EXPECT_EQ(near.r.max_abs_index, 4);
  const CompareResult all_nan = compare_values(v, {nan, nan, nan, nan, nan}, {nan, nan, nan, nan, nan}, {0, 0, "b"});
  EXPECT_TRUE(all_nan.ok());
  EXPECT_EQ(all_nan.r.max_abs_index, -1);
  EXPECT_FALSE(compare_values(v, {0, 1, 2, 3, 4}, {-0.0, 1, 2, 3, 4}, {0, 0, "bitwise"}).ok());
  EXPECT_TRUE(compare_values(v, {0, 1, 2, 3, 4}, {-0.0, 1, 2, 3, 4}, {1e-9, 0, "loose"}).ok());
}

// Finite values take a one-pass path; a NaN in the same place on both sides counts for nothing, and
// sends the same values through the general loop: every figure but the element count must agree.
TEST(Compare, FinitePathReportsAsTheGeneralLoop) {
  std::mt19937_64 gen(17);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::uniform_int_distribution<int> kind(0, 5);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 1 + static_cast<size_t>(trial % 37);
    std::vector<double> a(n), e(n);
    for (size_t i = 0; i < n; ++i) {
      e[i] = kind(gen) == 0 ? 0.0 : u(gen);
      switch (kind(gen)) {
        case 0:
          a[i] = e[i];
          break;  // equal
        case 1:
          a[i] = e[i] + 1e-7;
          break;  // ties in absolute difference
        case 2:
          a[i] = e[i] == 0.0 ? -0.0 : -e[i];
          break;  // sign flips, -0.0
        default:
          a[i] = e[i] + 1e-3 * u(gen);
          break;
      }
    }
    const Tolerance tol{trial % 3 == 0 ? 0.0 : 1e-4, trial % 2 == 0 ? 1e-5 : 1e-3, "t"};
    const TensorView v{"t", {static_cast<int64_t>(n)}, {"i"}};
    const CompareResult fast = compare_values(v, a, e, tol);
    a.push_back(std::nan("")), e.push_back(std::nan(""));
    const CompareResult loop = compare_values(TensorView{"t", {static_cast<int64_t>(n + 1)}, {"i"}}, a, e, tol);
    SCOPED_TRACE(trial);
    EXPECT_EQ(fast.r.total + 1, loop.r.total);
    EXPECT_EQ(fast.ok(), loop.ok());
    EXPECT_EQ(fast.r.mismatched, loop.r.mismatched);
    EXPECT_EQ(fast.r.nonfinite, loop.r.nonfinite);
    EXPECT_EQ(fast.r.max_abs, loop.r.max_abs);
    EXPECT_EQ(fast.r.max_abs_index, loop.r.max_abs_index);
    EXPECT_EQ(fast.r.actual_at_abs, loop.r.actual_at_abs);
    EXPECT_EQ(fast.r.expected_at_abs, loop.r.expected_at_abs);
    EXPECT_EQ(fast.r.max_rel, loop.r.max_rel);
    EXPECT_EQ(fast.r.max_rel_index, loop.r.max_rel_index);
    EXPECT_EQ(fast.r.actual_at_rel, loop.r.actual_at_rel);
    EXPECT_EQ(fast.r.expected_at_rel, loop.r.expected_at_rel);
  }
}

TEST(Tolerance, ReferenceBoundFollowsTheFp32EvaluationsOwnError) {
  const std::vector<double> e64 = {1.0, -2.0, 0.5};
  const std::vector<double> tight = {1.0 + 1e-7, -2.0, 0.5}, loose = {1.0 + 1e-3, -2.0, 0.5};
  const StepConditioning ct = step_conditioning({&e64}, {{&tight}}), cl = step_conditioning({&e64}, {{&loose, &tight}});
  EXPECT_DOUBLE_EQ(cl.model_scale, 2.0);
  EXPECT_NEAR(cl.spread, 1e-3 / 2.0, 1e-12);
  const ReferenceBound a = reference_tolerance(e64, {&tight}, ct), b = reference_tolerance(e64, {&tight, &loose}, cl);
  ASSERT_TRUE(a.checkable && b.checkable);
  EXPECT_LT(a.tol.atol, b.tol.atol);
  EXPECT_NEAR(b.tol.atol, kReferenceFactor * 1e-3 + kReferenceFloor * 1.1920929e-7 * 2.0, 1e-9);
  // A tensor fp32 got right by luck still gets the step's spread.
  const std::vector<double> other = {0.25, 0.5};
  const ReferenceBound lucky = reference_tolerance(other, {&other}, cl);
  EXPECT_NEAR(lucky.tol.atol, kReferenceFactor * cl.spread * 0.5 + kReferenceFloor * 1.1920929e-7 * 2.0, 1e-12);
  // Far too ill-conditioned: reported as not checkable, never silently passed.
  const std::vector<double> bad = {1.5, -2.0, 0.5};
  const ReferenceBound c = reference_tolerance(e64, {&bad}, step_conditioning({&e64}, {{&bad}}));
  EXPECT_FALSE(c.checkable);
  EXPECT_NE(c.why_not.find("ill-conditioned"), std::string::npos) << c.why_not;
  const std::vector<double> inf = {INFINITY, -2.0, 0.5};
  EXPECT_FALSE(reference_tolerance(e64, {&inf}, ct).checkable);
}

TEST(Tolerance, SharedParametersGetASummationOrderBoundOnly) {
  EXPECT_TRUE(baseline_tolerance(Precision::fp32).exact());
  EXPECT_TRUE(baseline_tolerance(Precision::bf16).exact());
  const Tolerance f = shared_gradient_tolerance(Precision::fp32, 4, 2.0);
  const Tolerance b = shared_gradient_tolerance(Precision::bf16, 4, 2.0);
  EXPECT_NEAR(f.atol, kSharedFactor * 4 * 1.1920929e-7 * 2.0, 1e-12);
  EXPECT_NEAR(b.atol, kSharedFactor * 4 * 0.0078125 * 2.0, 1e-12);
  EXPECT_LT(b.atol, 0.5) << "a bound that a real bug (a lost or doubled contribution) still breaks";
}

}  // namespace
}  // namespace ckv
