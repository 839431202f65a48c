// verifier/dist/proc.hpp: what /proc says of a process: whether it is stopped (SIGSTOP, SIGTSTP, a
// debugger), and whether one of a process's children is. ckverify never stops its own processes, so a
// stopped one was stopped from outside: its time, and its peers' waiting for it, are no Case's doing.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <system_error>

namespace ckv::dist {

struct ProcStat {
  char state = '?';
  pid_t parent = 0;
};

// The state and parent from an open /proc/PID/stat, or nothing where the process is gone. Read with
// read(2): a process that ends between the open and the read fails the read (ESRCH), which a
// std::ifstream turns into an exception.
inline std::optional<ProcStat> read_proc_stat(int fd) {
  char buffer[1024];
  ssize_t n;
  do n = ::read(fd, buffer, sizeof buffer - 1);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return std::nullopt;
  const std::string text(buffer, static_cast<size_t>(n));
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so the last ')' ends it.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 4 >= text.size()) return std::nullopt;
  ProcStat s;
  s.state = text[close + 2];
  s.parent = static_cast<pid_t>(std::strtol(text.c_str() + close + 4, nullptr, 10));
  return s;
}

// The state and parent of `pid`, or nothing where it is gone.
inline std::optional<ProcStat> proc_stat(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const std::optional<ProcStat> s = read_proc_stat(fd);
  ::close(fd);
  return s;
}

inline bool process_stopped(pid_t pid) {
  const std::optional<ProcStat> s = proc_stat(pid);
  return s && (s->state == 'T' || s->state == 't');
}

// A stopped child of one of `parents`, or 0 (also where /proc cannot be read).
inline pid_t stopped_child(std::initializer_list<pid_t> parents) {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc", ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::strtol(name.c_str(), nullptr, 10));
    const std::optional<ProcStat> s = proc_stat(pid);
    if (!s || (s->state != 'T' && s->state != 't')) continue;
    for (pid_t parent : parents)
      if (parent > 0 && s->parent == parent) return pid;
  }
  return 0;
}

}  // namespace ckv::dist
