// verifier/cli/output.cpp: see output.hpp.
#include "verifier/cli/output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "verifier/case/case.hpp"

namespace ckv::cli {
namespace fs = std::filesystem;

namespace {
// The directory a file is in ("." for a bare name).
fs::path directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? fs::path(".") : parent;
}
}  // namespace

FileArg file_arg(const std::string& given) {
  if (given.empty()) return {};
  std::error_code ec;
  const fs::path path = fs::absolute(given, ec);
  return {given, ec ? given : path.string()};
}

FileArg beside(const FileArg& file, const std::string& name) {
  auto sibling = [&](const std::string& s) {
    const fs::path p(s);
    return (p.parent_path() / (p.stem().string() + "." + name + p.extension().string())).string();
  };
  return {sibling(file.given), sibling(file.path)};
}

FileArg inside(const FileArg& dir, const std::string& name) {
  return {dir.given + "/" + name, dir.path + "/" + name};
}

void check_outputs(const std::vector<std::pair<std::string, FileArg>>& outputs,
                   const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<std::pair<std::string, fs::path>> seen;
  for (const auto& [what, path] : inputs) {  // an output must never replace an input, however spelled
    std::error_code ec;
    if (!path.empty()) seen.emplace_back(what, fs::weakly_canonical(fs::absolute(path), ec));
  }
  for (const auto& [option, file] : outputs) {
    if (file.empty()) continue;
    const std::string& path = file.path;
    const std::string shown = option + " " + sanitize(file.given, 200);
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode)) throw UsageError(shown + ": is a symbolic link; give the real path");
      if (!S_ISREG(st.st_mode)) throw UsageError(shown + ": exists and is not a regular file");
    }
    const fs::path dir = directory_of(path), shown_dir = directory_of(file.given);
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw UsageError(shown + ": " + sanitize(shown_dir.string(), 200) +
                       (fs::exists(dir, ec) ? " is not a directory" : " does not exist"));
    if (::access(dir.c_str(), W_OK) != 0)
      throw UsageError(shown + ": directory " + sanitize(shown_dir.string(), 200) + " is not writable");
    {  // access() passes for root everywhere, and knows nothing of /proc or a read-only mount: the
       // temporary file write_atomically() makes there, made and removed now
      std::string probe = (dir / ".ckverify-XXXXXX").string();
      const int fd = ::mkstemp(probe.data());
      if (fd < 0)
        throw UsageError(shown + ": cannot create a file in " + sanitize(shown_dir.string(), 200) + ": " +
                         std::strerror(errno));
      ::close(fd);
      ::unlink(probe.c_str());
    }
    const fs::path canon = fs::weakly_canonical(path, ec);
    for (const auto& [other, p] : seen)
      if (p == canon) throw UsageError(shown + ": the same file as " + other);
    seen.emplace_back(option, canon);
  }
}

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  const std::string shown = sanitize(path, 200);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw UsageError("cannot read " + shown + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw UsageError(shown + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw UsageError(shown + " is larger than " + std::to_string(max_bytes >> 20) + " MiB");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw UsageError("cannot read " + shown + ": " + std::strerror(errno));
  struct stat again {};
  if (::fstat(fd, &again) != 0 || !S_ISREG(again.st_mode)) {  // replaced between the two looks
    ::close(fd);
    throw UsageError(shown + " is not a regular file");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) break;
  }
  ::close(fd);
  if (text.size() > max_bytes) throw UsageError(shown + " is larger than " + std::to_string(max_bytes >> 20) + " MiB");
  return text;
}

void write_atomically(const FileArg& file, const std::string& text) {
  const std::string& path = file.path;
  std::string tmpl = (directory_of(path) / ".ckverify-XXXXXX").string();
  const int fd = ::mkstemp(tmpl.data());  // O_CREAT | O_EXCL, mode 0600, unpredictable name
  if (fd < 0) throw UsageError("cannot write " + sanitize(file.given, 200) + ": " + std::strerror(errno));
  size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fchmod(fd, 0644) == 0;
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmpl.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmpl.c_str());
    throw UsageError("cannot write " + sanitize(file.given, 200) + ": " + why);
  }
}

}  // namespace ckv::cli
