// properties/ranks.cpp: check_case_as_ranks (property.hpp), the parent side of a Case with tp or dp > 1;
// the ranks' side is ckverify's hidden subcommand `rank` (verifier/cli/rank_case.hpp).

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "properties/property.hpp"
#include "verifier/dist/fork_server.hpp"

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
  std::vector<dist::RankOutcome> outcomes;
  try {
    outcomes = dist::launch_ranks(launch);
  } catch (const dist::ForkServerKilled& e) {
    throw EnvironmentError(std::string(e.what()) +
                           " from outside ckverify (a user, a service manager or the kernel's out-of-memory "
                           "killer); nothing was judged");
  }
  std::vector<json> answers(static_cast<size_t>(c.ranks()));  // what each rank wrote; null where nothing
  for (int r = 0; r < c.ranks(); ++r) {
    std::ifstream in(rank_answer_path(tmpl, r));
    std::string line;
    if (std::getline(in, line) && !line.empty()) answers[static_cast<size_t>(r)] = json::parse(line, nullptr, false);
  }
  auto error_of = [&](int r) -> std::string {  // the error rank r reported of itself, or ""
    const json& j = answers[static_cast<size_t>(r)];
    return j.is_object() && j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : "";
  };
  auto kind_of = [&](int r) { return answers[static_cast<size_t>(r)].value("kind", std::string()); };
  auto completes = [&](const std::string& rank, const std::string& what) {
    return std::vector<Finding>{Finding::fail(
        "completes", -1, rank, "the run under test ran as " + std::to_string(c.ranks()) + " ranks and " + what)};
  };
  // 1. The environment's: a rank that said so, or one stopped by a signal from outside (its peers then
  // fail for want of it).
  for (int r = 0; r < c.ranks(); ++r)
    if (!error_of(r).empty() && kind_of(r) == "environment")
      throw EnvironmentError("rank " + std::to_string(r) + ": " + error_of(r));
  for (const dist::RankOutcome& o : outcomes)
    if (const int sig = o.outside_signal())
      throw EnvironmentError("rank " + std::to_string(o.rank) + " was stopped by signal " + std::to_string(sig) + " (" +
                             ::strsignal(sig) +
                             ") from outside ckverify (a user, a service manager or the kernel's out-of-memory "
                             "killer); nothing was judged");
  // A rank stopped from outside (SIGSTOP, a debugger) while the others waited for it in a collective,
  // until their collective timeout: what failed is no Case's doing. A run that passed despite a stop is
  // judged as it is.
  const bool all_ok = std::all_of(outcomes.begin(), outcomes.end(),
                                  [](const dist::RankOutcome& o) { return o.status == dist::RankOutcome::Status::ok; });
  for (const dist::RankOutcome& o : outcomes)
    if (o.seen_stopped && !all_ok)
      throw EnvironmentError("rank " + std::to_string(o.rank) +
                             " was stopped from outside ckverify (SIGSTOP, SIGTSTP or a debugger) while the other "
                             "ranks waited for it, and the run ended with " +
                             dist::first_failure(outcomes)->describe() + "; nothing was judged");
  // 2. A rank that crashed or exited without a word of its own (the implementation's signal or exit):
  // what its peers said came after their collectives lost it.
  const dist::RankOutcome* silent = nullptr;
  for (const dist::RankOutcome& o : outcomes)
    if ((o.status == dist::RankOutcome::Status::crashed || o.status == dist::RankOutcome::Status::failed) &&
        error_of(o.rank).empty() && (!silent || o.ended < silent->ended))
      silent = &o;
  if (silent) return completes("rank " + std::to_string(silent->rank), silent->describe());
  // 3. The first error a rank reported of itself, the others having failed for want of it in a collective:
  // the run under test failing on some ranks only (a finding), or ckverify's own (a bug).
  int first = -1;
  double first_at = std::numeric_limits<double>::infinity();
  for (int r = 0; r < c.ranks(); ++r) {
    if (error_of(r).empty()) continue;
    const json& at = answers[static_cast<size_t>(r)].value("at", json());
    const double t = at.is_number() ? at.get<double>() : std::numeric_limits<double>::infinity();
    if (first < 0 || t < first_at) first = r, first_at = t;
  }
  if (first >= 0 && kind_of(first) == "run_failed")
    return completes("rank " + std::to_string(first),
                     "its run failed on rank " + std::to_string(first) + " first: " + error_of(first) +
                         " (the other ranks then failed in a collective waiting for it)");
  if (first >= 0)
    throw std::runtime_error("rank " + std::to_string(first) + ": " + error_of(first) + " (case: " + to_line(c) + ")");
  if (const dist::RankOutcome* f = dist::first_failure(outcomes))
    return completes("rank " + std::to_string(f->rank), f->describe());
  const json& zero = answers.front();
  if (!zero.is_object() || !zero.contains("findings"))
    throw std::runtime_error("rank 0 ended without an answer (case: " + to_line(c) + ")");
  return findings_from_line(zero.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace ckv
