// verifier/dist/ranks.cpp: see ranks.hpp.
#include "verifier/dist/ranks.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ckv::dist {
namespace {
std::string tail_of(const std::string& path, size_t lines = 3) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "" : " | ") + all[i];
  return out;
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

const RankOutcome* first_failure(const std::vector<RankOutcome>& outcomes) {
  for (auto want : {RankOutcome::Status::crashed, RankOutcome::Status::failed, RankOutcome::Status::timed_out})
    for (const auto& o : outcomes)
      if (o.status == want) return &o;
  for (const auto& o : outcomes)
    if (o.status != RankOutcome::Status::ok) return &o;
  return nullptr;
}

std::vector<RankOutcome> run_ranks(const RankLaunch& launch) {
  if (launch.world < 1) throw std::invalid_argument("dist: a run needs at least one rank");
  const std::string store = launch.dir + "/store";
  ::unlink(store.c_str());
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "CKV_RANK=", 9) != 0 && std::strncmp(*e, "CKV_WORLD=", 10) != 0 &&
        std::strncmp(*e, "CKV_STORE=", 10) != 0)
      env_strings.emplace_back(*e);
  std::vector<pid_t> pids(static_cast<size_t>(launch.world), -1);
  std::vector<RankOutcome> out(static_cast<size_t>(launch.world));
  pid_t group = 0;
  auto kill_all = [&] {
    if (group > 0) ::kill(-group, SIGKILL);
  };
  for (int r = 0; r < launch.world; ++r) {
    out[static_cast<size_t>(r)].rank = r;
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
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = launch.dir + "/rank" + std::to_string(r) + ".out";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, group);  // 0 for the first: a new group led by rank 0
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, launch.exe.c_str(), &fa, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      kill_all();
      for (int k = 0; k < r; ++k) ::waitpid(pids[static_cast<size_t>(k)], nullptr, 0);
      throw std::runtime_error("dist: cannot start rank " + std::to_string(r) + " (" + launch.exe +
                               "): " + std::strerror(rc));
    }
    pids[static_cast<size_t>(r)] = pid;
    if (group == 0) group = pid;
  }
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point failed_at{};
  bool any_failed = false;
  int running = launch.world;
  while (running > 0) {
    bool reaped = false;
    for (int r = 0; r < launch.world; ++r) {
      pid_t& pid = pids[static_cast<size_t>(r)];
      if (pid < 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) != pid) continue;
      RankOutcome& o = out[static_cast<size_t>(r)];
      if (WIFEXITED(status)) {
        o.code = WEXITSTATUS(status);
        o.status = o.code == 0 ? RankOutcome::Status::ok : RankOutcome::Status::failed;
      } else {
        o.code = WIFSIGNALED(status) ? WTERMSIG(status) : -1;
        o.status = RankOutcome::Status::crashed;
      }
      if (o.status != RankOutcome::Status::ok && !any_failed)
        any_failed = true, failed_at = std::chrono::steady_clock::now();
      pid = -1, --running, reaped = true;
    }
    if (running == 0) break;
    const auto now = std::chrono::steady_clock::now();
    const bool past_deadline = now - start > launch.deadline;
    const bool past_grace = any_failed && now - failed_at > launch.grace;
    if (past_deadline || past_grace) {
      kill_all();
      for (int r = 0; r < launch.world; ++r) {
        pid_t& pid = pids[static_cast<size_t>(r)];
        if (pid < 0) continue;
        ::waitpid(pid, nullptr, 0);
        out[static_cast<size_t>(r)].status =
            past_grace ? RankOutcome::Status::stopped_after_failure : RankOutcome::Status::timed_out;
        pid = -1, --running;
      }
      break;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill_all();  // anything a rank started in the group and left behind
  for (int r = 0; r < launch.world; ++r)
    out[static_cast<size_t>(r)].stderr_tail = tail_of(launch.dir + "/rank" + std::to_string(r) + ".err");
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

}  // namespace ckv::dist
