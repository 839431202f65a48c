// verifier/cli/cmd_train.hpp: `ckverify train`: trains a Case by hand, from its start or a state file,
// to a position, optionally saving the state. Prints every completed step's loss and the digest of the
// whole training state at the end, so runs in different processes can be compared (the cross-process
// resume test does). Runs supervised (supervise.hpp).
#pragma once

#include <string>

#include "verifier/cli/output.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

struct TrainArgs {
  std::string case_path, resume;
  FileArg save;
  int until = -1;  // -1: the end (steps x micro)
  bool until_given = false;
  double stall_timeout = 300;
};

CLI::App* add_train(CLI::App& app, TrainArgs& a);
// What the command line alone decides; throws UsageError.
void finish_train(TrainArgs& a);
int run_train(const TrainArgs& a);

}  // namespace ckv::cli
