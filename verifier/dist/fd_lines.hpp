// verifier/dist/fd_lines.hpp: newline-delimited messages on a descriptor, the form of the channels
// between ckverify's processes (a worker's requests, a rank fork server's launches).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <string>

namespace ckv::dist {

// One line from fd into `line` (without the newline), what follows it kept in `buffer` for the next
// call; false at end of file or on an error.
inline bool read_line(int fd, std::string& buffer, std::string& line) {
  for (;;) {
    const size_t nl = buffer.find('\n');
    if (nl != std::string::npos) {
      line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return true;
    }
    char chunk[65536];
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace ckv::dist
