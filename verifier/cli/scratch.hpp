// verifier/cli/scratch.hpp: the temporary directory of the processes that run an implementation (the
// workers of check/repro/faults, the supervised child of train/bench/audit-amp). TMPDIR points them
// into a directory of ckverify's own under the caller's TMPDIR (or /tmp), which ckverify removes,
// with whatever was left in it, when it exits: those processes leave with _exit, so Python's and
// torch's clean-up never runs (importing torch leaves a directory per process for
// torch.distributed.nn's remote-module template), and an implementation's own temporary files go too.
// When ckverify dies of a stop signal (SIGINT, SIGTERM, SIGHUP) that it handles, it removes it first
// (remove_implementation_tmpdir, once the processes in it are stopped); not after SIGKILL.
#pragma once

#include <string>

namespace ckv::cli {

// The directory, made on first use; empty when it cannot be made (the children then inherit the
// caller's TMPDIR: a temporary directory is never a reason to refuse a run).
const std::string& implementation_tmpdir();
// Removes it now (what exit would do): for a process about to die of a signal, which runs no atexit.
void remove_implementation_tmpdir();

}  // namespace ckv::cli
