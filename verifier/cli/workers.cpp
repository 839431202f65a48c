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

#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "verifier/cli/output.hpp"
#include "verifier/cli/search.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/progress.hpp"

extern char** environ;

namespace ckv::cli {
namespace {
using nlohmann::json;

// Pipe ends above the standard descriptors and fd 3, close-on-exec (the spawn's dup2 clears it on the
// copies the worker keeps).
void make_pipe(int fds[2]) {
  int raw[2];
  if (::pipe2(raw, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  for (int k = 0; k < 2; ++k) {
    fds[k] = ::fcntl(raw[k], F_DUPFD_CLOEXEC, 10);
    ::close(raw[k]);
    if (fds[k] < 0) throw std::runtime_error(std::string("fcntl: ") + std::strerror(errno));
  }
}

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return fmt::format("killed by signal {} ({})", sig, name ? name : "unknown");
  }
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return "stopped";
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot find ckverify's own executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

std::string findings_to_line(const std::vector<Finding>& fs) {
  json a = json::array();
  for (const auto& f : fs)
    a.push_back(
        {{"p", f.property}, {"h", f.held}, {"a", f.applicable}, {"w", f.where}, {"d", f.detail}, {"s", f.step}});
  return json{{"findings", a}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<Finding> findings_from_line(const std::string& line) {
  const json j = json::parse(line);
  std::vector<Finding> fs;
  for (const auto& f : j.at("findings")) {
    Finding x;
    x.property = f.at("p").get<std::string>();
    x.held = f.at("h").get<bool>();
    x.applicable = f.at("a").get<bool>();
    x.where = f.at("w").get<std::string>();
    x.detail = f.at("d").get<std::string>();
    x.step = f.at("s").get<int>();
    fs.push_back(std::move(x));
  }
  return fs;
}

int worker_main(const std::string& impl, int threads) {
  // A worker never outlives ckverify, even one killed with SIGKILL while this worker hangs in a case.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 0;
  ::dup2(STDERR_FILENO, STDOUT_FILENO);  // whatever the implementation prints goes to stderr
  auto answer = [](const std::string& line) {
    if (!write_all(3, line + "\n")) std::_Exit(0);  // the parent is gone
  };
  torch::set_num_threads(std::max(1, threads));
  try {
    make_impl(impl);
  } catch (const std::exception& e) {
    answer(json{{"error", e.what()}, {"kind", "usage"}}.dump(-1, ' ', false, json::error_handler_t::replace));
    return 0;
  }
  answer(R"({"ready":true})");
  std::string line;
  while (std::getline(std::cin, line)) {
    try {
      answer(findings_to_line(run_checks(case_from_json(line))));
    } catch (const EnvironmentError& e) {
      answer(json{{"error", e.what()}, {"kind", "environment"}}.dump(-1, ' ', false, json::error_handler_t::replace));
    } catch (const std::exception& e) {
      answer(json{{"error", e.what()}, {"kind", "internal"}}.dump(-1, ' ', false, json::error_handler_t::replace));
    }
  }
  return 0;
}

struct WorkerPool::Worker {
  pid_t pid = -1;
  int to = -1, from = -1;  // request pipe (write end), answer pipe (read end)
  std::string buffer;
  int task = -1;  // index of the Case it runs, -1 when idle
  Clock::time_point deadline;
};

WorkerPool::WorkerPool(WorkerOptions o) : o_(std::move(o)) {
  std::signal(SIGPIPE, SIG_IGN);  // a worker that died must not take ckverify with it
  for (int i = 0; i < std::max(1, o_.workers); ++i) workers_.push_back(std::make_unique<Worker>());
}

WorkerPool::~WorkerPool() {
  for (auto& w : workers_) stop(*w);
}

void WorkerPool::stop(Worker& w) {
  if (w.pid > 0) {
    ::kill(w.pid, SIGKILL);
    int status = 0;
    while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (w.to >= 0) ::close(w.to);
  if (w.from >= 0) ::close(w.from);
  w = Worker{};
}

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
}  // namespace

void WorkerPool::start(Worker& w) {
  static const std::string exe = self_exe();
  int req[2], ans[2];
  make_pipe(req);
  make_pipe(ans);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, req[0], 0);
  posix_spawn_file_actions_adddup2(&fa, ans[1], 3);
  const std::string threads = std::to_string(std::max(1, o_.threads));
  std::vector<std::string> args = {"ckverify", "worker", "--impl", o_.impl, "--threads", threads};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(req[0]);
  ::close(ans[1]);
  if (rc != 0) {
    ::close(req[1]);
    ::close(ans[0]);
    throw std::runtime_error(std::string("cannot start a worker process: ") + std::strerror(rc));
  }
  w.pid = pid, w.to = req[1], w.from = ans[0];
  // The worker loads the implementation first and says whether it could.
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(std::max(60.0, o_.case_timeout_s)));
  for (;;) {
    if (auto line = take_line(w.buffer)) {
      const json j = json::parse(*line, nullptr, false);
      if (j.is_object() && j.contains("ready")) return;
      const std::string why = j.is_object() && j.contains("error") ? j["error"].get<std::string>() : *line;
      stop(w);
      throw UsageError(sanitize(o_.impl, 200) + ": " + sanitize(why, 300));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p{w.from, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) == 0) {
      stop(w);
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

std::vector<std::optional<std::vector<Finding>>> WorkerPool::run(const std::vector<Case>& cases,
                                                                 Clock::time_point deadline) {
  std::vector<std::optional<std::vector<Finding>>> out(cases.size());
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.case_timeout_s));
  size_t next = 0;
  auto finish = [&](Worker& w, std::vector<Finding> fs) {
    out[static_cast<size_t>(w.task)] = std::move(fs);
    w.task = -1;
  };
  auto lost = [&](Worker& w, const std::string& what) {
    finish(w, {Finding::fail("completes", -1, "worker process",
                             "the run under test " + what + "; the worker was replaced and the run went on")});
  };
  for (;;) {
    for (auto& w : workers_) {
      if (w->task >= 0 || next >= cases.size() || Clock::now() >= deadline) continue;
      if (w->pid < 0) start(*w);
      w->task = static_cast<int>(next);
      w->deadline = Clock::now() + timeout;
      const std::string line = json::parse(to_json(cases[next])).dump() + "\n";
      ++next;
      if (!write_all(w->to, line)) {
        int status = 0;
        ::waitpid(w->pid, &status, 0);
        w->pid = -1;
        stop(*w);
        throw std::runtime_error("a worker process " + describe_exit(status) + " between cases");
      }
    }
    std::vector<pollfd> polls;
    std::vector<Worker*> busy;
    auto wait_until = Clock::time_point::max();
    for (auto& w : workers_)
      if (w->task >= 0) {
        polls.push_back({w->from, POLLIN, 0});
        busy.push_back(w.get());
        wait_until = std::min(wait_until, w->deadline);
      }
    if (busy.empty()) break;
    if (Clock::now() >= deadline) {  // the run's time budget is spent: cases still running get no result
      for (Worker* w : busy) {
        out[static_cast<size_t>(w->task)].reset();
        stop(*w);
      }
      break;
    }
    wait_until = std::min(wait_until, deadline);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait_until - Clock::now()).count() + 1;
    const int n = ::poll(polls.data(), polls.size(), static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30)));
    if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    for (size_t k = 0; k < busy.size(); ++k) {
      Worker& w = *busy[k];
      if (n > 0 && polls[k].revents != 0) {
        if (!read_some(w.from, w.buffer)) {  // the worker died with the Case
          int status = 0;
          ::waitpid(w.pid, &status, 0);
          w.pid = -1;
          const int task = w.task;
          stop(w);
          w.task = task;
          lost(w, "crashed the worker process (" + describe_exit(status) + ")");
          progress();
          continue;
        }
        if (auto line = take_line(w.buffer)) {
          const json j = json::parse(*line, nullptr, false);
          if (j.is_object() && j.contains("error")) {
            const std::string why = j["error"].get<std::string>();
            if (j.value("kind", "") == "environment") throw EnvironmentError(why);
            throw std::runtime_error(why);
          }
          finish(w, findings_from_line(*line));
          progress();  // a Case verified (the supervisor of bench's verified column: supervise.hpp)
          continue;
        }
      }
      if (Clock::now() >= w.deadline) {
        const int task = w.task;
        stop(w);
        w.task = task;
        lost(w, fmt::format("did not finish within the per-case timeout of {:g} s (--case-timeout): it hangs, or "
                            "is far slower than the baseline",
                            o_.case_timeout_s));
      }
    }
  }
  return out;
}

}  // namespace ckv::cli
