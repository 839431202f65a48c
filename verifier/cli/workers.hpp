// verifier/cli/workers.hpp: the implementation under test runs in worker processes, never in ckverify's
// own. A worker is ckverify itself (`ckverify worker`, started with posix_spawn from /proc/self/exe) that
// loads the implementation once, then reads one Case per line on stdin and answers each with the
// findings on fd 3 (its stdout goes to stderr, so an implementation that prints cannot corrupt the
// answers). A worker that dies (segfault, abort, an exception escaping everything) or runs a Case past
// the per-case timeout is killed and replaced; the Case gets a `completes` failure naming the signal or
// the timeout, and the run goes on. Results come back in the order of the Cases given, whichever worker
// ran them, so a search over them is the same for any number of workers.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "properties/property.hpp"

namespace ckv::cli {

struct WorkerOptions {
  int workers = 1;
  int threads = 1;  // LibTorch intra-op threads in each worker
  double case_timeout_s = 120.0;
  std::string impl;  // loaded by each worker at start; a load error is a usage error (exit 2)
};

using Clock = std::chrono::steady_clock;

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

 private:
  struct Worker;
  void start(Worker& w);
  void stop(Worker& w);
  WorkerOptions o_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// `ckverify worker`: the loop a worker runs (fd 0 requests, fd 3 answers).
int worker_main(const std::string& impl, int threads);

// The Findings of one Case as one JSON line and back (the worker protocol).
std::string findings_to_line(const std::vector<Finding>& fs);
std::vector<Finding> findings_from_line(const std::string& line);

}  // namespace ckv::cli
