// verifier/cli/cmd_worker.cpp: see cmd_worker.hpp.
#include "verifier/cli/cmd_worker.hpp"

#include <CLI/CLI.hpp>

#include "verifier/cli/workers.hpp"

namespace ckv::cli {

CLI::App* add_worker(CLI::App& app, WorkerArgs& a) {
  CLI::App* worker = app.add_subcommand("worker", "");
  worker->group("");
  worker->add_option("--impl", a.impl);
  worker->add_option("--threads", a.threads);
  return worker;
}

int run_worker(const WorkerArgs& a, int (*program)(int argc, char** argv)) {
  return worker_main(a.impl, a.threads, program);
}

}  // namespace ckv::cli
