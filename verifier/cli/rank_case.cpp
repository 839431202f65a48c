// verifier/cli/rank_case.cpp: see rank_case.hpp.
#include "verifier/cli/rank_case.hpp"

#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "verifier/cli/workers.hpp"
#include "verifier/dist/ranks.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/parallel.hpp"

namespace ckv::cli {
using nlohmann::json;

namespace {
// How long a rank's collective waits for the others: past it, a rank whose peer hangs or died fails
// (dist/group.hpp), and the ranks are stopped together.
constexpr std::chrono::seconds kCollectiveTimeout{30};
// The ranks' own deadline; the worker's per-case timeout (which kills the worker, and the ranks with it)
// is normally the shorter.
constexpr std::chrono::seconds kRanksDeadline{900};

std::string answer_path(const std::string& dir, int rank) {
  return dir + "/answer" + std::to_string(rank) + ".json";
}

void write_answer(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text << "\n";
    if (!out.flush()) throw std::runtime_error("rank: cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

std::string error_answer(const std::string& what, const char* kind) {
  return json{{"error", what}, {"kind", kind}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

struct RemoveDir {
  std::string dir;
  ~RemoveDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
}  // namespace

std::vector<Finding> run_case_as_ranks(const Case& c) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ckverify-ranks-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw EnvironmentError("cannot create a temporary directory in " + tmpl);
  const RemoveDir remove{tmpl};
  const std::string case_file = tmpl + "/case.json";
  write_answer(case_file, to_json(c));
  dist::RankLaunch launch;
  launch.exe = "/proc/self/exe";
  launch.args = {"rank", "--case", case_file, "--answer-dir", tmpl, "--threads", "1"};
  launch.world = c.tp;
  launch.dir = tmpl;
  launch.deadline = kRanksDeadline;
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks(launch);
  // What the ranks said of themselves comes first: an environment error or a ckverify bug on any rank
  // (the others then fail for want of it, and their failures are consequences).
  std::string findings;
  for (int r = 0; r < c.tp; ++r) {
    std::ifstream in(answer_path(tmpl, r));
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
  if (const dist::RankOutcome* f = dist::first_failure(outcomes))
    return {Finding::fail("completes", -1, "rank " + std::to_string(f->rank),
                          "the run under test ran as " + std::to_string(c.tp) + " ranks and " + f->describe())};
  if (findings.empty()) throw std::runtime_error("rank 0 ended without an answer (case: " + to_line(c) + ")");
  return findings_from_line(findings);
}

CLI::App* add_rank(CLI::App& app, RankArgs& a) {
  CLI::App* rank = app.add_subcommand("rank", "");
  rank->group("");
  rank->add_option("--case", a.case_file)->required();
  rank->add_option("--answer-dir", a.answer)->required();
  rank->add_option("--threads", a.threads);
  return rank;
}

int run_rank(const RankArgs& a) {
  const dist::RankEnv env = dist::RankEnv::from_environment();
  const std::string answer = answer_path(a.answer, env.rank);
  torch::set_num_threads(std::max(1, a.threads));
  try {
    const Case c = load_case_file(a.case_file);
    auto world = dist::Group::join({env.store, env.rank, env.world, kCollectiveTimeout});
    auto impl = make_impl(c.impl);
    const ParallelRun par(world, c);
    const Observations o = observe(c, *impl, &par);
    if (env.rank == 0) write_answer(answer, findings_to_line(judge_all(o)));
  } catch (const EnvironmentError& e) {
    write_answer(answer, error_answer(e.what(), "environment"));
  } catch (const std::exception& e) {
    write_answer(answer, error_answer(e.what(), "internal"));
    return 3;
  }
  return 0;
}

}  // namespace ckv::cli
