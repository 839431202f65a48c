// verifier/cli/cmd_bench.hpp: `ckverify bench`: the per-plan cost of one Case (verifier/run/bench.hpp):
// memory, time, overhead, tokens/s, loss curves; optionally the growth law, the largest batch within a
// memory budget, the gate's verdict per plan and strategy, and a report with plots (bench_report.hpp).
// Runs supervised (supervise.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "verifier/cli/output.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

struct BenchArgs {
  std::string preset, plans, device = "cpu", budget;
  FileArg case_file;  // read before any implementation is loaded, compared with the outputs after
  FileArg json, out_dir;
  std::vector<std::string> impls;  // --impl, repeatable, each a comma list of specs
  int warmup = 1, repeats = 8, max_repeats = 60, threads = 0;
  bool max_repeats_given = false;  // --max-repeats on the command line (else it grows to --repeats)
  double time_cap = 300, target = 0.02;
  bool growth = false, amp = false;
  std::string command;                  // the command line, as the report shows it
  std::vector<std::string> args;        // the arguments after the program's name (the ranks run them again)
  bool as_rank = false;                 // --as-rank (hidden): this process is a rank of such a run
  std::vector<std::string> strategies;  // --strategy SPEC, measured beside the plans
  int verify_cases = 30;                // the gate's verdict per plan and strategy (0: none)
  std::vector<std::string> only;        // Case fields the verification fixes
  double stall_timeout = 300;
  // From the above (finish_bench):
  int64_t memory_budget = 0;  // bytes (0: none)
};

CLI::App* add_bench(CLI::App& app, BenchArgs& a);
// What the command line alone decides; throws UsageError.
void finish_bench(BenchArgs& a);
int run_bench(const BenchArgs& a);

}  // namespace ckv::cli
