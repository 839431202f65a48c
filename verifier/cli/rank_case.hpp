// verifier/cli/rank_case.hpp: a Case with tp > 1 runs as tp processes (docs/parallel.md). The process that
// would have run it (a worker, or ckverify itself without workers) starts the ranks, ckverify itself under
// the hidden subcommand `rank` (dist/ranks.hpp: each in the ranks' own process group, dying with their
// parent, killed together past the deadline or shortly after the first one fails), and waits. Each rank
// joins a Gloo group over a FileStore in the run's own temporary directory, loads the implementation, and
// runs observe() on its shard (run/parallel.hpp); rank 0 judges the gathered observations and answers.
// A rank that crashes, fails or hangs is a `completes` finding naming it (with the last lines it wrote);
// an environment error or a ckverify bug on any rank is reported as such (exit 2 or 3), never as a finding.
#pragma once

#include <string>
#include <vector>

#include "properties/property.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

// Throws EnvironmentError (the Case cannot run here) and std::runtime_error (a ckverify bug on a rank).
std::vector<Finding> run_case_as_ranks(const Case& c);

struct RankArgs {
  std::string case_file, answer;
  int threads = 1;
};
CLI::App* add_rank(CLI::App& app, RankArgs& a);
int run_rank(const RankArgs& a);

}  // namespace ckv::cli
