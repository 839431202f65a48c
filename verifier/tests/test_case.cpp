// verifier/tests/test_case.cpp: the Case field table: line form, JSON round-trip, one-line rejection of
// invalid input, the limits, and plans.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "verifier/case/case.hpp"
#include "verifier/case/plan.hpp"

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
  c.model.tie = Tie::head;
  c.model.key_padding = true;
  c.model.aux_weight = kAuxWeight;
  c.dropout = {0.1, 0.0, 0.3, 0.05};
  c.dropout_impl = DropoutImpl::native;
  c.seed = 18446744073709551557ULL;  // near 2^64: must survive JSON
  c.batch = 3;
  c.seq = 9;
  c.steps = 3;
  c.micro = 2;
  c.sched = Schedule::ffbb;
  c.lr = 0.01;
  c.freeze = Freeze::alt;
  c.hook = Hook::clip;
  c.gp = 0.5;
  c.inplace = true;
  c.precision = Precision::bf16;
  c.device = "cuda:1";
  c.plan.kind = PlanKind::segments;
  c.plan.n = 2;
  c.impl = "no-preserve-rng";
  return c;
}

TEST(Case, JsonRoundTrip) {
  for (const Case& c : {Case{}, unusual_case()}) {
    const Case back = case_from_json(to_json(c));
    EXPECT_EQ(back, c) << to_json(c);
    EXPECT_EQ(to_line(back), to_line(c));
  }
}

TEST(Case, JsonUsesTheLineKeys) {
  const std::string j = to_json(unusual_case());
  for (const auto& f : case_field_infos()) EXPECT_NE(j.find("\"" + f.key + "\":"), std::string::npos) << f.key;
  EXPECT_EQ(j.find("d_model"), std::string::npos) << "one vocabulary: the line's keys";
}

TEST(Case, LineRoundTripAndReadableForm) {
  const Case c = unusual_case();
  const std::string line = to_line(c);
  EXPECT_EQ(line,
            "layers=5 d=24 heads=3 ffn=2 vocab=7 norm=rmsnorm pos=post attn=bidir act=swiglu loss=mse tie=head "
            "segio=multi drop=0.1,0,0.3,0.05 dropimpl=native batch=3 seq=9 steps=3 micro=2 sched=ffbb lr=0.01 "
            "freeze=alt hook=clip gp=0.5 inplace=true prec=bf16 device=cuda:1 plan=seg2 impl=no-preserve-rng "
            "seed=18446744073709551557");
  EXPECT_EQ(case_from_line(line), c);
  EXPECT_EQ(case_from_line("layers=3 attn=off drop=0.2").model.attention, false);
  EXPECT_EQ(case_from_line("drop=0.2").p(DropoutSite::ffn_out), 0.2);
  // Fields at their defaults that are not always printed stay out of the line.
  EXPECT_EQ(to_line(Case{}).find("micro="), std::string::npos);
  EXPECT_EQ(case_from_line("input=frozen").input_frozen, true);
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
    EXPECT_LT(msg.size(), 400u) << "too long: " << msg;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Cases, InvalidCase,
    ::testing::Values(
        Bad{"heads=3 d=16", true, "heads=3 must divide d=16"}, Bad{"layers=0", true, "layers=0 is outside [1, 64]"},
        Bad{"layers=70", true, "layers=70 is outside [1, 64]"}, Bad{"batch=-2", true, "batch=-2 is outside"},
        Bad{"seq=0", true, "seq=0 is outside"}, Bad{"drop=1.0", true, "drop.attn_probs=1.0 is outside [0, 1)"},
        Bad{"drop=0.1,0.1,-0.5,0.1", true, "drop.ffn_hidden=-0.5 is outside [0, 1)"},
        Bad{"drop=0.1,0.2", true, "drop must be one rate or 4 rates"}, Bad{"norm=batchnorm", true, "layernorm|rmsnorm"},
        Bad{"act=tanh", true, "relu|gelu_tanh|gelu_erf|swiglu"}, Bad{"prec=fp8", true, "fp32|bf16|fp16"},
        Bad{"attn=sideways", true, "causal|bidir|off"}, Bad{"tie=all", true, "none|blocks|head"},
        Bad{"segio=triple", true, "single|multi"}, Bad{"micro=0", true, "micro=0 is outside [1, 16]"},
        Bad{"sched=1f1b", true, "fb|ffbb"}, Bad{"freeze=some", true, "none|alt|blocks"},
        Bad{"hook=log", true, "none|scale|clip"}, Bad{"input=maybe", true, "trainable|frozen"},
        Bad{"inplace=yes", true, "true|false"}, Bad{"gp=-1", true, "gp=-1.0 is outside [0, 1e+06]"},
        Bad{"gp=0.1 input=frozen", true, "needs input=trainable"}, Bad{"lr=0", true, "lr=0.0 is outside (0, 1e+06]"},
        Bad{"lr=1e400", true, "is not a finite number"},
        Bad{"plan=every0", true, "none|block|everyN|segK|sqrt|attn|ffn|fromI"}, Bad{"plan=seg70", true, "at most 64"},
        Bad{"plan=from64", true, "I at most 63"}, Bad{"plan=seg9 layers=2", true, "seg9 needs K <= layers=2"},
        Bad{"device=tpu", true, "cpu|cuda|cuda:N"}, Bad{"colour=red", true, "unknown key \"colour\""},
        Bad{"fx=bn batch=1 seq=1", true, "fx=bn needs batch x seq >= 4"}, Bad{"fx=lasers", true, "fx="},
        Bad{"fx=", true, "fx="}, Bad{"fx=counter,", true, "fx="},
        Bad{"fx=counter,counter", true, "names counter twice"}, Bad{"d=abc", true, "d=\"abc\" is not an integer"},
        Bad{"d=99999999999999999999999", true, "is not an integer"},
        Bad{"seed=18446744073709551616", true, "seed=\"18446744073709551616\" is not an integer in [0, 2^64)"},
        Bad{"impl=a\x01"
            "b",
            true, "impl=\"a?b\""},
        Bad{"layers=64 d=4096 heads=64 seq=4096 batch=1024", true, "over the 32 GiB limit"},
        Bad{"{\"layers\": 2,}", false, "malformed JSON"}, Bad{"[1,2]", false, "must be a JSON object"},
        Bad{"{\"layers\": 2.5}", false, "layers must be an integer"},
        Bad{"{\"layers\": 1e400}", false, "malformed JSON"},
        Bad{"{\"layers\": 99999999999999999999}", false, "layers must be an integer in [1, 64], got 1e+20"},
        Bad{"{\"d_model\": 8}", false, "unknown field \"d_model\""}, Bad{"{\"seed\": -1}", false, "seed must be"},
        Bad{"{\"loss\": \"hinge\"}", false, "loss=\"hinge\" is not one of ce|mse"},
        Bad{"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", false, "nested deeper than 8"}));

TEST(Case, LongAndControlCharactersAreSanitized) {
  const std::string huge(100000, 'x');
  try {
    case_from_line("plan=" + huge);
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u);
  }
  EXPECT_EQ(sanitize("a\nb\x7f"), "a?b?");
}

TEST(Case, FilesMustBeSmallRegularFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("ckv_case_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_THROW(load_case_file(dir.string()), CaseError);  // a directory
  EXPECT_THROW(load_case_file((dir / "missing.json").string()), CaseError);
  {
    std::ofstream big(dir / "big.json");
    big << "{\"layers\": 2" << std::string(2 << 20, ' ') << "}";
  }
  try {
    load_case_file((dir / "big.json").string());
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_NE(std::string(e.what()).find("larger than 1 MiB"), std::string::npos) << e.what();
  }
  {
    std::ofstream ok(dir / "ok.json");
    ok << to_json(unusual_case());
  }
  EXPECT_EQ(load_case_file((dir / "ok.json").string()), unusual_case());
  std::filesystem::remove_all(dir);
}

TEST(Case, DefaultCaseAndFieldTableAgree) {
  EXPECT_NO_THROW(validate(Case{}));
  EXPECT_EQ(case_from_line(""), Case{});
  for (const auto& f : case_field_infos()) {
    EXPECT_FALSE(f.help.empty()) << f.key;
    EXPECT_FALSE(f.values.empty()) << f.key;
  }
}

TEST(Plan, SegmentsCoverEveryLayerOnceInOrder) {
  for (const char* s : {"none", "block", "every2", "seg3", "sqrt", "attn", "ffn", "from2"}) {
    Plan p;
    std::string err;
    ASSERT_TRUE(Plan::parse(s, p, err));
    for (int layers : {1, 3, 7}) {
      if (!p.invalid_for(layers).empty()) continue;
      for (bool embed : {false, true}) {
        int next = 0;
        bool first_unit = true;
        for (const Segment& seg : p.segments(layers, true, embed))
          for (const Unit& u : seg.units) {
            if (first_unit && embed) {
              EXPECT_EQ(u.part, BlockPart::embed) << s;
            }
            first_unit = false;
            if (u.part == BlockPart::ffn || u.part == BlockPart::embed) continue;
            EXPECT_EQ(u.layer, next++) << s << " layers=" << layers;
          }
        EXPECT_EQ(next, layers) << s;
      }
    }
  }
  Plan sqrt_plan;
  std::string err;
  Plan::parse("sqrt", sqrt_plan, err);
  EXPECT_EQ(sqrt_plan.segments(7, true).size(), 3u);  // ceil(sqrt(7)) = 3: sizes 3,2,2
  EXPECT_EQ(sqrt_plan.segments(7, true)[0].units.size(), 3u);
}

}  // namespace
}  // namespace ckv
