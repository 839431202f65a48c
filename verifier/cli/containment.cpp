// verifier/cli/containment.cpp: see containment.hpp.
#include "verifier/cli/containment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "verifier/dist/proc.hpp"

namespace ckv::cli {

OutputRelay::OutputRelay(int to, size_t head, size_t tail) : to_(to), head_(head), tail_limit_(tail) {}

OutputRelay::~OutputRelay() {
  finish();
}

bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w, n -= static_cast<size_t>(w);
  }
  return true;
}

void OutputRelay::emit(const char* data, size_t n) const {
  (void)write_all(to_, data, n);  // false: ckverify's own output is gone (a closed pipe), nothing to do
}

void OutputRelay::write(const char* data, size_t n) {
  if (sent_ < head_) {
    const size_t now = std::min(n, head_ - sent_);
    emit(data, now);
    sent_ += now, data += now, n -= now;
  }
  if (n == 0) return;
  tail_.append(data, n);
  if (tail_.size() > 2 * tail_limit_) {
    const size_t cut = tail_.size() - tail_limit_;
    dropped_ += cut;
    tail_.erase(0, cut);
  }
}

bool OutputRelay::pump(int fd, size_t most) {
  char chunk[65536];
  for (size_t got = 0; got < most;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;
    write(chunk, static_cast<size_t>(n));
    got += static_cast<size_t>(n);
  }
  return true;
}

void OutputRelay::finish() {
  if (tail_.size() > tail_limit_) {
    dropped_ += tail_.size() - tail_limit_;
    tail_.erase(0, tail_.size() - tail_limit_);
  }
  if (dropped_ == 0) {
    emit(tail_.data(), tail_.size());
    sent_ += tail_.size();
  } else {
    // Start the tail at a line when one starts near its beginning (not after a long line without one,
    // which would leave almost nothing of the tail).
    const size_t nl = tail_.find('\n');
    if (nl != std::string::npos && nl < 4096 && nl + 1 < tail_.size()) dropped_ += nl + 1, tail_.erase(0, nl + 1);
    const std::string note = fmt::format(
        "\n[ckverify: the implementation's output passed {} bytes: {} bytes left out here; the last {} follow]\n",
        head_, dropped_, tail_.size());
    emit(note.data(), note.size());
    emit(tail_.data(), tail_.size());
  }
  tail_.clear();
  // What comes after a finish() is forwarded again up to the same limit.
  sent_ = 0, dropped_ = 0;
}

namespace {
std::mutex& frame_writer() {
  static std::mutex m;
  return m;
}
constexpr size_t kFrameHead = 5, kFrameMost = size_t{1} << 20;
}  // namespace

FramedStreambuf::int_type FramedStreambuf::overflow(int_type c) {
  if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
  const char ch = traits_type::to_char_type(c);
  return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
}

std::streamsize FramedStreambuf::xsputn(const char* data, std::streamsize n) {
  const std::lock_guard<std::mutex> one_writer(frame_writer());
  for (std::streamsize done = 0; done < n;) {
    const size_t len = std::min(static_cast<size_t>(n - done), kFrameMost);
    char head[kFrameHead] = {stream_};
    for (int k = 0; k < 4; ++k) head[1 + k] = static_cast<char>((len >> (8 * k)) & 0xff);
    if (!write_all(fd_, head, kFrameHead) || !write_all(fd_, data + done, len)) return done;
    done += static_cast<std::streamsize>(len);
  }
  return n;
}

bool FrameReader::pump(int fd, OutputRelay& out, OutputRelay& err) {
  char chunk[65536];
  bool open = true;
  for (size_t got = 0; got < (size_t{4} << 20);) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      open = false;
      break;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    got += static_cast<size_t>(n);
  }
  size_t at = 0;
  while (buffer_.size() - at >= kFrameHead) {
    const char stream = buffer_[at];
    size_t len = 0;
    for (int k = 0; k < 4; ++k) len |= static_cast<size_t>(static_cast<unsigned char>(buffer_[at + 1 + k])) << (8 * k);
    if ((stream != 'o' && stream != 'e') || len > kFrameMost) {  // not a frame: passed on as it is
      out.write(buffer_.data() + at, buffer_.size() - at);
      at = buffer_.size();
      break;
    }
    if (buffer_.size() - at - kFrameHead < len) break;  // the rest of the frame is still coming
    (stream == 'o' ? out : err).write(buffer_.data() + at + kFrameHead, len);
    at += kFrameHead + len;
  }
  buffer_.erase(0, at);
  if (!open && !buffer_.empty()) out.write(buffer_.data(), buffer_.size()), buffer_.clear();
  return open;
}

namespace {
volatile std::sig_atomic_t stop_signal = 0;
void on_stop_signal(int sig) {
  stop_signal = sig;
}
}  // namespace

StopSignals::StopSignals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;  // no SA_RESTART: a wait in poll() ends with EINTR
  ::sigemptyset(&sa.sa_mask);
  for (size_t k = 0; k < 3; ++k) {
    ::sigaction(kSignals[k], &sa, &old_[k]);
    if (old_[k].sa_handler == SIG_IGN) ::sigaction(kSignals[k], &old_[k], nullptr);  // nohup: still ignored
  }
}

StopSignals::~StopSignals() {
  for (size_t k = 0; k < 3; ++k) ::sigaction(kSignals[k], &old_[k], nullptr);
}

int StopSignals::pending() {
  return stop_signal;
}

void StopSignals::die() {
  const int sig = stop_signal;
  if (sig == 0) return;
  for (size_t k = 0; k < 3; ++k) ::sigaction(kSignals[k], &old_[k], nullptr);
  std::fflush(nullptr);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
  std::_Exit(128 + sig);  // the signal is blocked or ignored by whoever started ckverify
}

void cloexec_pipe(int fds[2]) {
  int raw[2];
  if (::pipe2(raw, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  for (int k = 0; k < 2; ++k) {
    fds[k] = ::fcntl(raw[k], F_DUPFD_CLOEXEC, 10);
    ::close(raw[k]);
    if (fds[k] < 0) {
      if (k == 1) ::close(fds[0]);
      throw std::runtime_error(std::string("fcntl: ") + std::strerror(errno));
    }
  }
}

void output_pipe(int fds[2]) {
  cloexec_pipe(fds);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
}

void become_subreaper() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

namespace {
// This process's children, from /proc/PID/stat (dist/proc.hpp: a child that ends while it is read is
// skipped, not an error).
std::vector<pid_t> children() {
  std::vector<pid_t> out;
  const pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    const std::optional<dist::ProcStat> s = dist::proc_stat(static_cast<pid_t>(pid));
    if (s && s->parent == self) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}
}  // namespace

void kill_orphans(const std::vector<pid_t>& keep) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (bool quiet_once = false;;) {
    std::vector<pid_t> found;
    for (pid_t p : children())
      if (std::find(keep.begin(), keep.end(), p) == keep.end()) found.push_back(p);
    if (found.empty()) {
      // A process dying as the scan ran may reparent its children just after it: look once more.
      if (quiet_once) return;
      quiet_once = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    quiet_once = false;
    for (pid_t p : found) ::kill(p, SIGKILL);
    for (pid_t p : found) {
      int status = 0;
      while (::waitpid(p, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (std::chrono::steady_clock::now() >= until) return;
  }
}

}  // namespace ckv::cli
