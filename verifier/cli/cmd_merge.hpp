// verifier/cli/cmd_merge.hpp: `ckverify merge`: the --json reports of the shards of one `check` run
// (--shard K/N) in, the unsharded run's verdict out (console, and the report files asked for).
#pragma once

#include <string>
#include <vector>

#include "verifier/cli/reporting.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

struct MergeArgs {
  std::vector<std::string> inputs;
  Outputs outputs;
};

CLI::App* add_merge(CLI::App& app, MergeArgs& a);
int run_merge(const MergeArgs& a);

}  // namespace ckv::cli
