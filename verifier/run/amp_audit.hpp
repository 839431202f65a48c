// verifier/run/amp_audit.hpp: the AMP drift audit (`ckverify audit-amp`). For one Case and each
// precision mode (fp32, bf16, fp16 where this build and device support it), the first training step is
// run without checkpointing and with the implementation under test checkpointing the Case's plan
// (`block` when the Case has none). For every parameter group (a block's parameters, the final norm,
// the head) it reports the error of the gradients against the Eigen fp64 reference fed that run's own
// first-forward masks (relative L2 and max relative), and the drift that checkpointing itself adds:
// the checkpointed run's gradients against the non-checkpointed run's at the same precision.
//
// The drift is judged against a measured noise floor, not a guessed number: the non-checkpointed run
// repeated with another intra-op thread count is a run that should agree, and the difference between the
// two is what the hardware and its kernels disagree by on their own. Rule: checkpoint drift must not
// exceed the floor of its precision and group; where the floor is 0 (as on CPU, where kernels are
// deterministic) that means bitwise equality.
#pragma once

#include <string>
#include <vector>

#include "verifier/case/case.hpp"
#include "verifier/impls/interface.hpp"

namespace ckv {

struct AmpRow {
  std::string precision;  // fp32, bf16, fp16
  bool checkpointed = false;
  std::string group;  // "layer3", "norm_f", "head", "input" (the tied input projection shares head.weight)
  int position = 0;   // x for plots: block index, then the groups after the blocks
  double rel_l2 = 0.0, max_rel = 0.0;  // gradient error against fp64
  double drift = 0.0;                  // checkpointed rows: rel-L2 against the non-checkpointed run
  double floor = 0.0;                  // the noise floor of this precision and group (rel-L2)
};

struct AmpAudit {
  std::string case_line, plan;
  int threads_a = 1, threads_b = 2;  // the two thread counts of the noise floor
  std::vector<std::string> precisions;
  std::vector<std::string> skipped;  // "fp16: why"
  std::vector<AmpRow> rows;
  std::vector<std::pair<std::string, double>>
      loss_error;  // per "prec/none" and "prec/checkpointed": |loss - loss64| / |loss64|
  // Rows whose drift exceeds their floor (the audit's verdict), as "bf16 layer3: drift 1e-3 > floor 0".
  std::vector<std::string> exceeded;
  // Runs under test that failed (an implementation that throws is a finding, as in `completes`).
  std::vector<std::string> failed;
};

// Throws EnvironmentError when the Case cannot run here; std::runtime_error when a non-checkpointed run
// fails (a ckverify bug). A failing run under test is recorded in `failed`.
AmpAudit audit_amp(const Case& c, CheckpointImpl& impl);

}  // namespace ckv
