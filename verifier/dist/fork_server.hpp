// verifier/dist/fork_server.hpp: starts ranks without paying the program's start-up each time.
// A rank exec'd afresh loads LibTorch again: about 0.4 s of CPU and 50K page faults per process, most
// of a small Case's cost when it runs as 2 to 4 ranks. A RankForkServer is a copy of this process forked
// while it is still single-threaded and has run nothing of a Case (a worker starts one before it loads
// the implementation); it launches the ranks by fork alone (RankLaunch::entry), so each is the program
// afresh, as exec would start it, with LibTorch already loaded.
// The server runs run_ranks (ranks.hpp) for the process that started it, and answers with the outcomes:
// the deadlines, the grace period, the process group and the ranks' logs are run_ranks's own. The ranks
// are the server's children; the server dies with the process that started it (PR_SET_PDEATHSIG), and
// the ranks with the server. Nothing of the server's is left in a rank: no descriptor but 0, 1 and 2,
// the signal handlers at their defaults (ignored signals stay ignored, as across exec), the environment
// the launching process has when it launches.
#pragma once

#include <sys/types.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "verifier/dist/ranks.hpp"

namespace ckv::dist {

// The server was killed from outside while it ran ranks: what() names it and the signal.
struct ForkServerKilled : std::runtime_error {
  ForkServerKilled(const std::string& what, int signal) : std::runtime_error(what), signal(signal) {}
  int signal;
};

class RankForkServer {
 public:
  // What a rank runs in the server's forked child: the program's main, on {exe, args...}.
  using Entry = int (*)(int argc, char** argv);
  // Forks the server. Null where this process has more than one thread (a fork would copy locks that
  // other threads hold) or the fork fails: the caller then launches ranks itself (run_ranks).
  static std::unique_ptr<RankForkServer> start(Entry entry);
  ~RankForkServer();  // kills the server (and so any ranks it runs) and reaps it
  RankForkServer(const RankForkServer&) = delete;
  RankForkServer& operator=(const RankForkServer&) = delete;

  // run_ranks(launch) in the server, launch.while_waiting called here while it runs (its `entry` and
  // `environment` are set by the server: this process's environment now). Throws what run_ranks throws
  // there (its message); ForkServerKilled where the server was killed by SIGKILL, SIGTERM, SIGINT or
  // SIGHUP (which nothing of ckverify's sends it: from outside; its ranks died with it, so nothing was
  // judged), std::runtime_error where it ended otherwise (a ckverify bug). alive() is false from then on.
  std::vector<RankOutcome> run(const RankLaunch& launch);
  bool alive() const { return fd_ >= 0; }
  pid_t pid() const { return pid_; }

 private:
  RankForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void lost();
  pid_t pid_ = -1;
  int fd_ = -1;  // the socket to the server; -1 once it is gone
  std::string buffer_;
};

// The process's server, if one is installed and alive, launches every run: launch_ranks is run_ranks
// through it, or run_ranks here where none is (or it was lost).
void install_fork_server(std::unique_ptr<RankForkServer> server);
RankForkServer* installed_fork_server();
std::vector<RankOutcome> launch_ranks(const RankLaunch& launch);

}  // namespace ckv::dist
