// reports/report.hpp: the one report model of a `ckverify check` or `ckverify repro` run, and its
// writers (DESIGN.md: "one report model that the console, JSON and JUnit writers all render").
// Torch-free: the CLI fills a Report from the properties' Findings, the writers only render it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckv::report {

// The most cases (--cases) and shards (--shard K/N: N) a `check` run takes. The CLI refuses more, and a
// report that claims more is refused as one ckverify did not write, before anything is sized by it.
// (1e9 cases: a run's case indices and shard arithmetic stay within int.)
constexpr int kMaxCases = 1000000000;
constexpr int kMaxShards = 10000;

// "K/N" with 1 <= K <= N <= kMaxShards (decimal digits only): index K-1 and count N. False otherwise,
// without reading past kMaxShards (no overflow).
bool parse_shard(const std::string& text, int& index, int& count);

struct PropertyResult {
  std::string name;                // "rng-replay", ...
  int held = 0;                    // cases on which it held
  int not_applicable = 0;          // cases to which it did not apply (never counted as held)
  std::string not_applicable_why;  // the reason, from the first such case
  bool failed = false;
  std::string where, detail;  // of the failure, or a one-line summary when it held (repro)
  // check/repro --skip: set aside (never held, never failed), with the cases on which it would have
  // failed; the reason is the Report's skip_reason.
  bool skipped = false;
  int skipped_failures = 0;
};

struct Failure {
  std::string property, where, detail;
  std::string case_line;
  std::string case_json;  // the shrunk Case, as `ckverify repro` reads it
  std::string repro;      // "ckverify repro FILE", or empty
  uint64_t seed = 0;
  int passing_before = -1;  // check only: passing cases before the first failure
  struct Also {
    std::string property, where, detail;
  };
  std::vector<Also> also;   // the other properties that failed on the Case: where, and the diagnosis
  std::string shrink_note;  // how its shrinking ended (a further finding; the first's is Report::shrink_note)
  std::string trace;        // the implementation's traceback behind it (a Python exception), or empty
  // When the failure did not come back in a fresh worker process: what was found (search.hpp), and
  // the file of Cases its worker ran before it, which `repro --history` replays first (or empty).
  std::string history_note, history_file;
};

struct Report {
  std::string command;  // "check" or "repro"
  std::string impl, plan, device, torch;
  std::string version;      // ckverify's, VERSION+COMMIT (verifier/cli/version.hpp); empty in a report from before it
  std::string only;         // check --only: the Case fields every case took as given
  std::string skip_reason;  // --reason of the properties set aside with --skip (empty: none skipped)
  uint64_t seed = 0;
  int cases_requested = 0, cases_run = 0;
  double time_budget_s = 0.0, elapsed_s = 0.0;
  bool time_budget_hit = false;
  int min_cases = 0;  // check --min-cases: fewer cases run than this is a failed run (0: at least one)
  std::vector<PropertyResult> properties;
  std::optional<Failure> failure;
  // check --max-findings N > 1: the findings after the first, one per property, in the order found.
  std::vector<Failure> further;
  int max_findings = 1;
  std::string shrink_note;  // how shrinking ended ("shrunk in 12 steps", "stopped at the time budget")
  std::string error;        // an internal problem that is neither a pass nor a property failure
  int exit_code = 0;
  int shard_index = 0, shard_count = 1;  // check --shard K/N: index K-1 of N
  // check: every case run, as (index, one letter per property in `properties` order: H held, N not
  // applicable, F failed, - not reported; for a skipped property S, or X where it would have failed);
  // what `merge` rebuilds the unsharded verdict from.
  std::vector<std::pair<int, std::string>> outcomes;
};

std::string to_console(const Report& r);  // what ckverify prints on stdout
std::string to_json(const Report& r);
std::string to_junit_xml(const Report& r);  // one <testsuite>, one <testcase> per property
std::string to_markdown(const Report& r);

// Reads a report that to_json wrote; throws std::invalid_argument with one line naming what is wrong.
Report from_json(const std::string& text);
// `ckverify merge`: the reports of the N shards of one check run (same implementation, plan, device,
// seed, case count and LibTorch; shards 1..N each exactly once) as the report of the unsharded run: the
// first failure in case order, with the counts of the cases up to it. Throws std::invalid_argument.
Report merge(const std::vector<Report>& shards);

}  // namespace ckv::report
