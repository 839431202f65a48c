// plugins/misbehave_plugin.cpp: an implementation that breaks the process it runs in, for the isolation
// tests: on its `at`-th segment call (default 1) it segfaults (mode=segv), aborts (abort), hangs
// (hang), throws something that is not a std::exception (throw), throws a std::runtime_error (raise), exits
// the process (exit), or forks a
// process that sleeps for five minutes holding the standard streams and carries on (fork), forks a
// process that carries on as well, running the rest of ckverify's code (forkrun), writes forged
// answers and reports on every close-on-exec pipe and exits (forge), reads its standard input to the
// end and closes it, then carries on (stdin), closes every descriptor above stderr and carries on
// (closefds), runs out of memory (oom: std::bad_alloc, as under RLIMIT_AS), writes 8 MiB to each of its
// standard output and error and carries on (flood), forks a process that leaves its process group
// (setsid) and sleeps for five minutes holding the standard streams, and carries on (setsid), or hangs
// in the first process to create the file `marker` (writing its pid there) and carries on in the others
// (hangonce), starts a thread that writes to its standard output until the process ends (spew), stops
// itself with SIGSTOP (stopself), or forks a daemon (a child that calls setsid and forks a grandchild
// sleeping five minutes, then exits) and carries on (daemon); before that it checkpoints nothing (runs the segment
// plainly, which is a correct, memory-hungry "implementation"). With rank=R, only on rank R of a tp/dp Case
// (elsewhere it never misbehaves).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "verifier/impls/plugin.hpp"

namespace {
class Misbehave : public ckv::CheckpointImpl {
 public:
  Misbehave(std::string mode, int at, std::string marker, bool here)
      : mode_(std::move(mode)), at_(at), marker_(std::move(marker)), here_(here) {}
  std::vector<torch::Tensor> run(const ckv::SegmentCall& call) override {
    if (++calls_ == at_ && here_) {
      if (mode_ == "segv") std::raise(SIGSEGV);
      if (mode_ == "abort") std::abort();
      if (mode_ == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      if (mode_ == "throw") throw 42;
      if (mode_ == "raise") throw std::runtime_error("misbehave: raised on purpose");
      if (mode_ == "oom") throw std::bad_alloc();
      if (mode_ == "exit") std::exit(0);
      if (mode_ == "fork" && ::fork() == 0) {
        ::sleep(300);
        ::_exit(0);
      }
      if (mode_ == "forkrun") ::fork();
      if (mode_ == "flood") {
        const std::string line(1023, 'x');
        for (int k = 0; k < 8 * 1024; ++k)
          std::fprintf(stderr, "%s\n", line.c_str()), std::printf("%s\n", line.c_str());
        std::fflush(nullptr);
      }
      if (mode_ == "setsid" && ::fork() == 0) {
        ::setsid();
        ::sleep(300);
        ::_exit(0);
      }
      if (mode_ == "spew")
        std::thread([] {
          const std::string block(1 << 16, 'z');
          for (;;) (void)!::write(STDOUT_FILENO, block.data(), block.size());
        }).detach();
      if (mode_ == "stopself") ::raise(SIGSTOP);
      if (mode_ == "daemon" && ::fork() == 0) {
        ::setsid();
        if (::fork() == 0) ::sleep(300);
        ::_exit(0);
      }
      if (mode_ == "hangonce") {
        const int fd = ::open(marker_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
          const std::string pid = std::to_string(::getpid()) + "\n";
          (void)!::write(fd, pid.data(), pid.size());
          ::close(fd);
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
      }
      if (mode_ == "forge") {
        const std::string lie = "{\"findings\":[]}\n1 {\"findings\":[]}\nr0\n";
        for (int fd = 3; fd < 1024; ++fd) {  // pipes opened in this process (close-on-exec), not inherited ones
          struct stat st {};
          const int flags = ::fcntl(fd, F_GETFD);
          if (flags >= 0 && (flags & FD_CLOEXEC) && ::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode))
            (void)!::write(fd, lie.data(), lie.size());
        }
        ::_exit(0);
      }
      if (mode_ == "stdin") {
        char buf[4096];
        while (::read(0, buf, sizeof buf) > 0) {
        }
        ::close(0);
      }
      if (mode_ == "closefds")
        for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    }
    return call.fn(call.args);
  }

 private:
  std::string mode_;
  int at_;
  std::string marker_;
  bool here_;
  int calls_ = 0;
};

ckv::CheckpointImpl* make(const ckv::PluginOptions& o) {
  std::string mode = "segv", marker;
  int at = 1, rank = -1;
  for (const auto& [k, v] : o) {
    if (k == "mode" &&
        (v == "segv" || v == "abort" || v == "hang" || v == "throw" || v == "raise" || v == "exit" || v == "fork" ||
         v == "forkrun" || v == "forge" || v == "stdin" || v == "closefds" || v == "oom" || v == "flood" ||
         v == "setsid" || v == "hangonce" || v == "spew" || v == "stopself" || v == "daemon"))
      mode = v;
    else if (k == "at")
      at = std::stoi(v);
    else if (k == "marker")
      marker = v;
    else if (k == "rank")
      rank = std::stoi(v);
    else
      throw std::invalid_argument("unknown option " + k + "=" + v +
                                  " (mode=segv|abort|hang|throw|raise|exit|fork|forkrun|forge|stdin|closefds|oom|"
                                  "flood|setsid|hangonce|spew|stopself|daemon, at=N, marker=PATH, rank=R)");
  }
  if (mode == "hangonce" && marker.empty()) throw std::invalid_argument("mode=hangonce needs marker=PATH");
  // Ranks of a tp/dp Case have CKV_RANK (dist/ranks.hpp); one process is rank 0.
  const char* env_rank = std::getenv("CKV_RANK");
  const bool here = rank < 0 || rank == (env_rank ? std::atoi(env_rank) : 0);
  return new Misbehave(mode, at, marker, here);
}
}  // namespace

CKVERIFY_PLUGIN(make)
