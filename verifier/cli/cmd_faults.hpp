// verifier/cli/cmd_faults.hpp: `ckverify faults`, the proof of power (DESIGN.md, "Faults"): every fault
// run through the same search as `check`, pinned to the property that must kill it, with how many
// generated cases it took and the shrunk case.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "verifier/cli/args.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

struct FaultsArgs {
  int cases = 500, jobs = machine_cores();
  std::string seed_text = "1", device = "cpu", plugin;
  std::vector<std::string> only;  // --fault: these faults alone (empty: every one)
  FileArg json;
  double budget = 120, case_timeout = 120;
  // From the above (finish_faults):
  uint64_t seed = 1;
  GateOptions gate;
};

CLI::App* add_faults(CLI::App& app, FaultsArgs& a);
// What the command line alone decides; throws UsageError.
void finish_faults(FaultsArgs& a);
int run_faults(const FaultsArgs& a);

}  // namespace ckv::cli
