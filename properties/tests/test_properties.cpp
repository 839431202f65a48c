// properties/tests/test_properties.cpp: the core properties under RapidCheck with a fixed seed (set in
// CMake through RC_PARAMS), on generated Cases, against the builtin checkpoint; and every fault shown
// to be killed by the property that should kill it.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/generators.hpp"
#include "properties/properties.hpp"
#include "verifier/impls.hpp"

namespace ckv {
namespace {

void assert_all_hold(const Case& c) {
  auto impl = make_impl("builtin");
  for (const Finding& f : check_case(c, *impl))
    if (!f.held) RC_FAIL(f.property + " at " + f.where + ": " + f.detail);
}

RC_GTEST_PROP(Builtin, EveryPropertyHoldsOnGeneratedCases, ()) {
  const Case c = *gen_case(CaseGenOptions{});
  RC_TAG(to_string(c.dropout_impl), c.plan.to_string());
  assert_all_hold(c);
}

// Every plan gets its own run, so each is exercised whatever the generator's luck.
class EveryPlan : public ::testing::TestWithParam<const char*> {};
TEST_P(EveryPlan, BuiltinHoldsWithDropout) {
  CaseGenOptions o;
  std::string err;
  Plan p;
  ASSERT_TRUE(Plan::parse(GetParam(), p, err));
  o.plan = p;
  o.force_dropout = true;
  EXPECT_TRUE(rc::check(std::string("plan ") + GetParam(), [&] { assert_all_hold(*gen_case(o)); }));
}
INSTANTIATE_TEST_SUITE_P(Plans, EveryPlan,
                         ::testing::Values("none", "block", "every2", "seg2", "sqrt", "attn", "ffn", "from1"));

// ---- faults: each must be killed, by the expected property, naming the site ----
Case dropout_case(const char* impl) {
  Case c =
      case_from_line("layers=3 d=8 heads=2 ffn=2 vocab=5 drop=0.2,0.2,0.3,0.2 batch=2 seq=4 steps=2 plan=block seed=5");
  c.impl = impl;
  return c;
}
const Finding& finding(const std::vector<Finding>& fs, const std::string& property) {
  for (const auto& f : fs)
    if (f.property == property) return f;
  throw std::logic_error("no finding for " + property);
}

TEST(Faults, NoPreserveRngIsCaughtByRngReplayAndGradReferenceNamingTheSite) {
  const Case c = dropout_case("no-preserve-rng");
  auto impl = make_impl(c.impl);
  const auto fs = check_case(c, *impl);
  const Finding& rng = finding(fs, "rng-replay");
  EXPECT_FALSE(rng.held);
  EXPECT_NE(rng.where.find("layer2 attn_probs call 1"), std::string::npos) << rng.where;  // last block recomputes first
  EXPECT_NE(rng.detail.find("differs from the first forward's"), std::string::npos) << rng.detail;
  const Finding& ref = finding(fs, "grad-reference");
  EXPECT_FALSE(ref.held);
  EXPECT_NE(ref.where.find("step 0 layer"), std::string::npos) << ref.where;
  EXPECT_NE(ref.detail.find("Mismatched elements"), std::string::npos) << ref.detail;
}

TEST(Faults, EveryListedFaultIsKilledByItsProperty) {
  for (const ImplInfo& info : known_impls()) {
    if (info.killed_by.empty() || info.needs_cuda) continue;  // CUDA-only faults: the test below
    auto impl = make_impl(info.name);
    Case c = dropout_case(info.name.c_str());
    if (!info.demo.empty()) c = case_from_line(to_line(c) + " " + info.demo);  // later keys win
    const auto fs = check_case(c, *impl);
    EXPECT_FALSE(finding(fs, info.killed_by).held)
        << info.name << " survived " << info.killed_by << " on " << to_line(c);
  }
}

TEST(Faults, CpuRngOnlyIsKilledOnCuda) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "needs a CUDA device: the CUDA generators are what this fault forgets";
  Case c = dropout_case("cpu-rng-only");
  c.device = "cuda";
  auto impl = make_impl(c.impl);
  EXPECT_FALSE(finding(check_case(c, *impl), "rng-replay").held);
}

TEST(Faults, BuiltinSurvivesTheSameCase) {
  auto impl = make_impl("builtin");
  for (const Finding& f : check_case(dropout_case("builtin"), *impl))
    EXPECT_TRUE(f.held) << f.property << ": " << f.detail;
}

TEST(Faults, BuiltinIsBitwiseEqualToTheBaselineUnderBf16Autocast) {
  // The case that exposed the leaf-input bug: bf16, a checkpointed block that is not the last.
  const Case c = case_from_line(
      "layers=2 d=4 heads=1 ffn=1 vocab=2 pos=post attn=bidir act=swiglu prec=bf16 "
      "plan=block drop=0.25,0.25,0.5,0 dropimpl=native batch=1 seq=2 seed=84666043189007");
  auto impl = make_impl("builtin");
  const auto fs = check_case(c, *impl);
  EXPECT_TRUE(finding(fs, "grad-baseline").held) << finding(fs, "grad-baseline").detail;
  EXPECT_FALSE(finding(fs, "grad-reference").applicable);
  auto leaf = make_impl("leaf-input-recompute");
  EXPECT_FALSE(finding(check_case(c, *leaf), "grad-baseline").held);
}

TEST(Faults, WithoutDropoutNoPreserveRngIsHarmless) {
  Case c = dropout_case("no-preserve-rng");
  c.dropout = {};
  auto impl = make_impl(c.impl);
  for (const Finding& f : check_case(c, *impl)) EXPECT_TRUE(f.held) << f.property << ": " << f.detail;
}

}  // namespace
}  // namespace ckv
