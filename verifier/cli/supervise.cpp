// verifier/cli/supervise.cpp: see supervise.hpp.
#include "verifier/cli/supervise.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "verifier/case/case.hpp"
#include "verifier/cli/containment.hpp"
#include "verifier/cli/scratch.hpp"
#include "verifier/cli/workers.hpp"
#include "verifier/dist/proc.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/progress.hpp"

namespace ckv::cli {
namespace {

constexpr int kExitFailed = 1, kExitUsage = 2, kExitInternal = 3;

bool terminal_stderr = ::isatty(STDERR_FILENO) != 0;  // before the child's stderr becomes a pipe

// ---- the child's side ----
int report_fd = -1;
std::string token;  // made by the parent before the fork; every message starts with it
pid_t child_pid = -1;

void send(std::string line) {
  if (::getpid() != child_pid) return;  // a copy the implementation forked: never the child's word
  // false: the parent is gone; PR_SET_PDEATHSIG ends this process
  (void)write_all(report_fd, token + " " + line);
}

void on_progress() {
  static auto last = std::chrono::steady_clock::time_point{};
  const auto now = std::chrono::steady_clock::now();
  if (now - last < std::chrono::milliseconds(200)) return;
  last = now;
  send("p\n");
}

void on_foreign_load(const std::string& spec) {
  std::string s = spec;
  for (char& ch : s)
    if (ch == '\n') ch = ' ';
  send("f" + s + "\n");
}

[[noreturn]] void child(int fd, const int out[2], int own, const std::function<int()>& body) {
  report_fd = fd;
  // The implementation's output (descriptors 1 and 2: Python's print, printf, a process it starts) and
  // the command's own (std::cout, std::cerr) go through the parent on pipes of their own, so that what
  // the implementation prints, bounded there, never crowds out the command's verdict.
  ::dup2(out[0], STDOUT_FILENO), ::dup2(out[1], STDERR_FILENO);
  static FramedStreambuf own_out(own, 'o'), own_err(own, 'e');
  std::cout.rdbuf(&own_out), std::cerr.rdbuf(&own_err), std::clog.rdbuf(&own_err);
  child_pid = ::getpid();
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const pid_t parent = ::getppid();
  if (parent == 1) ::_exit(kExitInternal);  // the parent died before the line above
  // Should the implementation clear PR_SET_PDEATHSIG, the child's group still dies with the parent.
  std::thread([parent] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      if (::getppid() != parent) ::kill(0, SIGKILL);
    }
  }).detach();
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, SIG_DFL);
  // What the command printed reaches its output even when the implementation crashes the child later.
  std::cout.setf(std::ios::unitbuf);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  set_progress_observer(on_progress);
  set_foreign_load_observer(on_foreign_load);
  int rc = kExitInternal;
  try {
    rc = body();
  } catch (...) {
    std::cout.flush(), std::cerr.flush();
    send("u\n");
    ::_exit(kExitInternal);
  }
  std::cout.flush(), std::cerr.flush();
  std::fflush(nullptr);
  send(fmt::format("r{}\n", rc));
  ::_exit(rc);
}

// ---- the parent's side ----
volatile std::sig_atomic_t forwarded_signal = 0;
void on_signal(int sig) {
  forwarded_signal = sig;
}

std::string signal_name(int sig) {
  const char* d = ::strsignal(sig);
  return fmt::format("signal {} ({})", sig, d ? d : "unknown");
}
// The signals that ask a process to stop, which neither ckverify's code nor a crash raises.
bool stop_request(int sig) {
  return sig == SIGTERM || sig == SIGINT || sig == SIGHUP;
}

}  // namespace

bool stderr_is_terminal() {
  return terminal_stderr;
}

int supervise(const SuperviseOptions& o, const std::function<int()>& body) {
  std::cout.flush(), std::cerr.flush();
  terminal_stderr = ::isatty(STDERR_FILENO) != 0;
  token = channel_token();
  const std::string tmpdir = implementation_tmpdir();  // made before the fork, removed by the parent
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  for (int& fd : fds) {  // above the descriptors an implementation would guess at
    const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 100);
    if (high >= 0) ::close(fd), fd = high;
  }
  // The child's stdout and stderr (the implementation's, bounded) and the command's own, framed on one
  // pipe (bounded only against a C++ implementation that writes through std::cout, far above what
  // ckverify prints).
  int pipes[3][2];
  for (auto& p : pipes) output_pipe(p);
  become_subreaper();  // what the child forked and set free comes back here to be killed
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]), ::close(fds[1]);
    for (auto& p : pipes) ::close(p[0]), ::close(p[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    for (auto& p : pipes) ::close(p[0]);
    if (!tmpdir.empty()) ::setenv("TMPDIR", tmpdir.c_str(), 1);
    const int impl_out[2] = {pipes[0][1], pipes[1][1]};
    child(fds[1], impl_out, pipes[2][1], body);
  }
  ::close(fds[1]);
  for (auto& p : pipes) ::close(p[1]);
  std::signal(SIGPIPE, SIG_IGN);  // ckverify's own output closed early must not end the supervision
  OutputRelay relays[4] = {OutputRelay(STDOUT_FILENO), OutputRelay(STDERR_FILENO),
                           OutputRelay(STDOUT_FILENO, size_t{64} << 20, size_t{1} << 20),
                           OutputRelay(STDERR_FILENO, size_t{64} << 20, size_t{1} << 20)};
  int outs[3] = {pipes[0][0], pipes[1][0], pipes[2][0]};
  FrameReader own;
  auto pump = [&](int k) { return k < 2 ? relays[k].pump(outs[k]) : own.pump(outs[k], relays[2], relays[3]); };
  ::setpgid(pid, pid);  // also done by the child; whichever runs first
  struct sigaction sa {
  }, old_int{}, old_term{}, old_hup{};
  sa.sa_handler = on_signal;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int), ::sigaction(SIGTERM, &sa, &old_term), ::sigaction(SIGHUP, &sa, &old_hup);

  using Clock = std::chrono::steady_clock;
  auto last_progress = Clock::now(), last_loop = last_progress;
  std::vector<std::string> foreign;  // specs of code from outside ckverify, in load order
  std::string forged;                // the first line on the pipe that the child's ckverify did not write
  int reported = -1;                 // the child's own exit code
  bool escaped = false, stalled = false, killed_by_us = false;
  int forwarded = 0;
  std::string buffer;
  int fd = fds[0];
  int status = 0;
  Clock::time_point reported_at{};
  // Reads what is on the report pipe and takes in every whole line; false at its end (or an error).
  auto read_report = [&]() {
    char chunk[4096];
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got <= 0) return got < 0 && (errno == EINTR || errno == EAGAIN);
    buffer.append(chunk, static_cast<size_t>(got));
    for (size_t nl; (nl = buffer.find('\n')) != std::string::npos; buffer.erase(0, nl + 1)) {
      std::string line = buffer.substr(0, nl);
      if (line.compare(0, token.size() + 1, token + " ") != 0) {  // not written by ckverify
        if (forged.empty()) forged = line.empty() ? std::string("(an empty line)") : line;
        continue;
      }
      line.erase(0, token.size() + 1);
      if (line.empty()) continue;
      if (line[0] == 'p') last_progress = Clock::now();
      if (line[0] == 'f') foreign.push_back(line.substr(1)), last_progress = Clock::now();
      if (line[0] == 'u') escaped = true;
      if (line[0] == 'r' && reported < 0) {
        try {
          reported = std::stoi(line.substr(1));
        } catch (const std::exception&) {
          reported = kExitInternal;
        }
        reported_at = Clock::now();
      }
    }
    return true;
  };
  for (;;) {
    // One wait over the report pipe and the child's output (poll skips a closed one: fd -1).
    pollfd p[4] = {{fd, POLLIN, 0}};
    for (int k = 0; k < 3; ++k) p[k + 1] = {outs[k], POLLIN, 0};
    const int n = ::poll(p, 4, 100);
    for (int k = 0; n > 0 && k < 3; ++k)
      if (p[k + 1].revents != 0 && !pump(k)) ::close(outs[k]), outs[k] = -1;
    if (n > 0 && p[0].revents != 0 && !read_report()) ::close(fd), fd = -1;
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (forwarded_signal && !forwarded) {
      // The command ends at once, as check's workers do: SIGKILL, not the signal itself, which an
      // implementation may catch (Python turns SIGINT into a KeyboardInterrupt that the command would
      // report as the run's failure, or that code between steps swallows while the run goes on).
      forwarded = forwarded_signal;
      killed_by_us = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
    }
    const auto now = Clock::now();
    // This process itself was stopped (SIGSTOP, a suspended job, a frozen container): the time it did
    // not run is nobody's stall.
    if (now - last_loop > std::chrono::seconds(2)) last_progress += now - last_loop;
    // The child alone stopped (SIGSTOP to it, a debugger): not its stall either.
    else if (dist::process_stopped(pid))
      last_progress += now - last_loop;
    last_loop = now;
    const bool lingering = reported >= 0 && now - reported_at > std::chrono::seconds(5);
    if (!killed_by_us && reported < 0 && !forwarded &&
        std::chrono::duration<double>(now - last_progress).count() > o.stall_timeout_s) {
      stalled = true;
    }
    if (!killed_by_us && (stalled || lingering)) {
      killed_by_us = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
    }
  }
  // What the child wrote on the report pipe just before it ended, which the loop may not have read yet
  // (its exit seen first): a report the child made counts (reading stops where nothing more is there,
  // so a process it forked that holds the pipe open cannot keep this waiting).
  for (pollfd q{fd, POLLIN, 0}; fd >= 0 && ::poll(&q, 1, 0) > 0 && q.revents != 0; q.fd = fd)
    if (!read_report()) ::close(fd), fd = -1;
  if (fd >= 0) ::close(fd);
  ::kill(-pid, SIGKILL);  // whatever the implementation forked dies with the command
  kill_orphans({});       // and what it forked out of the group
  // The rest of the child's output, then the notes of what was left out, before the verdict.
  for (int k = 0; k < 3; ++k)
    if (outs[k] >= 0) pump(k), ::close(outs[k]), outs[k] = -1;
  for (auto& r : relays) r.finish();
  ::sigaction(SIGINT, &old_int, nullptr), ::sigaction(SIGTERM, &old_term, nullptr),
      ::sigaction(SIGHUP, &old_hup, nullptr);

  // The exit code the child reported counts when the child then ended with it (or lingered after it
  // and was killed); anything else means the report was not the child's last word.
  // The child leaves with _exit right after its report, so a child still running 5 s after one did not
  // make it.
  const bool ended_as_reported = reported >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == (reported & 0xff);
  const bool outlived_report = reported >= 0 && killed_by_us && !stalled && !forwarded;
  // Interrupted (SIGINT, SIGTERM, SIGHUP; the child killed above): 128 + the signal.
  if (forwarded) return 128 + forwarded;
  if (ended_as_reported && forged.empty()) return reported;
  const std::string who =
      foreign.empty() ? "" : "the implementation " + sanitize(foreign.back(), 200) + " (loaded in this run)";
  std::string what;
  if (outlived_report)
    what =
        "kept running after an exit code was reported on ckverify's pipe, which ckverify's own code never does "
        "(the implementation wrote the report, or a process it forked did)";
  else if (!forged.empty())
    what = fmt::format(
        "wrote on ckverify's report pipe: a line ckverify did not write (\"{}\"); the implementation, or a process "
        "it forked, writes on descriptors it does not own",
        sanitize(forged, 60));
  else if (stalled)
    what = fmt::format("made no progress for {:g} s (a hang; --stall-timeout raises the limit for slower steps)",
                       o.stall_timeout_s);
  else if (escaped)
    what = "threw something that is not a std::exception";
  else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && !killed_by_us) {
    std::cerr << "ckverify " << o.command
              << ": cannot run here: the run was killed by SIGKILL from outside ckverify (the kernel's "
                 "out-of-memory killer under a memory limit, or a user); nothing was judged"
              << std::endl;
    return kExitUsage;
  } else if (WIFSIGNALED(status) && stop_request(WTERMSIG(status))) {
    // Not forwarded by this process (that returned above), so sent to the child from outside: a user
    // or a service manager stopping it, as check's workers count it (workers.cpp).
    std::cerr << "ckverify " << o.command << ": cannot run here: the run was stopped by "
              << signal_name(WTERMSIG(status)) << " from outside ckverify; nothing was judged" << std::endl;
    return kExitUsage;
  } else if (WIFSIGNALED(status))
    what = "crashed the run: " + signal_name(WTERMSIG(status));
  else if (WIFEXITED(status))
    what =
        fmt::format("ended the process (exit status {}) before `ckverify {}` finished", WEXITSTATUS(status), o.command);
  else
    what = "stopped the run";
  if (!who.empty()) {
    std::cout << "FAIL: " << who << " " << what << std::endl;
    return kExitFailed;
  }
  if (stalled) {
    std::cerr << "ckverify " << o.command << ": cannot run here: the run " << what << std::endl;
    return kExitUsage;
  }
  std::cerr << "ckverify " << o.command << ": internal error: ckverify's own code " << what << std::endl;
  return kExitInternal;
}

}  // namespace ckv::cli
