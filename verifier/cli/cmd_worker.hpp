// verifier/cli/cmd_worker.hpp: `ckverify worker`, the worker process (workers.hpp) that check, repro and
// faults start; hidden, not for direct use.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace ckv::cli {

struct WorkerArgs {
  std::string impl = "builtin";
  int threads = 1;
};

CLI::App* add_worker(CLI::App& app, WorkerArgs& a);
// `program`: ckverify's main, which the worker's rank fork server runs for each rank (workers.hpp).
int run_worker(const WorkerArgs& a, int (*program)(int argc, char** argv));

}  // namespace ckv::cli
