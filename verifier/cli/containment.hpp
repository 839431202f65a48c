// verifier/cli/containment.hpp: what keeps an implementation's processes and output inside the run.
//   - Output: the implementation's process (a worker, or the supervised child of train/bench/audit-amp)
//     writes its standard output and error into pipes that ckverify drains (OutputRelay), never into
//     ckverify's own descriptors. A process it forked holds those pipes, not the terminal or the CI log,
//     so it cannot keep `ckverify ... | cat` waiting; and what it prints is bounded: past the first
//     kRelayHead bytes only the last kRelayTail are kept, printed at the end after a line saying how
//     much was left out.
//   - Processes: ckverify is its workers' child subreaper (PR_SET_CHILD_SUBREAPER), so a process the
//     implementation forked that left the worker's process group (setsid, setpgid) is reparented to
//     ckverify when its parent dies, and kill_orphans() kills it. Should ckverify itself be killed with
//     SIGKILL, such a process survives: only a cgroup could contain it (docs/limits.md).
#pragma once

#include <sys/types.h>

#include <signal.h>

#include <cstddef>
#include <streambuf>
#include <string>
#include <vector>

namespace ckv::cli {

inline constexpr size_t kRelayHead = size_t{1} << 20;   // bytes forwarded as they come
inline constexpr size_t kRelayTail = size_t{64} << 10;  // bytes kept from the end once the head is spent

// Copies what arrives to one of ckverify's descriptors, up to `head` bytes; past them it keeps the
// last `tail` bytes, and finish() writes a note of what was left out, then those.
class OutputRelay {
 public:
  explicit OutputRelay(int to, size_t head = kRelayHead, size_t tail = kRelayTail);
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;
  void write(const char* data, size_t n);
  // Reads what the non-blocking descriptor has now (at most `most` bytes), forwarding it; false once it
  // is at end of file or broken.
  bool pump(int fd, size_t most = size_t{4} << 20);
  void finish();  // idempotent; the relay can go on afterwards

 private:
  void emit(const char* data, size_t n) const;
  int to_;
  size_t head_, tail_limit_, sent_ = 0, dropped_ = 0;
  std::string tail_;
};

// The supervised child's std::cout and std::cerr (supervise.hpp): unbuffered, both on one pipe, each
// write a frame (the stream, 'o' or 'e', a 4-byte length, the bytes; one writer at a time), so that
// ckverify's own output travels apart from the implementation's and in the order it was written.
class FramedStreambuf : public std::streambuf {
 public:
  FramedStreambuf(int fd, char stream) : fd_(fd), stream_(stream) {}

 protected:
  int_type overflow(int_type c) override;
  std::streamsize xsputn(const char* data, std::streamsize n) override;

 private:
  int fd_;
  char stream_;
};

// The parent's side: reads what the non-blocking descriptor has (false at its end) and passes each
// frame's bytes to `out` or `err`. Bytes that are no frame (something else wrote on the pipe) go to
// `out` as they are.
class FrameReader {
 public:
  bool pump(int fd, OutputRelay& out, OutputRelay& err);

 private:
  std::string buffer_;
};

// SIGINT, SIGTERM and SIGHUP while worker processes run: noted instead of ending ckverify at once, so
// that the pool can kill its workers and what they set free before ckverify dies of the signal
// (die(): 128 + the signal, as without the handler). Restores the previous handlers when destroyed.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int pending();  // the signal that came, or 0
  void die();            // when one came: restore the previous handlers and die of it

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3]{};
};

// Writes all of `data` (retrying short writes and EINTR); false when the descriptor fails.
bool write_all(int fd, const char* data, size_t n);
inline bool write_all(int fd, const std::string& s) {
  return write_all(fd, s.data(), s.size());
}

// A pipe {read end, write end}, both close-on-exec, above the standard descriptors and fd 3.
void cloexec_pipe(int fds[2]);

// A pipe for an implementation's output: {read end, write end}, both close-on-exec, above the
// standard descriptors; the read end non-blocking.
void output_pipe(int fds[2]);

// Makes this process the child subreaper of its descendants (PR_SET_CHILD_SUBREAPER).
void become_subreaper();

// Kills (SIGKILL) and reaps every child of this process that is not in `keep`: processes an
// implementation forked that outlived their parent and were reparented here. Repeats for a short
// while, as a dying process's own children are reparented after it.
void kill_orphans(const std::vector<pid_t>& keep);

}  // namespace ckv::cli
