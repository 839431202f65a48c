// verifier/cli/workers.cpp: see workers.hpp.
#include "verifier/cli/workers.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "verifier/cli/containment.hpp"
#include "verifier/cli/output.hpp"
#include "verifier/cli/scratch.hpp"
#include "verifier/cli/search.hpp"
#include "verifier/dist/fd_lines.hpp"
#include "verifier/dist/fork_server.hpp"
#include "verifier/dist/proc.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/progress.hpp"

extern char** environ;

namespace ckv::cli {
namespace {
using nlohmann::json;

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return fmt::format("killed by signal {} ({})", sig, name ? name : "unknown");
  }
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return "stopped";
}

}  // namespace

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw EnvironmentError("cannot find ckverify's own executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

namespace {
// The worker's private ends of the channel, moved off fd 0 and fd 3 before any implementation code runs.
int request_fd = -1, answer_fd = -1;
// While a Case runs: the start of its answers ("TOKEN SEQ "), for the baseline's progress; the worker's pid
// (a process the implementation forked never writes).
std::string progress_prefix;
pid_t worker_pid = -1;
void report_baseline(int done, int of, double seconds) {
  if (progress_prefix.empty() || ::getpid() != worker_pid) return;
  write_all(answer_fd,
            progress_prefix + json{{"baseline", {{"done", done}, {"of", of}, {"s", seconds}}}}.dump() + "\n");
}

using dist::read_line;

void kill_own_group(int) {
  // The worker leads its process group (the parent starts it so): what the implementation forked dies
  // with it. A worker started some other way kills only itself.
  ::kill(::getpgrp() == ::getpid() ? 0 : ::getpid(), SIGKILL);
}
}  // namespace

int worker_main(const std::string& impl, int threads, int (*program)(int argc, char** argv)) {
  // A worker never outlives ckverify, even one killed with SIGKILL while this worker hangs in a case:
  // the parent's death sends SIGTERM, which kills the worker's whole process group; a watchdog thread
  // does the same should the implementation clear PR_SET_PDEATHSIG or take over SIGTERM.
  std::signal(SIGTERM, kill_own_group);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  const pid_t parent = ::getppid();
  if (parent == 1) return 0;
  if (const char* off = std::getenv("CKV_RANK_FORK_SERVER"); !off || std::string(off) != "0")
    dist::install_fork_server(dist::RankForkServer::start(program));
  std::thread([parent] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      if (::getppid() != parent) kill_own_group(0);
    }
  }).detach();
  // The channel moves to private descriptors, closed on exec; the implementation sees /dev/null as its
  // standard input and its standard output goes to stderr, so it can neither read the requests, nor
  // close them, nor write into the answers by printing.
  request_fd = ::fcntl(0, F_DUPFD_CLOEXEC, 100);
  answer_fd = ::fcntl(3, F_DUPFD_CLOEXEC, 100);
  if (request_fd < 0 || answer_fd < 0) return 3;
  ::close(3);
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null >= 0) ::dup2(null, 0), ::close(null);
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  // Every answer carries the token the parent sent first (before any implementation code ran) and the
  // number of the request it answers; a process the implementation forked never answers.
  const pid_t self = ::getpid();
  worker_pid = self;
  std::string buffer, token;
  if (!read_line(request_fd, buffer, token)) return 0;
  auto answer = [&](const std::string& seq, const std::string& payload) {
    if (::getpid() != self) ::_exit(0);
    if (!write_all(answer_fd, token + " " + seq + " " + payload + "\n")) std::_Exit(0);  // the parent is gone
  };
  auto error = [](const std::string& what, const char* kind) {
    return json{{"error", what}, {"kind", kind}}.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  torch::set_num_threads(std::max(1, threads));
  try {
    make_impl(impl);
  } catch (const std::exception& e) {
    answer("0", error(e.what(), "usage"));
    return 0;
  }
  // The ready answer names the rank fork server: stopped from outside, it holds up the worker's Case.
  const dist::RankForkServer* server = dist::installed_fork_server();
  answer("0", json{{"ready", true}, {"rank_server", server ? server->pid() : 0}}.dump());
  std::string line;
  while (read_line(request_fd, buffer, line)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) return 3;
    const std::string seq = line.substr(0, space);
    progress_prefix = token + " " + seq + " ";
    set_baseline_progress(report_baseline);
    try {
      answer(seq, findings_to_line(run_checks(case_from_json(line.substr(space + 1)))));
    } catch (const EnvironmentError& e) {
      answer(seq, error(e.what(), "environment"));
    } catch (const std::exception& e) {
      answer(seq, error(e.what(), "internal"));
    }
  }
  return 0;
}

struct WorkerPool::Worker {
  pid_t pid = -1;
  pid_t rank_server = 0;   // its rank fork server (dist/fork_server.hpp), 0 if none
  int to = -1, from = -1;  // request pipe (write end), answer pipe (read end)
  int err = -1;            // the read end of its standard output and error (containment.hpp)
  std::string buffer;
  std::string token;  // sent first; every answer starts with it
  int task = -1;      // index of the Case it runs, -1 when idle
  int last = -1;      // index of the Case it ran last in this run(), -1 if none
  uint64_t seq = 0;   // the number of the request it runs
  // The progress of its Case's baseline (set_baseline_progress): steps done, of how many, in seconds.
  bool baseline_started = false;
  int baseline_done = 0, baseline_of = 0;
  double baseline_s = 0.0;
  std::shared_ptr<std::vector<Case>> history = std::make_shared<std::vector<Case>>();  // since it started
  Clock::time_point deadline, checked;
  bool as_ranks = false;               // its Case runs as ranks (tp or dp > 1)
  Clock::time_point children_checked;  // when its children were last looked at for a stopped rank
  bool child_stopped = false;          // what that look found
};

std::string channel_token() {
  std::random_device rd;
  std::string t;
  for (int k = 0; k < 4; ++k) t += fmt::format("{:08x}", rd());
  return t;
}

namespace {

// The cgroup's count of out-of-memory kills (cgroup v2 memory.events), where there is one.
std::optional<long> oom_kills() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cg, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path.empty()) return std::nullopt;
  std::ifstream ev("/sys/fs/cgroup" + path + "/memory.events");
  std::string key;
  long n = 0;
  while (ev >> key >> n)
    if (key == "oom_kill") return n;
  return std::nullopt;
}

}  // namespace

namespace {

// Reads what is there; returns false at end of file (the worker is gone).
bool read_some(int fd, std::string& buffer) {
  char chunk[65536];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
    return true;
  }
}

std::optional<std::string> take_line(std::string& buffer) {
  const size_t nl = buffer.find('\n');
  if (nl == std::string::npos) return std::nullopt;
  std::string line = buffer.substr(0, nl);
  buffer.erase(0, nl + 1);
  return line;
}

// The payload of an answer to request `seq`, or nothing when the line is not one the worker wrote.
std::optional<json> payload(const std::string& line, const std::string& token, uint64_t seq) {
  const std::string head = token + " " + std::to_string(seq) + " ";
  if (line.compare(0, head.size(), head) != 0) return std::nullopt;
  json j = json::parse(line.begin() + static_cast<std::ptrdiff_t>(head.size()), line.end(), nullptr, false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

std::string forged(const std::string& line) {
  return fmt::format(
      "wrote on ckverify's answer channel: a line the worker did not write ({} bytes, \"{}\"); the "
      "implementation, or a process it forked, writes on descriptors it does not own",
      line.size(), sanitize(line, 60));
}
}  // namespace

namespace {
// The pools alive in this process (a search's own, and the fresh one that confirms a finding): every
// one's workers are ckverify's children, which kill_orphans must leave alone.
std::vector<WorkerPool*>& live_pools() {
  static std::vector<WorkerPool*> pools;
  return pools;
}
}  // namespace

WorkerPool::WorkerPool(WorkerOptions o) : o_(std::move(o)), oom_at_start_(oom_kills()) {
  std::signal(SIGPIPE, SIG_IGN);  // a worker that died must not take ckverify with it
  become_subreaper();             // what a worker forked and set free comes back here to be killed
  for (int i = 0; i < std::max(1, o_.workers); ++i) workers_.push_back(std::make_unique<Worker>());
  live_pools().push_back(this);
}

void WorkerPool::start_first(Clock::time_point deadline) {
  if (!workers_.empty() && workers_.front()->pid < 0) start(*workers_.front(), deadline);
}

WorkerPool::~WorkerPool() {
  for (auto& w : workers_) stop(*w);
  relay_.finish();
  auto& pools = live_pools();
  pools.erase(std::remove(pools.begin(), pools.end(), this), pools.end());
  die_if_stopped();
}

void WorkerPool::die_if_stopped() {
  if (!StopSignals::pending()) return;
  for (WorkerPool* pool : live_pools()) {
    for (auto& w : pool->workers_) pool->stop(*w);
    pool->relay_.finish();
  }
  remove_implementation_tmpdir();  // the processes in it are gone; dying of the signal runs no atexit
  stop_signals_.die();
}

void WorkerPool::stop(Worker& w) {
  if (w.pid > 0) {
    ::kill(-w.pid, SIGKILL);  // its process group: what the implementation forked goes too
    ::kill(w.pid, SIGKILL);
    int status = 0;
    while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (w.to >= 0) ::close(w.to);
  if (w.from >= 0) ::close(w.from);
  if (w.err >= 0) relay_.pump(w.err), ::close(w.err);
  const bool had_process = w.to >= 0;
  w = Worker{};
  if (had_process) {  // processes the implementation forked out of the worker's group
    std::vector<pid_t> keep;
    for (const WorkerPool* pool : live_pools())
      for (const auto& other : pool->workers_)
        if (other->pid > 0) keep.push_back(other->pid);
    kill_orphans(keep);
  }
}

bool WorkerPool::start(Worker& w, Clock::time_point deadline) {
  static const std::string exe = self_exe();
  int req[2], ans[2], err[2];
  cloexec_pipe(req);
  cloexec_pipe(ans);
  output_pipe(err);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, req[0], 0);
  posix_spawn_file_actions_adddup2(&fa, ans[1], 3);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // a process group of its own, killed whole
  posix_spawnattr_setpgroup(&attr, 0);
  const std::string threads = std::to_string(std::max(1, o_.threads));
  std::vector<std::string> args = {"ckverify", "worker", "--impl", o_.impl, "--threads", threads};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment, with TMPDIR in ckverify's own directory for the implementation (scratch.hpp).
  std::vector<std::string> env_store;
  const std::string& tmpdir = implementation_tmpdir();
  for (char** e = environ; *e; ++e)
    if (tmpdir.empty() || std::strncmp(*e, "TMPDIR=", 7) != 0) env_store.emplace_back(*e);
  if (!tmpdir.empty()) env_store.push_back("TMPDIR=" + tmpdir);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(req[0]);
  ::close(ans[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(req[1]);
    ::close(ans[0]);
    ::close(err[0]);
    throw std::runtime_error(std::string("cannot start a worker process: ") + std::strerror(rc));
  }
  w.pid = pid, w.to = req[1], w.from = ans[0], w.err = err[0];
  w.token = channel_token();
  if (!write_all(w.to, w.token + "\n")) {
    stop(w);
    throw std::runtime_error("a worker process ended before it was sent its first request");
  }
  // The worker loads the implementation first and says whether it could.
  // Loading counts against the run's time budget: a load still going at the deadline is stopped and
  // the run ends there, as a Case running at the deadline does.
  const auto limit = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(std::max(60.0, o_.case_timeout_s)));
  const auto until = std::min(limit, deadline);
  for (;;) {
    if (auto line = take_line(w.buffer)) {
      const auto j = payload(*line, w.token, 0);
      if (j && j->contains("ready")) {
        if (j->contains("rank_server") && (*j)["rank_server"].is_number_integer())
          w.rank_server = (*j)["rank_server"].get<pid_t>();
        return true;
      }
      std::string why = j && j->contains("error") && (*j)["error"].is_string()
                            ? (*j)["error"].get<std::string>()
                            : "while loading, the implementation " + forged(*line);
      stop(w);
      throw UsageError(sanitize(o_.impl, 200) + ": " + sanitize(why, 300));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p[2] = {{w.from, POLLIN, 0}, {w.err, POLLIN, 0}};
    const int ready = left <= 0 ? 0 : ::poll(p, w.err >= 0 ? 2 : 1, static_cast<int>(left));
    if (ready > 0 && p[1].revents != 0 && !relay_.pump(w.err)) ::close(w.err), w.err = -1;
    if (ready > 0 && p[0].revents == 0) continue;  // output only
    if (ready < 0 && errno == EINTR) {
      die_if_stopped();
      continue;
    }
    if (ready <= 0) {
      stop(w);
      if (until < limit) return false;  // the budget, not the load limit
      throw UsageError(fmt::format("{}: loading the implementation took longer than {:g} s", sanitize(o_.impl, 200),
                                   std::max(60.0, o_.case_timeout_s)));
    }
    if (!read_some(w.from, w.buffer)) {
      int status = 0;
      ::waitpid(w.pid, &status, 0);
      w.pid = -1;
      stop(w);
      throw UsageError(sanitize(o_.impl, 200) + ": the worker process " + describe_exit(status) +
                       " while loading the implementation");
    }
  }
}

std::vector<Case> WorkerPool::history_before(size_t k) const {
  if (k >= placed_.size() || !placed_[k].first) return {};
  const auto& [h, n] = placed_[k];
  return std::vector<Case>(h->begin(), h->begin() + static_cast<std::ptrdiff_t>(n));
}

std::vector<std::optional<std::vector<Finding>>> WorkerPool::run(const std::vector<Case>& cases,
                                                                 Clock::time_point deadline) {
  std::vector<std::optional<std::vector<Finding>>> out(cases.size());
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.case_timeout_s));
  size_t next = 0;
  for (auto& w : workers_) w->last = -1;
  placed_.assign(cases.size(), {});
  auto finish = [&](Worker& w, std::vector<Finding> fs) {
    out[static_cast<size_t>(w.task)] = std::move(fs);
    w.last = w.task;
    w.task = -1;
  };
  // The Case the worker ran is a finding of the implementation; the worker is replaced.
  auto lost = [&](Worker& w, const std::string& what) {
    const int task = w.task;
    stop(w);
    w.task = task;
    finish(w, {Finding::fail("completes", -1, "worker process",
                             "the run under test " + what + "; the worker was replaced and the run went on")});
    progress();
  };
  // Waits up to 2 s for a worker whose channel ended; false: it is still alive (it closed its end).
  auto reaped = [&](Worker& w, int& status) {
    for (int k = 0; k < 40; ++k) {
      if (::waitpid(w.pid, &status, WNOHANG) == w.pid) {
        w.pid = -1;
        return true;
      }
      ::usleep(50 * 1000);
    }
    return false;
  };
  // SIGKILL is never the implementation's own crash: the out-of-memory killer, a memory limit, a user.
  // That is the environment's (exit 2) and judges nothing.
  auto unless_killed_from_outside = [&](Worker& w, int status, const char* when) {
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) return;
    const auto oom = oom_kills();
    const std::string why =
        oom && oom_at_start_ && *oom > *oom_at_start_
            ? fmt::format(
                  "the kernel's out-of-memory killer (this cgroup's memory.events counts {} oom_kill "
                  "since the run started)",
                  *oom - *oom_at_start_)
            : std::string("the kernel's out-of-memory killer under a memory limit, or a user");
    stop(w);
    // (A SIGTERM to a worker ends the same way: the worker answers it by killing its own group.)
    throw EnvironmentError("a worker process was killed by SIGKILL from outside ckverify (" + why +
                           "; a SIGTERM to a worker ends it so too) " + when + "; nothing was judged");
  };
  // A worker that died with its Case: the implementation's finding, unless killed from outside.
  auto died = [&](Worker& w) {
    int status = 0;
    if (!reaped(w, status)) {  // alive, with its end of the channel closed
      lost(w, "closed ckverify's answer channel (a descriptor of the worker's own)");
      return;
    }
    unless_killed_from_outside(w, status, "while it ran a case");
    lost(w, "crashed the worker process (" + describe_exit(status) + ")");
  };
  // A worker found gone (or deaf) between cases: what happened to it, in words.
  auto ended = [&](Worker& w) -> std::string {
    int status = 0;
    if (!reaped(w, status)) return "closed its end of ckverify's channel between cases";
    unless_killed_from_outside(w, status, "between cases");
    return "ended the worker process after its case (" + describe_exit(status) + ")";
  };
  auto expected_wake = Clock::now();
  for (;;) {
    die_if_stopped();
    for (auto& w : workers_) {
      if (w->task >= 0 || next >= cases.size() || Clock::now() >= deadline) continue;
      if (w->pid < 0 && !start(*w, deadline)) continue;  // the budget ran out while it loaded
      // The worker between cases: something it did not write arrived after its last answer, it ended,
      // or it no longer reads its requests. That is the implementation's doing in the Case the worker
      // ran last (or, when that was in an earlier batch, in the one it takes now), unless something
      // outside killed it (ended() throws); the worker is replaced.
      auto between = [&](const std::string& what) -> bool {  // true: a fresh worker is ready
        if (w->last >= 0) {
          out[static_cast<size_t>(w->last)] = std::vector<Finding>{Finding::fail(
              "completes", -1, "worker process", "the run under test " + what + "; the worker was replaced")};
          stop(*w);
          return start(*w, deadline);
        }
        w->task = static_cast<int>(next++);
        lost(*w, what);
        return false;
      };
      pollfd p{w->from, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) {
        std::string junk;
        const std::string what = read_some(w->from, junk) ? forged(junk) : ended(*w);
        if (!between(what)) continue;
      }
      const std::string line = std::to_string(seq_ + 1) + " " + json::parse(to_json(cases[next])).dump() + "\n";
      if (!write_all(w->to, line)) {  // the case goes to a fresh worker in the next round
        between("closed ckverify's request channel (" + ended(*w) + ")");
        continue;
      }
      w->task = static_cast<int>(next);
      placed_[next] = {w->history, w->history->size()};
      w->history->push_back(cases[next]);
      w->seq = ++seq_;
      w->baseline_started = false, w->baseline_done = w->baseline_of = 0, w->baseline_s = 0.0;
      w->deadline = Clock::now() + timeout;
      w->checked = Clock::now();
      w->as_ranks = cases[next].ranks() > 1, w->child_stopped = false;
      ++next;
    }
    std::vector<pollfd> polls;
    std::vector<Worker*> busy;
    auto wait_until = Clock::now() + std::chrono::milliseconds(500);  // wakes to see stopped workers
    for (auto& w : workers_)
      if (w->task >= 0) {
        polls.push_back({w->from, POLLIN, 0});
        busy.push_back(w.get());
        wait_until = std::min(wait_until, w->deadline);
      }
    // After the answer channels: every worker's output, busy or idle (a worker blocked on a full pipe
    // would stall, and its output is bounded here).
    std::vector<Worker*> talking;
    for (auto& w : workers_)
      if (w->err >= 0) polls.push_back({w->err, POLLIN, 0}), talking.push_back(w.get());
    if (busy.empty()) {
      if (next >= cases.size() || Clock::now() >= deadline) break;
      continue;  // a worker was replaced between cases: the next Case goes to it
    }
    if (Clock::now() >= deadline) {  // the run's time budget is spent: cases still running get no result
      for (Worker* w : busy) {
        out[static_cast<size_t>(w->task)].reset();
        stop(*w);
      }
      break;
    }
    wait_until = std::min(wait_until, deadline);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait_until - Clock::now()).count() + 1;
    expected_wake = std::max(Clock::now(), wait_until);
    const int n = ::poll(polls.data(), polls.size(), static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30)));
    if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    for (size_t k = 0; n > 0 && k < talking.size(); ++k)
      if (polls[busy.size() + k].revents != 0 && !relay_.pump(talking[k]->err))
        ::close(talking[k]->err), talking[k]->err = -1;
    const auto now = Clock::now();
    // ckverify itself did not run (a suspended job, a frozen container): the time is no case's.
    if (now > expected_wake + std::chrono::seconds(1))
      for (Worker* w : busy) w->deadline += now - expected_wake;
    for (size_t k = 0; k < busy.size(); ++k) {
      Worker& w = *busy[k];
      // A worker, its rank fork server or a rank (a child of either) stopped on its own (SIGSTOP to it, a
      // debugger) does not spend its Case's time. The ranks are looked for every 250 ms (a scan of /proc)
      // while a Case runs as ranks; a stopped rank whose peers time out waiting for it is the
      // environment's (properties/ranks.cpp).
      if (w.as_ranks && now - w.children_checked >= std::chrono::milliseconds(250)) {
        w.children_checked = now;
        w.child_stopped = dist::stopped_child({w.pid, w.rank_server}) != 0;
      }
      if (w.child_stopped || dist::process_stopped(w.pid) ||
          (w.rank_server > 0 && dist::process_stopped(w.rank_server)))
        w.deadline += now - w.checked;
      w.checked = now;
      if (n > 0 && polls[k].revents != 0) {
        if (!read_some(w.from, w.buffer)) {  // the worker died with the Case
          died(w);
          continue;
        }
        std::optional<std::string> line;
        bool forged_progress = false;
        // The baseline's progress lines come before the answer.
        while ((line = take_line(w.buffer))) {
          const auto j = payload(*line, w.token, w.seq);
          if (!j || !j->contains("baseline")) break;
          const json& b = (*j)["baseline"];
          if (j->size() != 1 || !b.is_object() || !b.value("done", json()).is_number_integer() ||
              !b.value("of", json()).is_number_integer() || !b.value("s", json()).is_number()) {
            forged_progress = true;
            break;
          }
          w.baseline_started = true;
          w.baseline_done = b["done"].get<int>(), w.baseline_of = b["of"].get<int>();
          w.baseline_s = b["s"].get<double>();
        }
        if (forged_progress) {
          lost(w, forged(*line));
          continue;
        }
        if (line) {
          const auto j = payload(*line, w.token, w.seq);
          if (!j || !w.buffer.empty()) {
            lost(w, forged(j ? w.buffer : *line));
            continue;
          }
          if (j->contains("error")) {
            const std::string why = (*j)["error"].is_string() ? (*j)["error"].get<std::string>() : j->dump();
            if (j->value("kind", "") == "environment") throw EnvironmentError(why);
            throw std::runtime_error(why);
          }
          std::vector<Finding> fs;
          try {
            fs = findings_from_line(j->dump());
          } catch (const std::exception&) {
            lost(w, forged(*line));
            continue;
          }
          finish(w, std::move(fs));
          progress();  // a Case verified (the supervisor of bench's verified column: supervise.hpp)
          continue;
        }
        if (w.buffer.size() > (64u << 20)) {
          lost(w, forged(w.buffer));
          continue;
        }
      }
      if (Clock::now() >= w.deadline) {
        // Once the runs are set up, blamed on the implementation only where the timeout is kSlowFactor times
        // what the Case's baseline (which never runs it) takes here; otherwise the Case is too slow for the
        // timeout on this machine (on ranks, rank 0's baseline: check_case_as_ranks passes its progress on).
        // Before that (the implementation made for the Case, the trainers set up) it is the implementation's,
        // as a hang.
        const Case& c = cases[static_cast<size_t>(w.task)];
        const double estimate =
            w.baseline_done > 0 ? w.baseline_s / w.baseline_done * std::max(w.baseline_done, w.baseline_of) : 0.0;
        if (w.baseline_started && (w.baseline_done == 0 || o_.case_timeout_s < kSlowFactor * estimate))
          throw EnvironmentError(
              w.baseline_done == 0
                  ? fmt::format("the per-case timeout of {:g} s (--case-timeout) is too short for this Case: "
                                "its run without checkpointing did not finish its first step within it (case {})",
                                o_.case_timeout_s, sanitize(to_line(c), 300))
                  : fmt::format("the per-case timeout of {:g} s (--case-timeout) is too short for this Case: "
                                "its run without checkpointing takes about {:.3g} s, and a hang is told from a "
                                "slow run only past {:g} times that (case {})",
                                o_.case_timeout_s, estimate, kSlowFactor, sanitize(to_line(c), 300)));
        lost(w, w.baseline_done == 0
                    ? fmt::format("did not finish within the per-case timeout of {:g} s (--case-timeout): it "
                                  "hangs, or is far slower than the baseline",
                                  o_.case_timeout_s)
                    : fmt::format("did not finish within the per-case timeout of {:g} s (--case-timeout), over {:g} "
                                  "times what its run without checkpointing takes ({:.3g} s): it hangs, or is far "
                                  "slower than the baseline",
                                  o_.case_timeout_s, kSlowFactor, estimate));
      }
    }
  }
  return out;
}

}  // namespace ckv::cli
