// verifier/run/amp_audit.hpp: the AMP drift audit (`ckverify audit-amp`). For one Case and each
// precision mode (fp32, bf16, fp16 where this build and device support it), the first training step is
// run without checkpointing and with the implementation under test checkpointing the Case's plan
// (`block` when the Case has none). For every parameter group (a block's parameters, the final norm,
// the head) it reports the error of the gradients against the Eigen fp64 reference fed that run's own
// first-forward masks (relative L2 and max relative), and the drift that checkpointing itself adds:
// the checkpointed run's gradients against the non-checkpointed run's at the same precision.
//
// The drift is judged against what correct runs measurably disagree by: the noise floor (the
// non-checkpointed run repeated with another intra-op thread count: what the hardware and its kernels
// disagree by on their own, 0 on CPU where kernels are deterministic) and the design floor (the drift
// of ckverify's reference reentrant checkpoints on the same Case, which sum shared gradients in the
// autocast dtype where the plain graph sums them in fp32; Cases with gradient hooks have none, as a
// reentrant checkpoint runs a hook twice). Rule (tolerance.hpp, amp_drift_allowance): checkpoint drift
// must not exceed the larger of the noise floor and kAmpDesignFactor times the design floor, per
// precision and group; where both are 0 that means bitwise equality.
#pragma once

#include <string>
#include <vector>

#include "verifier/case/case.hpp"
#include "verifier/impls/interface.hpp"

namespace ckv {

struct AmpRow {
  std::string precision;  // fp32, bf16, fp16
  bool checkpointed = false;
  // "layer3", "blocks" (every block's weights, tied across blocks), "norm_f", "head", "input" (the tied
  // input projection shares head.weight)
  std::string group;
  int position = 0;                    // x for plots: block index (0 for "blocks"), then the groups after the blocks
  double rel_l2 = 0.0, max_rel = 0.0;  // gradient error against fp64
  double drift = 0.0;                  // checkpointed rows: rel-L2 against the non-checkpointed run
  double floor = 0.0;                  // the noise floor of this precision and group (rel-L2)
  double design = 0.0;                 // the design floor (rel-L2; 0 when not measured)
  double allowed = 0.0;                // the drift allowed (amp_drift_allowance)
};

struct AmpAudit {
  std::string case_line, plan;
  int threads_a = 1, threads_b = 2;  // the two thread counts of the noise floor
  std::vector<std::string> precisions;
  std::vector<std::string> skipped;       // "fp16: why"
  std::vector<std::string> design_notes;  // why a design floor was not measured, per precision
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
