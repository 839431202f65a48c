// verifier/cli/workers.hpp: the implementation under test runs in worker processes, never in ckverify's
// own. A worker is ckverify itself (`ckverify worker`, started with posix_spawn from /proc/self/exe, in
// a process group of its own) that loads the implementation once, then reads one numbered Case per
// line and answers each with the findings. The channel is the worker's own: before any implementation
// code runs, the request and answer pipes move to private close-on-exec descriptors, standard input
// becomes /dev/null and standard output goes to stderr, so an implementation that prints, reads stdin
// or closes it cannot touch the answers. Every answer starts with a random token the parent sent first
// and the number of the request it answers, and a process the implementation forked never answers: a
// line that is not such an answer (written by the implementation on a descriptor it does not own) is a
// `completes` failure of the Case, and the worker is replaced. The worker's standard error (and so its
// standard output) is a pipe ckverify drains into its own stderr, bounded (containment.hpp).
// A worker that dies (segfault, abort, an exception escaping everything) or runs a Case past the
// per-case timeout is killed with its process group and replaced; the Case gets a `completes` failure
// naming the signal or the timeout, and the run goes on. A worker killed by SIGKILL that ckverify did
// not send (the out-of-memory killer, a user) is the environment's: EnvironmentError, nothing judged.
// Time a worker spends stopped (SIGSTOP), or that ckverify itself spends suspended, is not counted
// against the per-case timeout. Workers die with ckverify (PR_SET_PDEATHSIG, and a watchdog thread
// for an implementation that clears it), and take their process group with them.
// Results come back in the order of the Cases given, whichever worker ran them, so a search over them
// is the same for any number of workers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "properties/property.hpp"
#include "verifier/cli/containment.hpp"

namespace ckv::cli {

struct WorkerOptions {
  int workers = 1;
  int threads = 1;  // LibTorch intra-op threads in each worker
  double case_timeout_s = 120.0;
  std::string impl;  // loaded by each worker at start; a load error is a usage error (exit 2)
};

using Clock = std::chrono::steady_clock;
// A Case that runs past --case-timeout is the implementation's finding only where the timeout is this
// many times what the Case's run without checkpointing takes here (a verified Case costs a few times
// that); otherwise the Case is too slow for the timeout on this machine (exit 2).
inline constexpr double kSlowFactor = 10.0;

class WorkerPool {
 public:
  explicit WorkerPool(WorkerOptions o);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  // Runs the Cases, results in the Cases' order; a Case not started by `deadline` has no result.
  // Throws EnvironmentError (a Case cannot run on this machine), UsageError (the implementation cannot
  // be loaded) and std::runtime_error (the baseline failed: a ckverify bug).
  std::vector<std::optional<std::vector<Finding>>> run(const std::vector<Case>& cases, Clock::time_point deadline);
  // Starts the first worker, which loads the implementation (throws as run() does when it cannot), so that
  // a spec that does not load is said before anything else; the others start as run() needs them.
  void start_first(Clock::time_point deadline);
  // The Cases that the worker which ran case k of the last run() had run before it, since it started
  // (oldest first): what an implementation keeping state across calls saw before case k.
  std::vector<Case> history_before(size_t k) const;

 private:
  struct Worker;
  bool start(Worker& w, Clock::time_point deadline);  // false: the deadline came first
  void stop(Worker& w);
  // SIGINT, SIGTERM or SIGHUP came: every pool's workers stopped, then ckverify dies of the signal.
  void die_if_stopped();
  WorkerOptions o_;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t seq_ = 0;  // requests sent, numbering them
  // For each case of the last run(): the history of the worker that took it, and its length then.
  std::vector<std::pair<std::shared_ptr<const std::vector<Case>>, size_t>> placed_;
  std::optional<long> oom_at_start_;  // the cgroup's oom_kill count when the pool started
  OutputRelay relay_{2};              // the workers' standard output and error, bounded, to ckverify's stderr
  StopSignals stop_signals_;
};

// `ckverify worker`: the loop a worker runs (started with the requests on fd 0, the answers on fd 3).
// Before it loads the implementation, while it is single-threaded, it forks its rank fork server
// (dist/fork_server.hpp), which starts the ranks of its Cases with tp or dp > 1 as `program` (ckverify's
// main) without exec; CKV_RANK_FORK_SERVER=0 in the environment turns that off (each rank is exec'd).
int worker_main(const std::string& impl, int threads, int (*program)(int argc, char** argv));

// 128 random bits in hex: what every message on a channel from ckverify's own code in an
// implementation's process starts with, so that a line the implementation writes there is told apart.
std::string channel_token();

// ckverify's own executable by its path (what workers and ranks run: they show as ckverify in ps).
std::string self_exe();

}  // namespace ckv::cli
