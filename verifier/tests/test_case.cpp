// verifier/tests/test_case.cpp: Case line form, JSON round-trip, and one-line rejection of invalid input.
#include <gtest/gtest.h>

#include <cmath>

#include "verifier/case.hpp"
#include "verifier/compare.hpp"
#include "verifier/plan.hpp"

namespace ckv {
namespace {

Case unusual_case() {
  Case c;
  c.model.layers = 5;
  c.model.d_model = 24;
  c.model.heads = 3;
  c.model.ffn_mult = 2;
  c.model.vocab = 7;
  c.model.norm = NormKind::rms;
  c.model.placement = NormPlacement::post;
  c.model.causal = false;
  c.model.activation = Activation::swiglu;
  c.model.loss = LossKind::mse;
  c.dropout = {0.1, 0.0, 0.3, 0.05};
  c.dropout_impl = DropoutImpl::native;
  c.seed = 18446744073709551557ULL;  // near 2^64: must survive JSON
  c.batch = 3;
  c.seq = 9;
  c.steps = 3;
  c.lr = 0.01;
  c.precision = Precision::bf16;
  c.device = "cuda:1";
  c.plan.kind = PlanKind::segments;
  c.plan.n = 2;
  c.impl = "skip-rng-restore";
  return c;
}

TEST(Case, JsonRoundTrip) {
  for (const Case& c : {Case{}, unusual_case()}) {
    const Case back = case_from_json(to_json(c));
    EXPECT_EQ(back, c) << to_json(c);
    EXPECT_EQ(to_line(back), to_line(c));
  }
}

TEST(Case, LineRoundTripAndReadableForm) {
  const Case c = unusual_case();
  const std::string line = to_line(c);
  EXPECT_EQ(line,
            "layers=5 d=24 heads=3 ffn=2 vocab=7 norm=rmsnorm pos=post attn=bidir act=swiglu loss=mse "
            "drop=0.1,0,0.3,0.05 dropimpl=native batch=3 seq=9 steps=3 lr=0.01 prec=bf16 device=cuda:1 "
            "plan=seg2 impl=skip-rng-restore seed=18446744073709551557");
  EXPECT_EQ(case_from_line(line), c);
  EXPECT_EQ(case_from_line("layers=3 attn=off drop=0.2").model.attention, false);
}

TEST(Case, EveryPlanSpellingRoundTrips) {
  for (const char* s : {"none", "block", "every2", "seg3", "sqrt", "attn", "ffn", "from1"}) {
    Plan p;
    std::string err;
    ASSERT_TRUE(Plan::parse(s, p, err)) << s << ": " << err;
    EXPECT_EQ(p.to_string(), s);
  }
}

struct Bad {
  const char* input;
  bool is_line;
  const char* must_mention;
};
class InvalidCase : public ::testing::TestWithParam<Bad> {};
TEST_P(InvalidCase, IsRejectedWithOneLineNamingTheField) {
  const Bad& b = GetParam();
  try {
    if (b.is_line)
      case_from_line(b.input);
    else
      case_from_json(b.input);
    FAIL() << "accepted: " << b.input;
  } catch (const CaseError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(b.must_mention), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Cases, InvalidCase,
    ::testing::Values(
        Bad{"heads=3 d=16", true, "model.heads=3 must divide model.d_model=16"},
        Bad{"layers=0", true, "model.layers=0 is outside [1, 64]"}, Bad{"batch=-2", true, "batch=-2 is outside"},
        Bad{"seq=0", true, "seq=0 is outside"}, Bad{"drop=1.0", true, "dropout.attn_probs=1.0 is outside [0, 1)"},
        Bad{"drop=0.1,0.1,-0.5,0.1", true, "dropout.ffn_hidden=-0.5 is outside [0, 1)"},
        Bad{"norm=batchnorm", true, "layernorm|rmsnorm"}, Bad{"act=tanh", true, "relu|gelu_tanh|gelu_erf|swiglu"},
        Bad{"prec=fp8", true, "fp32|bf16|fp16"}, Bad{"attn=sideways", true, "causal|bidir|off"},
        Bad{"plan=every0", true, "none|block|everyN|segK|sqrt|attn|ffn|fromI"},
        Bad{"plan=seg9 layers=2", true, "seg9 needs K <= layers=2"}, Bad{"device=tpu", true, "cpu|cuda|cuda:N"},
        Bad{"colour=red", true, "unknown key \"colour\""}, Bad{"d=abc", true, "d=\"abc\" is not a number"},
        Bad{"{\"model\": {\"layers\": 2,}", false, "malformed JSON"}, Bad{"[1,2]", false, "must be a JSON object"},
        Bad{"{\"model\": {\"layers\": 2.5}}", false, "model.layers must be an integer"},
        Bad{"{\"dropout\": {\"attn_prob\": 0.1}}", false, "unknown field dropout.attn_prob"},
        Bad{"{\"seed\": -1}", false, "seed must be a non-negative integer"},
        Bad{"{\"model\": {\"loss\": \"hinge\"}}", false, "model.loss=\"hinge\" is not one of ce|mse"}));

TEST(Plan, SegmentsCoverEveryLayerOnceInOrder) {
  for (const char* s : {"none", "block", "every2", "seg3", "sqrt", "attn", "ffn", "from2"}) {
    Plan p;
    std::string err;
    ASSERT_TRUE(Plan::parse(s, p, err));
    for (int layers : {1, 3, 7}) {
      if (!p.invalid_for(layers).empty()) continue;
      int next = 0;
      for (const Segment& seg : p.segments(layers, true))
        for (const Unit& u : seg.units) {
          if (u.part == BlockPart::ffn) continue;  // the attn unit of the same layer came first
          EXPECT_EQ(u.layer, next++) << s << " layers=" << layers;
        }
      EXPECT_EQ(next, layers) << s;
    }
  }
  Plan sqrt_plan;
  std::string err;
  Plan::parse("sqrt", sqrt_plan, err);
  EXPECT_EQ(sqrt_plan.segments(7, true).size(), 3u);  // ceil(sqrt(7)) = 3: sizes 3,2,2
  EXPECT_EQ(sqrt_plan.segments(7, true)[0].units.size(), 3u);
}

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
}

}  // namespace
}  // namespace ckv
