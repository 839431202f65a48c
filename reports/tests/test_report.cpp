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
  f.also = {{"grad-baseline", "step 0 layer0.ffn.fc2.bias.grad", "differs by 1e-3\nfrom the baseline"}};
  r.failure = f;
  r.exit_code = 1;
  return r;
}

TEST(Report, ConsoleNamesPropertyWhereAlsoAndRepro) {
  const std::string s = to_console(failing());
  EXPECT_NE(s.find("FAILED rng-replay\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  where:   step 0 layer0 ffn_hidden call 1"), std::string::npos) << s;
  EXPECT_NE(s.find("  also:    grad-baseline failed at step 0 layer0.ffn.fc2.bias.grad: differs by 1e-3 from the "
                   "baseline\n"),
            std::string::npos)
      << s;
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
  EXPECT_EQ(j["failure"]["also"][0]["detail"], "differs by 1e-3\nfrom the baseline");
  EXPECT_EQ(from_json(to_json(failing())).failure->also[0].detail, "differs by 1e-3\nfrom the baseline");
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

TEST(Report, APythonTracebackReachesEveryWriterWhole) {
  Report r = failing();
  r.failure->trace =
      "Traceback (most recent call last):\n  File \"m.py\", line 3, in f\n    ```x <y>```\nValueError: boom";
  const std::string console = to_console(r);
  EXPECT_NE(console.find("  trace:   Traceback (most recent call last):\n             File \"m.py\", line 3, in f\n"),
            std::string::npos)
      << console;
  EXPECT_EQ(nlohmann::json::parse(to_json(r))["failure"]["trace"], r.failure->trace);
  EXPECT_EQ(from_json(to_json(r)).failure->trace, r.failure->trace);
  const std::string xml = to_junit_xml(r);
  EXPECT_NE(xml.find("ValueError: boom"), std::string::npos) << xml;
  EXPECT_NE(xml.find("```x &lt;y&gt;```"), std::string::npos) << xml;
  const std::string md = to_markdown(r);
  EXPECT_NE(md.find("\n```\nTraceback (most recent call last):"), std::string::npos) << md;
  EXPECT_EQ(md.find("```x"), std::string::npos) << "a fence inside the traceback closes the code block: " << md;
  // No trace, no field and no line.
  EXPECT_EQ(to_console(failing()).find("trace:"), std::string::npos);
  EXPECT_FALSE(nlohmann::json::parse(to_json(failing()))["failure"].contains("trace"));
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
  const Report m =
      merge({shard(1, 3, {{0, "NH"}, {3, "HH"}, {6, "HH"}}), shard(3, 3, {{2, "HH"}, {5, "HH"}, {8, "NH"}}),
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
  const Report m =
      merge({shard(1, 3, {{0, "HH"}, {3, "HH"}, {6, "HH"}}), s2, shard(3, 3, {{2, "HH"}, {5, "HH"}, {8, "HH"}})});
  EXPECT_EQ(m.cases_run, 4);
  EXPECT_TRUE(m.time_budget_hit);
  EXPECT_EQ(m.time_budget_s, 5);
  EXPECT_EQ(m.exit_code, 0);
  // A shard that ran nothing: nothing was verified.
  Report empty = shard(1, 3, {});
  empty.time_budget_hit = true;
  EXPECT_EQ(merge({empty, shard(2, 3, {{1, "HH"}}), shard(3, 3, {{2, "HH"}})}).exit_code, 1);
}

TEST(Report, AFindingPastAGapDoesNotClaimEveryCaseBeforeItPassed) {
  // Shard 1 ran nothing (its budget), shard 3 failed at case 2: cases 0 and 1 are not known to pass.
  Report s1 = shard(1, 3, {});
  s1.time_budget_hit = true;
  s1.time_budget_s = 0.05;
  const Report m = merge({s1, shard(2, 3, {{1, "HH"}}), shard(3, 3, {{2, "HF"}}, 2)});
  ASSERT_TRUE(m.failure);
  EXPECT_EQ(m.cases_run, 0);
  const std::string text = to_console(m);
  EXPECT_EQ(text.find("passing case"), std::string::npos) << text;
  EXPECT_NE(text.find("found at case 2 (not every case before it ran: case 0 did not"), std::string::npos) << text;
  EXPECT_NE(text.find("(time budget reached)"), std::string::npos) << text;
  // A shard's own report: the case's index, not a count of passing cases (it ran every third case).
  const std::string own = to_console(shard(3, 3, {{2, "HF"}}, 2));
  EXPECT_NE(own.find("found at case 2"), std::string::npos) << own;
  EXPECT_EQ(own.find("passing case"), std::string::npos) << own;
}

// What merge says about shards: its one-line refusal, or "merged".
std::string message(const std::vector<Report>& shards) {
  try {
    merge(shards);
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
  return std::string("merged");
}

TEST(Report, MergeRefusesWhatIsNotOneRun) {
  EXPECT_EQ(message({shard(1, 2, {{0, "HH"}})}), "shard 2/2 is missing");
  EXPECT_EQ(message({shard(1, 2, {{0, "HH"}}), shard(1, 2, {{0, "HH"}})}), "shard 1/2 is given twice");
  Report other = shard(2, 2, {{1, "HH"}});
  other.seed = 8;
  EXPECT_NE(message({shard(1, 2, {{0, "HH"}}), other}).find("seeds differ"), std::string::npos);
  // Shards of one run come from one ckverify: another build may judge a Case otherwise.
  Report newer = shard(2, 2, {{1, "HH"}});
  newer.version = "0.1.0+0123456789ab";
  EXPECT_EQ(message({shard(1, 2, {{0, "HH"}}), newer}),
            "the reports are not shards of one run: their ckverify versions differ");
  Report same = shard(1, 2, {{0, "HH"}});
  same.version = newer.version;
  EXPECT_EQ(message({same, newer}), "merged");
  EXPECT_EQ(merge({same, newer}).version, newer.version);
  EXPECT_EQ(from_json(to_json(newer)).version, newer.version);
  EXPECT_EQ(message({}), "nothing to merge");
  EXPECT_EQ(message({shard(1, 2, {{1, "HH"}}), shard(2, 2, {{3, "HH"}})}),
            "shard 1/2 lists case 1, which is not one of its cases");
}

TEST(Report, MergeRefusesForgedShards) {
  // A failed case with no failure reported, a case listed twice, counts that disagree with the list.
  EXPECT_EQ(message({shard(1, 2, {{0, "HF"}}), shard(2, 2, {{1, "HH"}})}),
            "shard 1/2 lists case 0 as failed but does not report that failure");
  EXPECT_EQ(message({shard(1, 2, {{0, "HH"}, {0, "HH"}}), shard(2, 2, {{1, "HH"}})}), "shard 1/2 lists case 0 twice");
  Report short_list = shard(2, 2, {{1, "HH"}});
  short_list.cases_run = 5;
  EXPECT_EQ(message({shard(1, 2, {{0, "HH"}}), short_list}), "shard 2/2 ran 5 case(s) but lists 1");
  // An empty or different property list.
  Report none = shard(2, 2, {});
  none.properties.clear();
  EXPECT_NE(message({shard(1, 2, {{0, "HH"}}), none}).find("property lists differ"), std::string::npos);
}

TEST(Report, MergeRefusesCountsOrFailuresTheOutcomesDoNotShow) {
  Report counts = shard(1, 2, {{0, "HH"}});
  counts.properties[0].held = 7;
  EXPECT_EQ(message({counts, shard(2, 2, {{1, "HH"}})}),
            "shard 1/2: the counts of rng-replay disagree with its case outcomes");
  Report hidden = shard(1, 2, {{0, "HH"}, {2, "HH"}}, 2);  // a failure whose case shows every property held
  EXPECT_EQ(message({hidden, shard(2, 2, {{1, "HH"}})}),
            "shard 1/2 reports a grad-baseline failure at case 2, which its outcomes do not show");
  std::string text = to_json(shard(1, 1, {{0, "HF"}}, 0));
  text.replace(text.find("\"failure\": {"), 12, "\"failure\": null, \"x\": {");
  try {
    from_json(text);
    ADD_FAILURE() << "read a null failure";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a failure that is not an object"), std::string::npos) << e.what();
  }
}

TEST(Report, ReadingRefusesOutcomeLettersThatMeanNothing) {
  Report r = shard(1, 1, {{0, "HH"}});
  std::string text = to_json(r);
  text.replace(text.find("\"HH\""), 4, "\"HZ\"");
  EXPECT_THROW(from_json(text), std::invalid_argument);
}

// --skip: a property set aside is never held and never failed; it is reported with its reason and the
// cases on which it would have failed, in every writer and through a merge.
Report with_skip(Report r) {
  r.skip_reason = "known: RNG not restored after a throw";
  r.properties[0].skipped = true;
  r.properties[0].held = r.properties[0].not_applicable = 0;
  r.properties[0].skipped_failures = 0;
  for (auto& [i, code] : r.outcomes) {
    code[0] = code[0] == 'F' ? 'X' : 'S';
    r.properties[0].skipped_failures += code[0] == 'X';
  }
  return r;
}

TEST(Report, SkippedPropertiesAreReportedAsSkippedEverywhere) {
  Report r = with_skip(shard(1, 1, {{0, "FH"}, {1, "HH"}}));
  const std::string c = to_console(r);
  EXPECT_NE(c.find("skipped rng-replay: known: RNG not restored after a throw (would have failed on 1 case(s))"),
            std::string::npos)
      << c;
  EXPECT_EQ(c.find("held  rng-replay"), std::string::npos) << c;
  const auto j = nlohmann::json::parse(to_json(r));
  EXPECT_EQ(j["skip_reason"], "known: RNG not restored after a throw");
  EXPECT_EQ(j["properties"][0]["skipped"], true);
  EXPECT_EQ(j["properties"][0]["held"], false);
  EXPECT_EQ(j["properties"][0]["cases_failed_while_skipped"], 1);
  const std::string x = to_junit_xml(r);
  EXPECT_NE(x.find("<skipped message=\"set aside (--skip): known: RNG not restored after a throw; would have failed "
                   "on 1 case(s)\"/>"),
            std::string::npos)
      << x;
  EXPECT_NE(x.find("failures=\"0\""), std::string::npos) << x;
  EXPECT_NE(to_markdown(r).find("| rng-replay | skipped: known"), std::string::npos);
  EXPECT_EQ(to_json(from_json(to_json(r))), to_json(r));
}

TEST(Report, MergeCountsSkippedFailuresAndRefusesDifferentSkips) {
  const Report m = merge({with_skip(shard(1, 2, {{0, "FH"}, {2, "HH"}})), with_skip(shard(2, 2, {{1, "FH"}}))});
  EXPECT_EQ(m.exit_code, 0);
  EXPECT_EQ(m.cases_run, 3);
  EXPECT_TRUE(m.properties[0].skipped);
  EXPECT_EQ(m.properties[0].skipped_failures, 2);
  EXPECT_EQ(m.properties[0].held, 0);
  EXPECT_EQ(m.skip_reason, "known: RNG not restored after a throw");
  try {
    merge({with_skip(shard(1, 2, {{0, "HH"}})), shard(2, 2, {{1, "HH"}})});
    ADD_FAILURE() << "merged shards that set different properties aside";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("skipped properties (--skip) differ"), std::string::npos) << e.what();
  }
  // A skipped property cannot carry a held/failed letter, nor an unskipped one a skip letter.
  Report forged = with_skip(shard(1, 1, {{0, "HH"}}));
  std::string text = to_json(forged);
  text.replace(text.find("\"SH\""), 4, "\"FH\"");
  EXPECT_THROW(from_json(text), std::invalid_argument);
}

TEST(Report, ABudgetCutRunSaysHowManyOfTheRequestedCasesRan) {
  Report r = shard(1, 1, {{0, "HH"}, {1, "HH"}});
  r.time_budget_hit = true;
  r.time_budget_s = 5;
  EXPECT_NE(to_console(r).find("PASS: 2 of 9 case(s) in"), std::string::npos) << to_console(r);
  EXPECT_NE(to_console(r).find("(time budget reached)"), std::string::npos);
  r.min_cases = 5;
  r.exit_code = 1;
  EXPECT_NE(to_console(r).find("only 2 case(s) ran, fewer than --min-cases 5"), std::string::npos) << to_console(r);
  EXPECT_EQ(from_json(to_json(r)).min_cases, 5);
}

TEST(Report, MergeJudgesMinCasesOnTheWhole) {
  auto with_min = [](Report r) {
    r.min_cases = 4;
    return r;
  };
  // 3 cases merged against --min-cases 4: a failed run although nothing failed.
  Report s2 = with_min(shard(2, 2, {{1, "HH"}}));
  s2.time_budget_hit = true;
  const Report m = merge({with_min(shard(1, 2, {{0, "HH"}, {2, "HH"}, {4, "HH"}})), s2});
  EXPECT_EQ(m.cases_run, 3);  // case 3 never ran: the merged run ends before it
  EXPECT_EQ(m.exit_code, 1);
  EXPECT_EQ(
      merge({with_min(shard(1, 2, {{0, "HH"}, {2, "HH"}})), with_min(shard(2, 2, {{1, "HH"}, {3, "HH"}}))}).exit_code,
      0);
  EXPECT_THROW(merge({with_min(shard(1, 2, {{0, "HH"}})), shard(2, 2, {{1, "HH"}})}), std::invalid_argument);
}

// --max-findings: each further finding is rendered as its own failure and reads back; merge keeps, per
// property, the earliest finding of any shard.
Failure finding(const std::string& property, int index) {
  Failure f;
  f.property = property, f.where = "w " + property, f.detail = "d " + property;
  f.case_line = "layers=1 seed=" + std::to_string(index);
  f.case_json = "{\"layers\": 1}";
  f.passing_before = index;
  f.repro = "ckverify repro r." + property + ".json";
  f.shrink_note = "shrunk in 3 step(s)";
  return f;
}

TEST(Report, FurtherFindingsAreEachReported) {
  Report r = shard(1, 1, {{0, "HH"}, {1, "FH"}, {2, "FF"}}, 1);
  r.failure->property = "rng-replay";
  r.properties[0].failed = true;
  r.max_findings = 3;
  r.further.push_back(finding("grad-baseline", 2));
  r.properties[1].failed = true;
  const std::string c = to_console(r);
  EXPECT_NE(c.find("FAILED rng-replay (finding 1 of 2)"), std::string::npos) << c;
  EXPECT_NE(c.find("FAILED grad-baseline (finding 2 of 2)"), std::string::npos) << c;
  EXPECT_NE(c.find("  found at case 2, then shrunk in 3 step(s)"), std::string::npos) << c;
  const auto j = nlohmann::json::parse(to_json(r));
  EXPECT_EQ(j["further_failures"][0]["property"], "grad-baseline");
  EXPECT_EQ(j["max_findings"], 3);
  const std::string x = to_junit_xml(r);
  EXPECT_NE(x.find("w grad-baseline"), std::string::npos) << x;  // its own failure, not the first's
  EXPECT_NE(to_markdown(r).find("## Failure: grad-baseline"), std::string::npos);
  EXPECT_EQ(to_json(from_json(to_json(r))), to_json(r));
  // A forged report: two findings of one property.
  Report twice = r;
  twice.further.push_back(finding("grad-baseline", 2));
  EXPECT_THROW(from_json(to_json(twice)), std::invalid_argument);
}

TEST(Report, MergeKeepsTheEarliestFindingOfEachProperty) {
  auto multi = [](Report r, std::vector<Failure> fs) {
    r.max_findings = 3;
    r.failure = fs.front();
    r.exit_code = 1;
    for (size_t k = 1; k < fs.size(); ++k) r.further.push_back(fs[k]);
    return r;
  };
  // Shard 1 finds grad-baseline at 2 and rng-replay at 4; shard 2 finds rng-replay at 1.
  const Report m = merge(
      {multi(shard(1, 2, {{0, "HH"}, {2, "HF"}, {4, "FF"}}), {finding("grad-baseline", 2), finding("rng-replay", 4)}),
       multi(shard(2, 2, {{1, "FH"}, {3, "FH"}, {5, "FH"}}), {finding("rng-replay", 1)})});
  ASSERT_TRUE(m.failure);
  EXPECT_EQ(m.failure->property, "rng-replay");
  EXPECT_EQ(m.failure->passing_before, 1);
  ASSERT_EQ(m.further.size(), 1u);
  EXPECT_EQ(m.further[0].property, "grad-baseline");
  EXPECT_EQ(m.further[0].passing_before, 2);
  EXPECT_EQ(m.cases_run, 6);  // fewer findings than --max-findings: the run went through every case
  EXPECT_EQ(m.exit_code, 1);
}

TEST(Report, ShardIsKOfNWithinTheBound) {
  int k = -1, n = -1;
  EXPECT_TRUE(parse_shard("3/7", k, n));
  EXPECT_EQ(k, 2);
  EXPECT_EQ(n, 7);
  EXPECT_TRUE(parse_shard("10000/10000", k, n));
  for (const char* bad : {"", "1", "/", "1/", "/2", "0/2", "3/2", "1/0", "1/10001", "1/2000000000", "1/99999999999",
                          "1/2 ", " 1/2", "+1/2", "1/-2", "1/2/3", "1.0/2", "a/b"})
    EXPECT_FALSE(parse_shard(bad, k, n)) << bad;
}

// A report that claims more shards or cases than a check run takes is refused as it is read, naming the
// field (before merge sizes anything by it); merge refuses such a Report made in code too.
TEST(Report, ReadingRefusesCountsNoCheckRunHas) {
  using nlohmann::json;
  const json good = json::parse(to_json(shard(1, 2, {{0, "HH"}})));
  auto refusal = [&](const char* key, const json& value) {
    json j = good;
    j[key] = value;
    try {
      from_json(j.dump());
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  EXPECT_EQ(refusal("shard", "1/2000000000"), "\"shard\": \"1/2000000000\" is not K/N with 1 <= K <= N <= 10000");
  EXPECT_EQ(refusal("shard", "3/2"), "\"shard\": \"3/2\" is not K/N with 1 <= K <= N <= 10000");
  EXPECT_EQ(refusal("shard", "1/99999999999"), "\"shard\": \"1/99999999999\" is not K/N with 1 <= K <= N <= 10000");
  EXPECT_EQ(refusal("shard", std::string("1/2\n") + std::string(100, 'x')).find('\n'), std::string::npos);
  EXPECT_EQ(refusal("cases_requested", 2000000000), "\"cases_requested\" out of [1, 1000000000]");
  EXPECT_EQ(refusal("cases_requested", 5000000000LL), "\"cases_requested\" out of [1, 1000000000]");
  EXPECT_EQ(refusal("cases_requested", 0), "\"cases_requested\" out of [1, 1000000000]");
  EXPECT_EQ(refusal("cases_requested", 9), "read");
  Report huge = shard(1, 2, {{0, "HH"}});
  huge.shard_count = 2000000000;
  EXPECT_EQ(message({huge}), "shard 1/2000000000 is not K/N with 1 <= K <= N <= 10000");
}

// A failure's case index and repro command are checked as they are read: a tampered one never reaches a
// merged report (a case index of 1e20 once printed as -2147483648).
TEST(Report, ReadingRefusesAFailureCheckNeverWrites) {
  using nlohmann::json;
  const json good = json::parse(to_json(shard(1, 1, {{0, "HF"}}, 0)));
  auto refusal = [&](const char* key, const json& value) {
    json j = good;
    j["failure"][key] = value;
    try {
      from_json(j.dump());
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  const std::string index = "a failure's \"case_index\" is not an integer in [0, 1000000000]";
  EXPECT_EQ(refusal("case_index", 1e20), index);
  EXPECT_EQ(refusal("case_index", 2.5), index);
  EXPECT_EQ(refusal("case_index", -3), index);
  EXPECT_EQ(refusal("case_index", "0"), index);
  EXPECT_EQ(refusal("case_index", 4), "read");
  EXPECT_EQ(refusal("repro", "rm -rf ~"), "a failure's \"repro\" is not a ckverify repro command: \"rm -rf ~\"");
  EXPECT_EQ(refusal("repro", "PYTHONPATH='/x' ckverify repro 'r.json'"), "read");
  EXPECT_EQ(refusal("repro", ""), "read");  // no file was written for it
}

TEST(Report, ReadingRefusesMalformedAndDeepInputInOneLine) {
  for (const std::string& text :
       {std::string("{\"tool\": \"ckverify\""), std::string("[1, 2]"), std::string("{}"),
        std::string(100000, '[') + std::string(100000, ']'), std::string("{\"tool\": \"ckverify\", \"command\": 3}")}) {
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
