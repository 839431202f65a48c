// verifier/cli/cmd_check.hpp: `ckverify check`: the properties over generated Cases against an
// implementation (or a strategy), every Case run in worker processes; a failure is shrunk to a minimal
// Case, written as a repro file, and reported (console, --json, --junit, --markdown).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "verifier/cli/args.hpp"
#include "verifier/cli/reporting.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

struct CheckArgs {
  std::string impl = "builtin", plan, seed_text = "1", device = "cpu", shard, strategy;
  bool impl_given = false;  // --impl on the command line (even as builtin: exclusive with --strategy)
  int cases = 2000, jobs = machine_cores(), min_cases = 0, max_findings = 1;
  double budget = 180, case_timeout = 120;
  Outputs outputs;
  FileArg repro_file = file_arg("ckverify-repro.json");
  std::vector<std::string> only, skip;
  std::string reason;
  // From the above (finish_check):
  uint64_t seed = 1;
  GateOptions gate;
  Skip skipped;
};

CLI::App* add_check(CLI::App& app, CheckArgs& a);
// What the command line alone decides; throws UsageError.
void finish_check(CheckArgs& a);
int run_check(const CheckArgs& a);

}  // namespace ckv::cli
