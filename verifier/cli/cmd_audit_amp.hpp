// verifier/cli/cmd_audit_amp.hpp: `ckverify audit-amp`: the AMP drift audit (verifier/run/amp_audit.hpp)
// of one Case file, or of generated Cases (the worst figure of each precision, mode and group over
// them). Exit 1 when checkpoint drift exceeds its allowance (amp_drift_allowance: the noise floor, or
// kAmpDesignFactor times the design floor). Runs supervised (supervise.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "verifier/cli/output.hpp"

namespace CLI {
class App;
}

namespace ckv::cli {

struct AuditAmpArgs {
  std::string case_path, impl, plan, seed_text = "1", device = "cpu";
  FileArg json, plot;
  int cases = 50;
  bool cases_given = false;
  double stall_timeout = 300;
  // From the above (finish_audit_amp):
  uint64_t seed = 1;
};

CLI::App* add_audit_amp(CLI::App& app, AuditAmpArgs& a);
// What the command line alone decides; throws UsageError.
void finish_audit_amp(AuditAmpArgs& a);
int run_audit_amp(const AuditAmpArgs& a);

}  // namespace ckv::cli
