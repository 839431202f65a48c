// properties/ranks.cpp: check_case_as_ranks (property.hpp), the parent side of a Case with tp or dp > 1;
// the ranks' side is ckverify's hidden subcommand `rank` (verifier/cli/rank_case.hpp).

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "properties/property.hpp"
#include "verifier/dist/ranks.hpp"

namespace ckv {
using nlohmann::json;

std::string rank_answer_path(const std::string& dir, int rank) {
  return dir + "/answer" + std::to_string(rank) + ".json";
}

std::string rank_progress_path(const std::string& dir) {
  return dir + "/progress.json";
}

namespace {
// Reads rank 0's progress file now and then while the ranks run, and reports what changed.
struct ProgressRelay {
  BaselineProgress report;
  std::string path;
  std::string last;
  std::chrono::steady_clock::time_point next{};
  void operator()() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next) return;
    next = now + std::chrono::milliseconds(50);
    std::ifstream in(path);
    std::string line;
    if (!std::getline(in, line) || line == last) return;
    last = line;
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("done") || !j.contains("of") || !j.contains("s") || !j["done"].is_number() ||
        !j["of"].is_number() || !j["s"].is_number())
      return;
    report(j["done"].get<int>(), j["of"].get<int>(), j["s"].get<double>());
  }
};
}  // namespace

std::vector<Finding> check_case_as_ranks(const Case& c, const std::string& exe, std::chrono::seconds ranks_deadline) {
  const dist::LaunchDir dir("ckverify-ranks");
  if (!dir.made()) throw EnvironmentError("cannot create a temporary directory in " + dir.path());
  const std::string& tmpl = dir.path();
  const std::string case_file = tmpl + "/case.json";
  {
    std::ofstream out(case_file, std::ios::binary | std::ios::trunc);
    out << to_json(c) << "\n";
    if (!out.flush()) throw EnvironmentError("cannot write " + case_file);
  }
  dist::RankLaunch launch;
  launch.exe = exe;
  launch.args = {"rank", "--case", case_file, "--answer-dir", tmpl, "--threads", "1"};
  launch.world = c.ranks();
  launch.dir = tmpl;
  launch.deadline = ranks_deadline;
  // Rank 0's baseline progress, passed on: a worker tells a Case too slow for its per-case timeout from
  // a run under test that hangs by it (cli/workers.cpp).
  if (const BaselineProgress report = get_baseline_progress())
    launch.while_waiting = ProgressRelay{report, rank_progress_path(tmpl), {}, {}};
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks(launch);
  // What the ranks said of themselves comes first: an environment error or a ckverify bug on any rank
  // (the others then fail for want of it, and their failures are consequences).
  std::string findings;
  for (int r = 0; r < c.ranks(); ++r) {
    std::ifstream in(rank_answer_path(tmpl, r));
    std::string line;
    if (!std::getline(in, line) || line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("error")) {
      const std::string what = "rank " + std::to_string(r) + ": " + j.value("error", std::string());
      if (j.value("kind", std::string()) == "environment") throw EnvironmentError(what);
      throw std::runtime_error(what + " (case: " + to_line(c) + ")");
    }
    if (r == 0) findings = line;
  }
  if (const dist::RankOutcome* f = dist::first_failure(outcomes)) {
    if (const int sig = f->outside_signal())
      throw EnvironmentError("rank " + std::to_string(f->rank) + " was stopped by signal " + std::to_string(sig) +
                             " (" + ::strsignal(sig) +
                             ") from outside ckverify (a user, a service manager or the kernel's out-of-memory "
                             "killer); nothing was judged");
    return {Finding::fail("completes", -1, "rank " + std::to_string(f->rank),
                          "the run under test ran as " + std::to_string(c.ranks()) + " ranks and " + f->describe())};
  }
  if (findings.empty()) throw std::runtime_error("rank 0 ended without an answer (case: " + to_line(c) + ")");
  return findings_from_line(findings);
}

}  // namespace ckv
