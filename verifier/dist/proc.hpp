// verifier/dist/proc.hpp: what /proc says of a process: whether it is stopped (SIGSTOP, SIGTSTP, a
// debugger), and whether one of a process's children is. ckverify never stops its own processes, so a
// stopped one was stopped from outside: its time, and its peers' waiting for it, are no Case's doing.
#pragma once

#include <sys/types.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <system_error>

namespace ckv::dist {

struct ProcStat {
  char state = '?';
  pid_t parent = 0;
};

// The state and parent of `pid` from /proc/PID/stat, or nothing where it is gone.
inline std::optional<ProcStat> proc_stat(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so the last ')' ends it.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 4 >= text.size()) return std::nullopt;
  ProcStat s;
  s.state = text[close + 2];
  s.parent = static_cast<pid_t>(std::strtol(text.c_str() + close + 4, nullptr, 10));
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
