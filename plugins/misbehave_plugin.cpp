// plugins/misbehave_plugin.cpp: an implementation that breaks the process it runs in, for the isolation
// tests: on its `at`-th segment call (default 1) it segfaults (mode=segv), aborts (abort), hangs
// (hang), throws something that is not a std::exception (throw), exits the process (exit), or forks a
// process that sleeps for five minutes holding the standard streams and carries on (fork), forks a
// process that carries on as well, running the rest of ckverify's code (forkrun), writes forged
// answers and reports on every close-on-exec pipe and exits (forge), reads its standard input to the
// end and closes it, then carries on (stdin), closes every descriptor above stderr and carries on
// (closefds), or runs out of memory (oom: std::bad_alloc, as under RLIMIT_AS); before that it
// checkpoints nothing (runs the segment plainly, which is a correct, memory-hungry "implementation").
#include <csignal>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "verifier/impls/plugin.hpp"

namespace {
class Misbehave : public ckv::CheckpointImpl {
 public:
  Misbehave(std::string mode, int at) : mode_(std::move(mode)), at_(at) {}
  std::vector<torch::Tensor> run(const ckv::SegmentCall& call) override {
    if (++calls_ == at_) {
      if (mode_ == "segv") std::raise(SIGSEGV);
      if (mode_ == "abort") std::abort();
      if (mode_ == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      if (mode_ == "throw") throw 42;
      if (mode_ == "oom") throw std::bad_alloc();
      if (mode_ == "exit") std::exit(0);
      if (mode_ == "fork" && ::fork() == 0) {
        ::sleep(300);
        ::_exit(0);
      }
      if (mode_ == "forkrun") ::fork();
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
  int calls_ = 0;
};

ckv::CheckpointImpl* make(const ckv::PluginOptions& o) {
  std::string mode = "segv";
  int at = 1;
  for (const auto& [k, v] : o) {
    if (k == "mode" && (v == "segv" || v == "abort" || v == "hang" || v == "throw" || v == "exit" || v == "fork" ||
                        v == "forkrun" || v == "forge" || v == "stdin" || v == "closefds" || v == "oom"))
      mode = v;
    else if (k == "at")
      at = std::stoi(v);
    else
      throw std::invalid_argument("unknown option " + k + "=" + v +
                                  " (mode=segv|abort|hang|throw|exit|fork|forkrun|forge|stdin|closefds|oom, at=N)");
  }
  return new Misbehave(mode, at);
}
}  // namespace

CKVERIFY_PLUGIN(make)
