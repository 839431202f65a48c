// verifier/dist/ranks.hpp: starts the ranks of a multi-process run and accounts for every one of them.
// Each rank is `exe args...` with CKV_RANK, CKV_WORLD and CKV_STORE (the FileStore path, in `dir`) in
// its environment, its standard output in dir/rank<N>.out and its standard error in dir/rank<N>.err.
// The ranks share one process group of their own. When the deadline passes, or a grace period after
// the first rank fails (the others would otherwise wait in a collective until their own timeout), every
// rank is killed by its pid (also one that left the group) and the group whole. A rank dies with the
// process that started it (PR_SET_PDEATHSIG). What a rank started in the group dies with the run; a
// process that leaves the group (setsid) is out of reach here: containing that is the job of the
// worker that runs the Case (cli/containment.hpp).
// The caller must not ignore SIGCHLD (the exit statuses would be lost: run_ranks throws).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ckv::dist {

struct RankOutcome {
  enum class Status { ok, failed, crashed, timed_out, stopped_after_failure };
  int rank = 0;
  Status status = Status::ok;
  int code = 0;             // exit status (failed) or signal (crashed)
  std::string stderr_tail;  // the last lines it wrote to standard error (bounded)
  int ended = -1;           // the order in which the ranks ended (0 first)
  // Whether the rank was seen stopped (SIGSTOP, SIGTSTP, a debugger) while it ran. run_ranks never stops
  // a rank, so something outside did; its peers' collectives may then have timed out waiting for it.
  bool seen_stopped = false;
  std::string describe() const;  // one line: "rank 1 crashed (signal 6): ..."
  // The signal that stopped the rank from outside, or 0: SIGKILL, SIGTERM, SIGINT or SIGHUP, which
  // run_ranks sends only to ranks it then counts as timed out or stopped, so a user, a service manager
  // or the kernel's out-of-memory killer sent it, never a crash of the rank's own; also the exit status
  // 128 + SIGTERM, SIGINT or SIGHUP of a rank that is a supervised ckverify command (bench's), which
  // ends so when stopped. Such a run judges nothing.
  int outside_signal() const;
};

// A fresh directory of one launch's own under the system's temporary directory (its store file, the
// ranks' logs and answers), removed with what is in it when this goes out of scope. made() is false
// when it could not be created (path() then names the template tried).
class LaunchDir {
 public:
  explicit LaunchDir(const std::string& prefix);  // the directory is prefix-XXXXXX
  ~LaunchDir();
  LaunchDir(const LaunchDir&) = delete;
  LaunchDir& operator=(const LaunchDir&) = delete;
  bool made() const { return made_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool made_ = false;
};

struct RankLaunch {
  std::string exe;
  std::vector<std::string> args;
  int world = 1;
  std::string dir;  // an existing directory of the run's own (the store file and the logs)
  std::chrono::milliseconds deadline{60000};
  std::chrono::milliseconds grace{3000};  // after the first failure, before the rest are killed
  std::function<void()> while_waiting;    // if set, called between the sweeps over the running ranks
  // The ranks' environment (besides CKV_RANK, CKV_WORLD and CKV_STORE); empty: this process's.
  std::vector<std::string> environment;
  // Where set, each rank runs entry({exe, args...}) in the forked child, its exit status what entry
  // returns, instead of exec'ing exe: for a launcher that is single-threaded and has run nothing since
  // its program started (RankForkServer, fork_server.hpp), so that the child is that program afresh
  // without its start-up. Otherwise the child execs exe.
  std::function<int(const std::vector<std::string>& argv)> entry;
};

std::vector<RankOutcome> run_ranks(const RankLaunch& launch);
// The cause: the rank that failed or crashed first (a peer that failed because its partner was gone
// ends later), else one that hung, else one that was stopped; nullptr when every rank succeeded.
const RankOutcome* first_failure(const std::vector<RankOutcome>& outcomes);

// In a rank: its rank, world size and store path from the environment, or throws.
struct RankEnv {
  int rank = 0, world = 1;
  std::string store;
  static RankEnv from_environment();
};

}  // namespace ckv::dist
