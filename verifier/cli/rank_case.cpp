// verifier/cli/rank_case.cpp: see rank_case.hpp.
#include "verifier/cli/rank_case.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "verifier/cli/output.hpp"
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

// A rank's error, with when it was caught (steady_clock seconds, as RankRunFailed's `at`): the parent
// takes the first rank's error as the cause.
std::string error_answer(const std::string& what, const char* kind, std::optional<double> at = std::nullopt) {
  return json{{"error", what}, {"kind", kind}, {"at", at.value_or(steady_seconds())}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

// Rank 0's baseline progress, for the process that started the ranks (rank_progress_path). A progress
// file that cannot be written costs only the telling of a slow Case from a hang: never an error.
std::string progress_file;
void write_progress(int done, int of, double seconds) {
  try {
    write_atomically(file_arg(progress_file), json{{"done", done}, {"of", of}, {"s", seconds}}.dump());
  } catch (const std::exception&) {
  }
}
}  // namespace

std::vector<Finding> run_case_as_ranks(const Case& c) {
  // The ranks' own deadline is long: the worker's per-case timeout (which kills the worker, and the
  // ranks with it) is normally the shorter.
  return check_case_as_ranks(c, self_exe());
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
  // Named so in ps and top (a rank forked by the worker's fork server has the worker's command line).
  ::prctl(PR_SET_NAME, "ckverify-rank");
  const dist::RankEnv env = dist::RankEnv::from_environment();
  const std::string answer = rank_answer_path(a.answer, env.rank);
  torch::set_num_threads(std::max(1, a.threads));
  try {
    const Case c = load_case_file(a.case_file);
    auto world = dist::Group::join({env.store, env.rank, env.world, kCollectiveTimeout});
    auto impl = make_impl(c.impl);
    const ParallelRun par(world, c);
    if (env.rank == 0) progress_file = rank_progress_path(a.answer), set_baseline_progress(write_progress);
    // The run under test failed on some ranks only: the answer, and the process ends here, with the groups
    // (a collective of theirs may still wait for a peer that never comes, and their teardown would too).
    auto observe_here = [&]() -> Observations {
      try {
        return observe(c, *impl, &par);
      } catch (const RankRunFailed& e) {
        write_atomically(file_arg(answer), error_answer(e.what(), "run_failed", e.at));
        std::fflush(nullptr);
        ::_exit(2);
      }
    };
    const Observations o = observe_here();
    if (env.rank == 0) write_atomically(file_arg(answer), findings_to_line(judge_all(o)));
    // Every rank has its answer out and has read all its peers sent: the process ends here, without
    // LibTorch's teardown (about 80 ms of a rank's life, once per rank per Case).
    world->barrier();
    std::fflush(nullptr);
    ::_exit(0);
  } catch (const EnvironmentError& e) {
    write_atomically(file_arg(answer), error_answer(e.what(), "environment"));
    return 2;  // a failed rank: the launcher stops the others at once instead of at their collective timeout
  } catch (const std::exception& e) {
    write_atomically(file_arg(answer), error_answer(e.what(), "internal"));
    return 3;
  }
  return 0;
}

}  // namespace ckv::cli
