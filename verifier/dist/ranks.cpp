// verifier/dist/ranks.cpp: see ranks.hpp.
#include "verifier/dist/ranks.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "verifier/dist/proc.hpp"

extern char** environ;

namespace ckv::dist {
namespace {
// The last `lines` non-empty lines of the file, read from its last 64 KiB, each cut at 300 characters
// and stripped of control characters: a rank that floods standard error cannot flood the report.
std::string tail_of(const std::string& path, size_t lines = 3) {
  constexpr std::streamoff kWindow = 64 * 1024;
  constexpr size_t kLine = 300;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  in.seekg(size > kWindow ? size - kWindow : 0);
  std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> all;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) all.push_back(cur.size() > kLine ? cur.substr(0, kLine) + "..." : cur);
    cur.clear();
  };
  for (char ch : buf) {
    if (ch == '\n') {
      flush();
    } else if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\t') {
      if (cur.size() <= kLine) cur += ch;
    }
  }
  flush();
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "" : " | ") + all[i];
  return out;
}

bool children_are_reaped_for_us() {
  struct sigaction sa {};
  ::sigaction(SIGCHLD, nullptr, &sa);
  return sa.sa_handler == SIG_IGN || (sa.sa_flags & SA_NOCLDWAIT) != 0;
}
}  // namespace

std::string RankOutcome::describe() const {
  std::string s = "rank " + std::to_string(rank) + " ";
  switch (status) {
    case Status::ok:
      s += "succeeded";
      break;
    case Status::failed:
      s += "failed (exit status " + std::to_string(code) + ")";
      break;
    case Status::crashed:
      s += "crashed (signal " + std::to_string(code) + ": " + strsignal(code) + ")";
      break;
    case Status::timed_out:
      s += "did not finish before the deadline and was killed";
      break;
    case Status::stopped_after_failure:
      s += "was killed after another rank failed";
      break;
  }
  if (!stderr_tail.empty()) s += ": " + stderr_tail;
  return s;
}

int RankOutcome::outside_signal() const {
  const bool stop = code == 128 + SIGTERM || code == 128 + SIGINT || code == 128 + SIGHUP;
  if (status == Status::failed && stop) return code - 128;
  if (status == Status::crashed && (code == SIGKILL || code == SIGTERM || code == SIGINT || code == SIGHUP))
    return code;
  return 0;
}

const RankOutcome* first_failure(const std::vector<RankOutcome>& outcomes) {
  // The rank that failed or crashed first (a peer that fails because of it, a collective's partner
  // gone, ends later); then one that hung; then one that was stopped.
  const RankOutcome* best = nullptr;
  for (const auto& o : outcomes)
    if ((o.status == RankOutcome::Status::failed || o.status == RankOutcome::Status::crashed) &&
        (!best || o.ended < best->ended))
      best = &o;
  if (best) return best;
  for (auto want : {RankOutcome::Status::timed_out, RankOutcome::Status::stopped_after_failure})
    for (const auto& o : outcomes)
      if (o.status == want) return &o;
  return nullptr;
}

std::vector<RankOutcome> run_ranks(const RankLaunch& launch) {
  if (launch.world < 1) throw std::invalid_argument("dist: a run needs at least one rank");
  struct stat st {};
  if (::stat(launch.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw std::invalid_argument("dist: the run directory " + launch.dir + " does not exist");
  if (children_are_reaped_for_us())
    throw std::logic_error("dist: SIGCHLD is ignored in this process, so the ranks' exit statuses would be lost");
  const std::string store = launch.dir + "/store";
  ::unlink(store.c_str());
  std::vector<std::string> env_strings;
  auto keep_env = [&](const char* e) {
    if (std::strncmp(e, "CKV_RANK=", 9) != 0 && std::strncmp(e, "CKV_WORLD=", 10) != 0 &&
        std::strncmp(e, "CKV_STORE=", 10) != 0)
      env_strings.emplace_back(e);
  };
  if (launch.environment.empty())
    for (char** e = environ; *e; ++e) keep_env(*e);
  else
    for (const std::string& e : launch.environment) keep_env(e.c_str());
  const size_t W = static_cast<size_t>(launch.world);
  std::vector<pid_t> pids(W, -1);
  std::vector<RankOutcome> out(W);
  pid_t group = 0;
  // Every rank by its own pid (one that left the group too), and whatever is left in the group.
  auto kill_all = [&] {
    for (pid_t pid : pids)
      if (pid > 0) ::kill(pid, SIGKILL);
    if (group > 0) ::kill(-group, SIGKILL);
  };
  const pid_t parent = ::getpid();
  for (size_t r = 0; r < W; ++r) {
    out[r].rank = static_cast<int>(r);
    // Everything the child needs is built before fork: between fork and exec it only makes system calls
    // (with `entry`, the launcher is single-threaded, so the child may do more).
    std::vector<std::string> env = env_strings;
    env.push_back("CKV_RANK=" + std::to_string(r));
    env.push_back("CKV_WORLD=" + std::to_string(launch.world));
    env.push_back("CKV_STORE=" + store);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_s{launch.exe};
    argv_s.insert(argv_s.end(), launch.args.begin(), launch.args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string err = launch.dir + "/rank" + std::to_string(r) + ".err";
    const std::string log = launch.dir + "/rank" + std::to_string(r) + ".out";
    int status_pipe[2];
    if (::pipe2(status_pipe, O_CLOEXEC) != 0) {
      kill_all();
      throw std::runtime_error(std::string("dist: pipe: ") + std::strerror(errno));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The child: its own group (rank 0's), killed when the process that started it dies, its output
      // in files; then the program. An errno that stops it goes back through the pipe.
      ::close(status_pipe[0]);
      int e = 0;
      if (::setpgid(0, group) != 0) e = errno;
      if (!e && ::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) e = errno;
      if (!e && ::getppid() != parent) ::_exit(127);  // the parent is already gone
      const int in = e ? -1 : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      const int o1 = e ? -1 : ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      const int o2 = e ? -1 : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (!e && (in < 0 || o1 < 0 || o2 < 0)) e = errno;
      if (!e && (::dup2(in, 0) < 0 || ::dup2(o1, 1) < 0 || ::dup2(o2, 2) < 0)) e = errno;
      if (!e && launch.entry) {
        // The program afresh, as exec would start it: its environment, no descriptor but 0, 1 and 2.
        for (int fd : {in, o1, o2})
          if (fd > 2) ::close(fd);
        ::close(status_pipe[1]);
        ::clearenv();
        for (char* v : envp)
          if (v) ::putenv(v);
        int rc = 3;
        try {
          rc = launch.entry(argv_s);
        } catch (...) {
        }
        std::exit(rc);
      }
      if (!e) ::execve(launch.exe.c_str(), argv.data(), envp.data()), e = errno;
      if (::write(status_pipe[1], &e, sizeof e) < 0) {
      }
      ::_exit(127);
    }
    ::close(status_pipe[1]);
    if (pid < 0) {
      ::close(status_pipe[0]);
      kill_all();
      throw std::runtime_error(std::string("dist: fork: ") + std::strerror(errno));
    }
    if (group == 0) group = pid;
    ::setpgid(pid, group);  // also done by the child; whichever runs first
    int child_errno = 0;
    ssize_t n;
    do n = ::read(status_pipe[0], &child_errno, sizeof child_errno);
    while (n < 0 && errno == EINTR);
    ::close(status_pipe[0]);
    if (n == static_cast<ssize_t>(sizeof child_errno)) {  // exec did not happen
      ::waitpid(pid, nullptr, 0);
      kill_all();
      for (size_t k = 0; k < r; ++k) ::waitpid(pids[k], nullptr, 0);
      throw std::runtime_error("dist: cannot start rank " + std::to_string(r) + " (" + launch.exe +
                               "): " + std::strerror(child_errno));
    }
    pids[r] = pid;
  }
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point failed_at{};
  bool any_failed = false;
  size_t running = W;
  int reaped_so_far = 0;
  auto note_exit = [&](size_t r, int status) {
    RankOutcome& o = out[r];
    if (WIFEXITED(status)) {
      o.code = WEXITSTATUS(status);
      o.status = o.code == 0 ? RankOutcome::Status::ok : RankOutcome::Status::failed;
    } else {
      o.code = WIFSIGNALED(status) ? WTERMSIG(status) : -1;
      o.status = RankOutcome::Status::crashed;
    }
    o.ended = reaped_so_far++;
    if (o.status != RankOutcome::Status::ok && !any_failed)
      any_failed = true, failed_at = std::chrono::steady_clock::now();
    pids[r] = -1, --running;
  };
  // One pass over the ranks still running; false when a rank was lost (reaped by someone else).
  auto last_look = start;
  auto sweep = [&] {
    // Every 50 ms, which rank is stopped from outside: a stop of a collective timeout (seconds) is seen.
    const auto now = std::chrono::steady_clock::now();
    const bool look = now - last_look >= std::chrono::milliseconds(50);
    if (look) last_look = now;
    for (size_t r = 0; r < W; ++r) {
      if (pids[r] < 0) continue;
      if (look && process_stopped(pids[r])) out[r].seen_stopped = true;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) note_exit(r, status);
      if (got < 0 && errno != EINTR) return false;
    }
    return true;
  };
  while (running > 0) {
    const int before = reaped_so_far;
    if (!sweep()) {
      kill_all();
      throw std::runtime_error("dist: a rank's exit status was taken by another part of this process (waitpid)");
    }
    if (running == 0) break;
    const auto now = std::chrono::steady_clock::now();
    const bool past_deadline = now - start > launch.deadline;
    const bool past_grace = any_failed && now - failed_at > launch.grace;
    if (past_deadline || past_grace) {
      kill_all();
      for (size_t r = 0; r < W; ++r) {
        if (pids[r] < 0) continue;
        int status = 0;
        pid_t got;
        do got = ::waitpid(pids[r], &status, 0);
        while (got < 0 && errno == EINTR);
        out[r].status = any_failed ? RankOutcome::Status::stopped_after_failure : RankOutcome::Status::timed_out;
        out[r].ended = reaped_so_far++;
        pids[r] = -1, --running;
      }
      break;
    }
    if (launch.while_waiting) launch.while_waiting();
    if (reaped_so_far == before) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (group > 0) ::kill(-group, SIGKILL);  // anything a rank started in the group and left behind
  for (size_t r = 0; r < W; ++r) out[r].stderr_tail = tail_of(launch.dir + "/rank" + std::to_string(r) + ".err");
  return out;
}

RankEnv RankEnv::from_environment() {
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) throw std::runtime_error(std::string("dist: ") + name + " is not set (not started as a rank)");
    return std::string(v);
  };
  RankEnv e;
  e.rank = std::stoi(get("CKV_RANK"));
  e.world = std::stoi(get("CKV_WORLD"));
  e.store = get("CKV_STORE");
  return e;
}

LaunchDir::LaunchDir(const std::string& prefix)
    : path_((std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string()) {
  made_ = ::mkdtemp(path_.data()) != nullptr;
}
LaunchDir::~LaunchDir() {
  if (!made_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace ckv::dist
