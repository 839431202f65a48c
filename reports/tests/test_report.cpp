// reports/tests/test_report.cpp: every writer renders the same report, escapes what it must, and a
// failure reaches each of them with its property, place, detail, case and repro line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "reports/report.hpp"

namespace ckv::report {
namespace {

Report failing() {
  Report r;
  r.command = "check";
  r.impl = "no-preserve-rng";
  r.plan = "any";
  r.device = "cpu";
  r.torch = "2.8.0";
  r.seed = 7;
  r.cases_requested = 100;
  r.cases_run = 3;
  r.properties = {{"rng-replay", 2, 0, "", true, "step 0 layer0 ffn_hidden call 1", "mask differs <&> \"here\""},
                  {"grad-reference", 1, 2, "prec=bf16", false, "", ""}};
  Failure f;
  f.property = "rng-replay";
  f.where = "step 0 layer0 ffn_hidden call 1";
  f.detail = "mask differs <&> \"here\"";
  f.case_line = "layers=1 d=4 plan=block seed=7";
  f.case_json = "{\"model\": {\"layers\": 1}}";
  f.repro = "ckverify repro shrunk.json";
  f.seed = 7;
  f.also = {{"grad-baseline", "step 0 layer0.ffn.fc2.bias.grad"}};
  r.failure = f;
  r.exit_code = 1;
  return r;
}

TEST(Report, ConsoleNamesPropertyWhereAlsoAndRepro) {
  const std::string s = to_console(failing());
  EXPECT_NE(s.find("FAILED rng-replay\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  where:   step 0 layer0 ffn_hidden call 1"), std::string::npos) << s;
  EXPECT_NE(s.find("  also:    grad-baseline failed at step 0 layer0.ffn.fc2.bias.grad"), std::string::npos) << s;
  EXPECT_NE(s.find("  repro:   ckverify repro shrunk.json"), std::string::npos) << s;
  EXPECT_NE(s.find("FAIL: 3 case(s)"), std::string::npos) << s;
}

TEST(Report, JsonCarriesTheShrunkCaseAndCounts) {
  const auto j = nlohmann::json::parse(to_json(failing()));
  EXPECT_EQ(j["exit_code"], 1);
  EXPECT_EQ(j["failure"]["property"], "rng-replay");
  EXPECT_EQ(j["failure"]["case"]["model"]["layers"], 1);
  EXPECT_EQ(j["properties"][0]["held"], false);
  EXPECT_EQ(j["properties"][1]["not_applicable"], 2);
  EXPECT_EQ(j["failure"]["also"][0]["property"], "grad-baseline");
}

TEST(Report, JunitHasOneTestcasePerPropertyAndEscapes) {
  const std::string x = to_junit_xml(failing());
  EXPECT_NE(x.find("tests=\"2\" failures=\"1\" errors=\"0\" skipped=\"0\""), std::string::npos) << x;
  EXPECT_NE(x.find("<testcase classname=\"ckverify.no-preserve-rng\" name=\"rng-replay\">"), std::string::npos) << x;
  EXPECT_NE(x.find("mask differs &lt;&amp;&gt; &quot;here&quot;"), std::string::npos) << x;
  EXPECT_EQ(x.find("<&>"), std::string::npos) << "unescaped text in XML";
  EXPECT_NE(x.find("<testcase classname=\"ckverify.no-preserve-rng\" name=\"grad-reference\"></testcase>"),
            std::string::npos)
      << x;
}

TEST(Report, JunitMarksAPropertyThatNeverAppliedAsSkippedNotPassed) {
  Report r = failing();
  r.failure.reset();
  r.exit_code = 0;
  r.properties = {{"grad-reference", 0, 3, "prec=bf16", false, "", ""}};
  const std::string x = to_junit_xml(r);
  EXPECT_NE(x.find("skipped=\"1\""), std::string::npos) << x;
  EXPECT_NE(x.find("<skipped message="), std::string::npos) << x;
}

TEST(Report, MarkdownTableAndFailureSection) {
  const std::string m = to_markdown(failing());
  EXPECT_NE(m.find("# ckverify check: FAIL"), std::string::npos) << m;
  EXPECT_NE(m.find("| rng-replay | **FAILED** | 2 | 0 |"), std::string::npos) << m;
  EXPECT_NE(m.find("- repro: `ckverify repro shrunk.json`"), std::string::npos) << m;
}

}  // namespace
}  // namespace ckv::report
