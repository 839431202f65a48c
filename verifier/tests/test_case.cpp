// verifier/tests/test_case.cpp: the Case field table: line form, JSON round-trip, one-line rejection of
// invalid input, the limits, and plans.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>

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
        Bad{"inplace=yes", true, "true|false"}, Bad{"inplace_on=mask", true, "need inplace=true"},
        Bad{"inplace=true inplace_micro=1", true, "inplace_micro=1 must be below micro=1"},
        Bad{"inplace=true inplace_on=mask", true, "inplace_on=mask needs segio=multi"},
        Bad{"inplace=true inplace_on=mask segio=multi seq=1", true, "and seq >= 2"},
        Bad{"inplace=true inplace_on=key", true, "input|mask|param"},
        Bad{"inplace=true inplace_on=param", true, "inplace_on=param needs micro >= 2 and inplace_micro >= 1"},
        Bad{"micro=2 inplace=true inplace_on=param", true, "inplace_micro >= 1"},
        Bad{"segin=slice", true, "plain|view"}, Bad{"segout=copy", true, "plain|alias|view"},
        Bad{"segout=alias tie=head", true, "tie=none or tie=blocks"}, Bad{"seqvar=1", true, "needs micro >= 2"},
        Bad{"micro=3 seq=4 seqvar=2", true, "must be at least 1"},
        Bad{"micro=2 seq=4 seqvar=2 fx=bn batch=1", true, "in every micro-batch"},
        Bad{"micro=2 seq=3 seqvar=2 segio=multi inplace=true inplace_on=mask inplace_micro=1", true,
            "in the micro-batch it edits"},
        Bad{"gp=-1", true, "gp=-1.0 is outside [0, 1e+06]"}, Bad{"gp=0.1 input=frozen", true, "needs input=trainable"},
        Bad{"lr=0", true, "lr=0.0 is outside (0, 1e+06]"}, Bad{"lr=1e400", true, "is not a finite number"},
        Bad{"plan=every0", true, "none|block|everyN|segK|sqrt|attn|ffn|fromI"}, Bad{"plan=seg70", true, "at most 64"},
        Bad{"plan=from64", true, "I at most 63"}, Bad{"plan=seg9 layers=2", true, "seg9 needs K <= layers=2"},
        Bad{"device=tpu", true, "cpu|cuda|cuda:N"}, Bad{"colour=red", true, "unknown key \"colour\""},
        Bad{"fx=bn batch=1 seq=1", true, "fx=bn needs batch x seq >= 4"}, Bad{"fx=lasers", true, "fx="},
        Bad{"fx=", true, "fx="}, Bad{"fx=counter,", true, "fx="},
        Bad{"fx=counter,counter", true, "names counter twice"}, Bad{"d=abc", true, "d=\"abc\" is not an integer"},
        Bad{"d=99999999999999999999999", true, "d=99999999999999999999999 is outside [1, 4096]"},
        // Numeric overflow names the field and the value as written (19 digits used to read as 2^63-1).
        Bad{"layers=9999999999999999999", true, "layers=9999999999999999999 is outside [1, 64]"},
        Bad{"batch=-99999999999999999999", true, "batch=-99999999999999999999 is outside [1, 1024]"},
        Bad{"{\"lr\": 1e400}", false, "malformed JSON in field \"lr\""},
        Bad{"{\"drop\": [0, 0, -1e999, 0]}", false, "malformed JSON in field \"drop\""},
        Bad{"{\"seq\": 1e30}", false, "seq must be an integer in [1, 4096], got 1e+30"},
        Bad{"{\"steps\": -99999999999999999999}", false, "steps must be an integer in [1, 1000], got -1e+20"},
        Bad{"{\"seed\": 18446744073709551616}", false,
            "seed must be an integer in [0, 2^64), got 1.8446744073709552e+19"},
        Bad{"{\"lr\": 1e300}", false, "lr=1e+300 is outside (0, 1e+06]"},
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
        Bad{"{\"tool\": \"ckverify\", \"command\": \"check\", \"case_outcomes\": []}", false,
            "this is a ckverify report (--json), not a Case file"},
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

// A fresh directory under the system temp directory (never the source tree), removed by the caller.
std::filesystem::path temp_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("ckv_case_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The message of the CaseError `f` throws ("" when it throws nothing); fails the test unless it is one
// printable line of fewer than 400 characters.
template <class F>
std::string case_error(F f) {
  try {
    f();
  } catch (const CaseError& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 400u) << "too long: " << msg.substr(0, 1000);
    for (unsigned char ch : msg) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << "byte " << int(ch) << " in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no CaseError";
  return "";
}

TEST(Case, FifoIsRefusedWithoutBlocking) {
  const auto dir = temp_dir("fifo");
  const std::string fifo = (dir / "case.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // Opening a FIFO without a writer blocks: the loader must stat the path and refuse it unopened.
  auto result = std::async(std::launch::async, [fifo] { return case_error([&] { load_case_file(fifo); }); });
  const bool prompt = result.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!prompt) {  // blocked in open(): open the write end so that it returns and the test can end
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  EXPECT_TRUE(prompt) << "load_case_file blocked on a FIFO";
  EXPECT_NE(result.get().find("is not a regular file"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Case, DevicesAndLinksToThemAreRefused) {
  ASSERT_TRUE(std::filesystem::exists("/dev/zero"));
  EXPECT_NE(case_error([] { load_case_file("/dev/zero"); }).find("is not a regular file"), std::string::npos);
  const auto dir = temp_dir("dev");
  std::filesystem::create_symlink("/dev/zero", dir / "zero.json");
  EXPECT_NE(case_error([&] { load_case_file((dir / "zero.json").string()); }).find("is not a regular file"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Case, TheSizeLimitIsOneMiBExactly) {
  const auto dir = temp_dir("size");
  const std::string json = to_json(unusual_case());
  for (size_t size : {size_t{1} << 20, (size_t{1} << 20) + 1}) {
    std::ofstream(dir / "case.json", std::ios::binary) << json << std::string(size - json.size(), ' ');
    ASSERT_EQ(std::filesystem::file_size(dir / "case.json"), size);
    if (size == size_t{1} << 20)
      EXPECT_EQ(load_case_file((dir / "case.json").string()), unusual_case());
    else
      EXPECT_NE(case_error([&] { load_case_file((dir / "case.json").string()); }).find("larger than 1 MiB"),
                std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(Case, DeepNestingIsACaseErrorNotAStackOverflow) {
  for (size_t n : {9, 1000, 500000}) {
    std::string objects;
    for (size_t i = 0; i < n; ++i) objects += "{\"a\":";
    objects += "1" + std::string(n, '}');
    const std::string arrays = std::string(n, '[') + "1" + std::string(n, ']');
    for (const std::string& text : {arrays, objects, "{\"drop\": " + arrays + "}", std::string(n, '[')})
      EXPECT_NE(case_error([&] { case_from_json(text); }).find("nested deeper than 8"), std::string::npos) << n;
  }
  const auto dir = temp_dir("nest");
  std::ofstream(dir / "deep.json") << std::string(1 << 20, '[');
  EXPECT_NE(case_error([&] { load_case_file((dir / "deep.json").string()); }).find("nested deeper than 8"),
            std::string::npos);
  std::filesystem::remove_all(dir);
  // Brackets inside strings (escaped quotes included) are not nesting.
  // A key given twice is refused (the parser would keep the last), naming it.
  EXPECT_EQ(case_error([] { case_from_json("{\"layers\": 2, \"d\": 8, \"layers\": 3}"); }),
            "case: field \"layers\" is given twice");
  EXPECT_EQ(case_from_json("{\"layers\": 2, \"d\": 8}").model.layers, 2);
  EXPECT_EQ(case_from_json("{\"impl\": \"[[[[[[[[[[{{{{{{{{{{\"}").impl, "[[[[[[[[[[{{{{{{{{{{");
  EXPECT_EQ(case_from_json("{\"impl\": \"a\\\"[[[[[[[[[[\"}").impl, "a\"[[[[[[[[[[");
}

// Found by case_fuzz: a Case the JSON form accepts replays from its line (subnormals, -0).
TEST(Case, EdgeNumbersReplayFromTheLine) {
  for (const char* j : {"{\"lr\": 4e-320}", "{\"drop\": 4e-320}", "{\"gp\": -0.0}", "{\"drop\": [-0.0, 0.1, 0, 0]}",
                        "{\"lr\": 2.2250738585072014e-308}", "{\"gp\": 1e-400}"}) {
    const Case c = case_from_json(j);
    EXPECT_EQ(case_from_line(to_line(c)), c) << j << " -> " << to_line(c);
    EXPECT_EQ(case_from_json(to_json(c)), c) << j;
  }
  EXPECT_EQ(case_from_json("{\"gp\": -0.0}"), Case{}) << "-0 reads as 0";
  EXPECT_EQ(case_from_line("lr=1e-310").lr, 1e-310) << "a subnormal is a number";
  EXPECT_NE(case_error([] { case_from_line("lr=1e-400"); }).find("lr=0.0 is outside (0, 1e+06]"), std::string::npos);
}

TEST(Case, MessagesAreOnePrintableLine) {
  const std::string mega(1 << 20, 'x');
  const std::string ctrl = "a\n\r\t\x1b[2J\x7f\x01\xff\xc3\xa9";  // controls, DEL, invalid and valid UTF-8
  const std::vector<std::string> lines = {"impl=" + ctrl,
                                          "plan=" + ctrl,
                                          "plan=" + mega,
                                          mega + "=1",
                                          "layers=" + mega,
                                          "fx=" + mega + ctrl,
                                          "lr=" + mega,
                                          "d=" + std::string(1 << 20, '9'),
                                          ctrl};
  for (const std::string& line : lines) case_error([&] { case_from_line(line); });
  const std::vector<std::string> texts = {"{\"impl\": \"a\\u0000\\u001b\\n\"}",
                                          "{\"" + mega + "\": 1}",
                                          "{\"plan\": \"" + mega + "\"}",
                                          "{\"device\": \"" + ctrl + "\"}",
                                          "{\"impl\": \"\xff\xfe\"}",
                                          "{\"impl\": \"" + mega + "\"}",
                                          "{\"layers\": " + std::string(1 << 20, '9') + "}",
                                          "{\"layers\": \"" + ctrl + "\"}",
                                          ctrl + mega};
  for (const std::string& text : texts) case_error([&] { case_from_json(text); });
  const auto dir = temp_dir("msg");
  case_error([&] { load_case_file((dir / ("bad\nname\x1b" + mega.substr(0, 200) + ".json")).string()); });
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

namespace ckv {
namespace {

// Every member of Case and of its ModelConfig is in the field table: changed alone to another valid
// value, it changes the line form and the JSON (and so equality, which compares the JSON), and the Case
// round-trips through both. The structured bindings stop compiling when a member is added, so a new
// member cannot miss the table unnoticed: add it here with a change, or say why it is not a field.
TEST(CaseFields, EveryMemberIsAFieldThatRoundTrips) {
  const Case base = case_from_line("layers=4 d=8 heads=2 steps=2 micro=2 drop=0,0,0,0 plan=block");
  {
    Case probe;
    auto& [model, dropout, dropout_impl, seed, batch, seq, seqvar, steps, micro, sched, lr, opt, resume, input_frozen,
           freeze, hook, gp, inplace, inplace_on, inplace_micro, segin, tp, tpkeep, dp, precision, device, plan, impl] =
        probe;
    auto& [layers, d_model, heads, ffn_mult, vocab, norm, placement, attention, causal, activation, loss, tie,
           key_padding, aux_weight, effects, segout, rand] = probe.model;
    (void)model, (void)dropout, (void)dropout_impl, (void)seed, (void)batch, (void)seq, (void)seqvar, (void)steps,
        (void)micro;
    (void)sched, (void)lr, (void)opt, (void)resume, (void)input_frozen, (void)freeze, (void)hook, (void)gp;
    (void)inplace, (void)inplace_on, (void)inplace_micro, (void)segin, (void)tp, (void)tpkeep, (void)dp,
        (void)precision, (void)device, (void)plan, (void)impl, (void)layers, (void)d_model, (void)heads;
    (void)ffn_mult, (void)vocab, (void)norm, (void)placement, (void)attention, (void)causal, (void)activation;
    (void)loss, (void)tie, (void)key_padding, (void)aux_weight, (void)effects, (void)segout, (void)rand;
  }
  // One change per member (key_padding and aux_weight are one field, segio; attention and causal are
  // one, attn), each made as the field's own parser makes it.
  const std::vector<std::pair<const char*, std::function<void(Case&)>>> changes = {
      {"model.layers", [](Case& c) { c.model.layers = 6; }},
      {"model.d_model", [](Case& c) { c.model.d_model = 16; }},
      {"model.heads", [](Case& c) { c.model.heads = 4; }},
      {"model.ffn_mult", [](Case& c) { c.model.ffn_mult = 2; }},
      {"model.vocab", [](Case& c) { c.model.vocab = 5; }},
      {"model.norm", [](Case& c) { c.model.norm = NormKind::rms; }},
      {"model.placement", [](Case& c) { c.model.placement = NormPlacement::post; }},
      {"model.attention", [](Case& c) { c.model.attention = false; }},
      {"model.causal", [](Case& c) { c.model.causal = !c.model.causal; }},
      {"model.activation", [](Case& c) { c.model.activation = Activation::relu; }},
      {"model.loss", [](Case& c) { c.model.loss = LossKind::mse; }},
      {"model.tie", [](Case& c) { c.model.tie = Tie::blocks; }},
      {"model.key_padding+aux_weight", [](Case& c) { c = case_from_line(to_line(c) + " segio=multi"); }},
      {"model.effects", [](Case& c) { c.model.effects = kCounter; }},
      {"model.segout", [](Case& c) { c.model.segout = SegOut::view; }},
      {"model.rand", [](Case& c) { c.model.rand = RandOp::jitter; }},
      {"dropout", [](Case& c) { c.dropout[1] = 0.25; }},
      {"dropout_impl", [](Case& c) { c.dropout_impl = DropoutImpl::native; }},
      {"seed", [](Case& c) { c.seed = 12345; }},
      {"batch", [](Case& c) { c.batch = 3; }},
      {"seq", [](Case& c) { c.seq = 5; }},
      {"seqvar", [](Case& c) { c.seqvar = 2; }},
      {"steps", [](Case& c) { c.steps = 3; }},
      {"micro", [](Case& c) { c.micro = 3; }},
      {"sched", [](Case& c) { c.sched = Schedule::ffbb; }},
      {"lr", [](Case& c) { c.lr = 0.125; }},
      {"opt", [](Case& c) { c.opt = Optimizer::adam; }},
      {"resume", [](Case& c) { c.resume = 1; }},
      {"input_frozen", [](Case& c) { c.input_frozen = true; }},
      {"freeze", [](Case& c) { c.freeze = Freeze::alt; }},
      {"hook", [](Case& c) { c.hook = Hook::clip; }},
      {"gp", [](Case& c) { c.gp = 0.5; }},
      {"inplace", [](Case& c) { c.inplace = true; }},
      {"inplace_on", [](Case& c) { c = case_from_line(to_line(c) + " segio=multi inplace=true inplace_on=mask"); }},
      {"inplace_micro", [](Case& c) { c.inplace = true, c.inplace_micro = 1; }},
      {"tp", [](Case& c) { c.tp = 2; }},
      {"tpkeep", [](Case& c) { c.tp = 2, c.tpkeep = TpKeep::reduced; }},
      {"dp", [](Case& c) { c.dp = 2; }},
      {"segin", [](Case& c) { c.segin = SegIn::view; }},
      {"precision", [](Case& c) { c.precision = Precision::bf16; }},
      {"device", [](Case& c) { c.device = "cuda:1"; }},
      {"plan",
       [](Case& c) {
         std::string e;
         ASSERT_TRUE(Plan::parse("every2", c.plan, e)) << e;
       }},
      {"impl", [](Case& c) { c.impl = "no-preserve-rng"; }},
  };
  for (const auto& [member, change] : changes) {
    Case c = base;
    change(c);
    EXPECT_NO_THROW(validate(c)) << member;
    EXPECT_NE(to_line(c), to_line(base)) << member << " is not in the line form";
    EXPECT_NE(to_json(c), to_json(base)) << member << " is not in the JSON (nor, so, in equality)";
    EXPECT_NE(c, base) << member;
    EXPECT_EQ(case_from_line(to_line(c)), c) << member;
    EXPECT_EQ(to_json(case_from_json(to_json(c))), to_json(c)) << member;
  }
}

}  // namespace
}  // namespace ckv

namespace ckv {
namespace {

// The Case line is refused with an error that contains `names`.
void expect_refused(const std::string& line, const std::string& names) {
  try {
    case_from_line(line);
    ADD_FAILURE() << line << " was accepted";
  } catch (const CaseError& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

// tp: 1, 2 or 4, on a model that splits (heads and the FFN width divide by it), on the CPU, without
// what ranks do not run yet; each refusal names the rule.
TEST(CaseTp, ValidatesWhatRanksCanRun) {
  const std::string base = "layers=2 d=8 heads=2 ffn=2 ";
  EXPECT_EQ(case_from_line(base + "tp=2").tp, 2);
  EXPECT_EQ(to_line(case_from_line(base + "tp=1")).find("tp="), std::string::npos);  // the default is not printed
  auto refused = [&](const std::string& extra, const std::string& names) { expect_refused(base + extra, names); };
  refused("tp=3", "tp=3 is not one of 1|2|4");
  refused("tp=4", "heads divisible");
  refused("tp=2 heads=1 d=6 ffn=1", "heads divisible");
  EXPECT_EQ(case_from_line(base + "tp=4 heads=4 d=8 ffn=1").tp, 4);
  refused("tp=2 device=cuda", "device=cpu");
  refused("tp=2 gp=0.1", "gp=0");
  refused("tp=2 inplace=true", "inplace=false");
  EXPECT_EQ(case_from_line(base + "tp=2 steps=2 resume=1").resume, 1);
  refused("tpkeep=reduced", "tpkeep=reduced needs tp > 1");
  EXPECT_EQ(case_from_line(base + "tp=2 tpkeep=reduced").tpkeep, TpKeep::reduced);
  EXPECT_EQ(tp_error(case_from_line("heads=1 d=6 ffn=1 attn=off").model, 4),
            "tp=4 needs the FFN width divisible by it (d x ffn=6: each rank holds d_ff/tp hidden units)");
}

// dp: 1 or 2, the step's micro-batches split evenly between the replicas, on the CPU, with no state kept
// across micro-batches and a resume position at a step boundary; each refusal names the rule.
TEST(CaseDp, ValidatesWhatReplicasCanRun) {
  const std::string base = "layers=2 d=8 heads=2 ffn=2 micro=2 ";
  const Case c = case_from_line(base + "dp=2 tp=2");
  EXPECT_EQ(c.dp, 2);
  EXPECT_EQ(c.ranks(), 4);
  EXPECT_EQ(to_line(case_from_line(base + "dp=1")).find("dp="), std::string::npos);
  auto refused = [&](const std::string& extra, const std::string& names) { expect_refused(base + extra, names); };
  refused("dp=4", "dp");
  refused("dp=2 micro=3", "dp=2 splits the step's micro-batches between the replicas: it needs micro divisible");
  refused("dp=2 device=cuda", "device=cpu");
  refused("dp=2 gp=0.1", "gp=0");
  refused("dp=2 inplace=true", "inplace=false");
  refused("dp=2 fx=bn batch=2 seq=4", "neither fx=bn nor fx=cache");
  refused("dp=2 fx=cache", "neither fx=bn nor fx=cache");
  refused("dp=2 steps=2 resume=1", "resume at a step boundary");
  EXPECT_EQ(case_from_line(base + "dp=2 steps=2 resume=2").resume, 2);
  EXPECT_EQ(case_from_line(base + "dp=2 fx=counter,log,noise").dp, 2);
}

}  // namespace
}  // namespace ckv
