// verifier/cli/cmd_repro.hpp: `ckverify repro`: replay one Case file deterministically (in a worker
// process, as `check` runs it) and print the same diagnosis.
#pragma once

#include <string>
#include <vector>

#include "verifier/cli/args.hpp"
#include "verifier/cli/reporting.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

struct ReproArgs {
  std::string case_path;
  Outputs outputs;
  double case_timeout = 120;
  std::vector<std::string> skip;
  std::string reason;
  std::string history_path;
  // From the above (finish_repro):
  Skip skipped;
};

CLI::App* add_repro(CLI::App& app, ReproArgs& a);
// What the command line alone decides; throws UsageError.
void finish_repro(ReproArgs& a);
int run_repro(const ReproArgs& a);

}  // namespace ckv::cli
