// verifier/dist/fork_server.cpp: see fork_server.hpp.
#include "verifier/dist/fork_server.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "verifier/dist/fd_lines.hpp"

extern char** environ;

namespace ckv::dist {
namespace {
using nlohmann::json;

// The number of this process's threads (/proc/self/task), or -1 where it cannot be read.
int thread_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Strings cross the channel as hex: a path, a variable or a rank's standard error need not be UTF-8,
// which JSON strings must be, and each must arrive byte for byte.
std::string hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += digits[c >> 4], out += digits[c & 15];
  return out;
}
std::string unhex(const json& j) {
  const std::string h = j.get<std::string>();
  auto value = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::runtime_error("dist: a malformed string on the fork server's channel");
  };
  if (h.size() % 2 != 0) throw std::runtime_error("dist: a malformed string on the fork server's channel");
  std::string out;
  for (size_t i = 0; i < h.size(); i += 2) out += static_cast<char>(value(h[i]) * 16 + value(h[i + 1]));
  return out;
}
json hex_all(const std::vector<std::string>& v) {
  json out = json::array();
  for (const std::string& s : v) out.push_back(hex(s));
  return out;
}
std::vector<std::string> unhex_all(const json& j) {
  std::vector<std::string> out;
  for (const json& s : j) out.push_back(unhex(s));
  return out;
}

const char* status_name(RankOutcome::Status s) {
  switch (s) {
    case RankOutcome::Status::ok:
      return "ok";
    case RankOutcome::Status::failed:
      return "failed";
    case RankOutcome::Status::crashed:
      return "crashed";
    case RankOutcome::Status::timed_out:
      return "timed_out";
    case RankOutcome::Status::stopped_after_failure:
      return "stopped_after_failure";
  }
  return "?";
}

RankOutcome::Status status_named(const std::string& name) {
  for (auto s : {RankOutcome::Status::ok, RankOutcome::Status::failed, RankOutcome::Status::crashed,
                 RankOutcome::Status::timed_out, RankOutcome::Status::stopped_after_failure})
    if (name == status_name(s)) return s;
  throw std::runtime_error("dist: the fork server answered an unknown rank status \"" + name + "\"");
}

// The server's side of one request: run_ranks, its outcomes or its error as one line.
std::string serve_one(const std::string& request, int fd, RankForkServer::Entry entry) {
  try {
    const json j = json::parse(request);
    RankLaunch l;
    l.exe = unhex(j.at("exe"));
    l.args = unhex_all(j.at("args"));
    l.world = j.at("world").get<int>();
    l.dir = unhex(j.at("dir"));
    l.deadline = std::chrono::milliseconds(j.at("deadline_ms").get<int64_t>());
    l.grace = std::chrono::milliseconds(j.at("grace_ms").get<int64_t>());
    l.environment = unhex_all(j.at("env"));
    l.entry = [fd, entry](const std::vector<std::string>& argv) {
      ::close(fd);  // the rank holds nothing of the server's
      std::vector<std::string> copy = argv;
      std::vector<char*> v;
      for (auto& a : copy) v.push_back(a.data());
      v.push_back(nullptr);
      return entry(static_cast<int>(copy.size()), v.data());
    };
    json out = json::array();
    for (const RankOutcome& o : run_ranks(l))
      out.push_back({{"rank", o.rank},
                     {"status", status_name(o.status)},
                     {"code", o.code},
                     {"tail", hex(o.stderr_tail)},
                     {"ended", o.ended},
                     {"stopped", o.seen_stopped}});
    return json{{"outcomes", out}}.dump();
  } catch (const std::invalid_argument& e) {
    return json{{"error", hex(e.what())}, {"type", "invalid_argument"}}.dump();
  } catch (const std::logic_error& e) {
    return json{{"error", hex(e.what())}, {"type", "logic_error"}}.dump();
  } catch (const std::exception& e) {
    return json{{"error", hex(e.what())}, {"type", "runtime_error"}}.dump();
  }
}

[[noreturn]] void serve(int fd, RankForkServer::Entry entry) {
  std::string buffer, line;
  while (read_line(fd, buffer, line))
    if (!write_all(fd, serve_one(line, fd, entry) + "\n")) break;
  ::_exit(0);  // the process that started it is done with it
}

// The server's start: dies with its parent, holds no descriptor of the parent's but standard error
// (0 and 1 on /dev/null, `keep` its socket), and handles no signal (as after exec).
void become_server(pid_t parent, int keep) {
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(0);
  ::prctl(PR_SET_NAME, "ckv-rank-server");  // in ps and top
  const int null = ::open("/dev/null", O_RDWR);
  if (null < 0) ::_exit(0);
  ::dup2(null, 0), ::dup2(null, 1);
  std::vector<int> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      const int fd = std::atoi(e->d_name);
      if (e->d_name[0] != '.' && fd > 2 && fd != keep && fd != own) fds.push_back(fd);
    }
    ::closedir(d);
  } else {
    ::_exit(0);
  }
  for (int fd : fds) ::close(fd);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction sa {};
    if (::sigaction(sig, nullptr, &sa) != 0) continue;
    const bool handled =
        (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != nullptr : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
    if (handled) ::signal(sig, SIG_DFL);
  }
}

std::unique_ptr<RankForkServer>& installed() {
  static std::unique_ptr<RankForkServer> server;
  return server;
}
}  // namespace

std::unique_ptr<RankForkServer> RankForkServer::start(Entry entry) {
  if (thread_count() != 1) return nullptr;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
  const pid_t parent = ::getpid();
  std::fflush(nullptr);  // nothing buffered here is written again by the server or a rank
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    become_server(parent, sv[1]);
    serve(sv[1], entry);
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    return nullptr;
  }
  return std::unique_ptr<RankForkServer>(new RankForkServer(pid, sv[0]));
}

RankForkServer::~RankForkServer() {
  if (fd_ >= 0) ::close(fd_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

void RankForkServer::lost() {
  ::close(fd_);
  fd_ = -1;
}

std::vector<RankOutcome> RankForkServer::run(const RankLaunch& launch) {
  if (fd_ < 0) throw std::logic_error("dist: the rank fork server is gone");
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  const json request{
      {"exe", hex(launch.exe)}, {"args", hex_all(launch.args)},           {"world", launch.world},
      {"dir", hex(launch.dir)}, {"deadline_ms", launch.deadline.count()}, {"grace_ms", launch.grace.count()},
      {"env", hex_all(env)}};
  std::string line;
  bool got = write_all(fd_, request.dump() + "\n");
  while (got) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      break;
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, 20);
    if (ready < 0 && errno != EINTR) got = false;
    if (ready > 0) {
      char chunk[65536];
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) got = false;
      if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
    }
    if (got && launch.while_waiting) launch.while_waiting();
  }
  if (!got) {
    // The server is gone, and the ranks with it (PR_SET_PDEATHSIG). Killed from outside: ForkServerKilled
    // (nothing judged); anything else is ckverify's own failure.
    lost();
    int status = 0;
    pid_t reaped;
    do reaped = ::waitpid(pid_, &status, 0);
    while (reaped < 0 && errno == EINTR);
    const pid_t was = pid_;
    pid_ = -1;
    const int sig = reaped == was && WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGHUP)
      throw ForkServerKilled("ckverify's rank fork server (pid " + std::to_string(was) + "), which ran the " +
                                 std::to_string(launch.world) + " ranks, was stopped by signal " + std::to_string(sig) +
                                 " (" + ::strsignal(sig) + ")",
                             sig);
    throw std::runtime_error("dist: ckverify's rank fork server (pid " + std::to_string(was) + ") ended " +
                             (reaped != was         ? std::string("unaccounted for")
                              : WIFSIGNALED(status) ? "by signal " + std::to_string(WTERMSIG(status))
                                                    : "with exit status " + std::to_string(WEXITSTATUS(status))) +
                             " while it ran ranks");
  }
  const json j = json::parse(line, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string()) {
    const std::string what = unhex(j["error"]), type = j.value("type", std::string());
    if (type == "invalid_argument") throw std::invalid_argument(what);
    if (type == "logic_error") throw std::logic_error(what);
    throw std::runtime_error(what);
  }
  if (!j.is_object() || !j.contains("outcomes") || !j["outcomes"].is_array())
    throw std::runtime_error("dist: the rank fork server answered a malformed line");
  std::vector<RankOutcome> out;
  for (const json& o : j["outcomes"]) {
    RankOutcome r;
    r.rank = o.at("rank").get<int>();
    r.status = status_named(o.at("status").get<std::string>());
    r.code = o.at("code").get<int>();
    r.stderr_tail = unhex(o.at("tail"));
    r.ended = o.at("ended").get<int>();
    r.seen_stopped = o.at("stopped").get<bool>();
    out.push_back(std::move(r));
  }
  return out;
}

void install_fork_server(std::unique_ptr<RankForkServer> server) {
  installed() = std::move(server);
}

RankForkServer* installed_fork_server() {
  return installed().get();
}

std::vector<RankOutcome> launch_ranks(const RankLaunch& launch) {
  RankForkServer* server = installed_fork_server();
  if (server && server->alive()) return server->run(launch);
  return run_ranks(launch);
}

}  // namespace ckv::dist
