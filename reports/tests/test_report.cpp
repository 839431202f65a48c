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


// A shard of a check run: cases `indices`, each with one outcome code over the two properties.
Report shard(int k, int n, std::vector<std::pair<int, std::string>> outcomes, int failing_index = -1) {
  Report r;
  r.command = "check";
  r.impl = "builtin", r.plan = "any", r.device = "cpu", r.torch = "2.8.0";
  r.seed = 7, r.cases_requested = 9;
  r.shard_index = k - 1, r.shard_count = n;
  r.properties = {{"rng-replay", 0, 0, "no dropout (shard " + std::to_string(k) + ")", false, "", ""},
                  {"grad-baseline", 0, 0, "", false, "", ""}};
  r.outcomes = std::move(outcomes);
  for (const auto& [i, code] : r.outcomes) {
    r.properties[0].held += code[0] == 'H', r.properties[0].not_applicable += code[0] == 'N';
    r.properties[1].held += code[1] == 'H';
  }
  r.cases_run = static_cast<int>(r.outcomes.size());
  if (failing_index >= 0) {
    Failure f;
    f.property = "grad-baseline", f.where = "w", f.detail = "d", f.case_line = "layers=1 seed=" + std::to_string(k);
    f.case_json = "{\"layers\": 1}";
    f.passing_before = failing_index;
    r.failure = f;
    r.properties[1].failed = true;
    r.exit_code = 1;
  }
  return r;
}

TEST(Report, JsonReadsBackWhatItWrote) {
  Report r = shard(2, 3, {{1, "HH"}, {4, "NF"}}, 4);
  const Report back = from_json(to_json(r));
  EXPECT_EQ(to_json(back), to_json(r));
  EXPECT_EQ(back.shard_index, 1);
  EXPECT_EQ(back.shard_count, 3);
  ASSERT_TRUE(back.failure);
  EXPECT_EQ(back.failure->passing_before, 4);
}

TEST(Report, MergedPassingShardsCountEveryCase) {
  const Report m = merge({shard(1, 3, {{0, "NH"}, {3, "HH"}, {6, "HH"}}), shard(3, 3, {{2, "HH"}, {5, "HH"}, {8, "NH"}}),
                          shard(2, 3, {{1, "HH"}, {4, "HH"}, {7, "HH"}})});
  EXPECT_EQ(m.exit_code, 0);
  EXPECT_EQ(m.cases_run, 9);
  EXPECT_EQ(m.properties[0].held, 7);
  EXPECT_EQ(m.properties[0].not_applicable, 2);
  EXPECT_EQ(m.properties[0].not_applicable_why, "no dropout (shard 1)");  // case 0's reason, as unsharded
  EXPECT_EQ(m.properties[1].held, 9);
  EXPECT_FALSE(m.failure);
}

TEST(Report, MergeStopsAtTheFirstFailureInCaseOrder) {
  // Shard 1 fails at case 6, shard 2 at case 4: the unsharded run stops at 4 and counts cases 0..4.
  const Report m = merge({shard(1, 3, {{0, "HH"}, {3, "HH"}, {6, "HF"}}, 6), shard(2, 3, {{1, "HH"}, {4, "HF"}}, 4),
                          shard(3, 3, {{2, "HH"}, {5, "HH"}, {8, "HH"}})});
  EXPECT_EQ(m.exit_code, 1);
  ASSERT_TRUE(m.failure);
  EXPECT_EQ(m.failure->passing_before, 4);
  EXPECT_EQ(m.failure->case_line, "layers=1 seed=2");
  EXPECT_EQ(m.cases_run, 5);
  EXPECT_EQ(m.properties[1].held, 4);
  EXPECT_TRUE(m.properties[1].failed);
}

TEST(Report, MergeEndsWhereNoShardRanACase) {
  // Shard 2 stopped at its time budget after case 1: case 4 never ran, so the merged run ends before it.
  Report s2 = shard(2, 3, {{1, "HH"}});
  s2.time_budget_hit = true;
  s2.time_budget_s = 5;
  const Report m = merge({shard(1, 3, {{0, "HH"}, {3, "HH"}, {6, "HH"}}), s2, shard(3, 3, {{2, "HH"}, {5, "HH"}, {8, "HH"}})});
  EXPECT_EQ(m.cases_run, 4);
  EXPECT_TRUE(m.time_budget_hit);
  EXPECT_EQ(m.time_budget_s, 5);
  EXPECT_EQ(m.exit_code, 0);
  // A shard that ran nothing: nothing was verified.
  Report empty = shard(1, 3, {});
  empty.time_budget_hit = true;
  EXPECT_EQ(merge({empty, shard(2, 3, {{1, "HH"}}), shard(3, 3, {{2, "HH"}})}).exit_code, 1);
}

TEST(Report, MergeRefusesWhatIsNotOneRun) {
  auto message = [](const std::vector<Report>& shards) {
    try {
      merge(shards);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("merged");
  };
  EXPECT_EQ(message({shard(1, 2, {{0, "HH"}})}), "shard 2/2 is missing");
  EXPECT_EQ(message({shard(1, 2, {{0, "HH"}}), shard(1, 2, {{0, "HH"}})}), "shard 1/2 is given twice");
  Report other = shard(2, 2, {{1, "HH"}});
  other.seed = 8;
  EXPECT_NE(message({shard(1, 2, {{0, "HH"}}), other}).find("seeds differ"), std::string::npos);
  EXPECT_EQ(message({}), "nothing to merge");
  EXPECT_EQ(message({shard(1, 2, {{1, "HH"}}), shard(2, 2, {{3, "HH"}})}), "shard 1/2 lists case 1, which is not one of its cases");
}

TEST(Report, ReadingRefusesMalformedAndDeepInputInOneLine) {
  for (const std::string& text : {std::string("{\"tool\": \"ckverify\""), std::string("[1, 2]"), std::string("{}"),
                                 std::string(100000, '[') + std::string(100000, ']'),
                                 std::string("{\"tool\": \"ckverify\", \"command\": 3}")}) {
    try {
      from_json(text);
      ADD_FAILURE() << "accepted " << text.substr(0, 40);
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_LT(what.size(), 300u) << what;
    }
  }
}

}  // namespace
}  // namespace ckv::report
