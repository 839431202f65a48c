// verifier/cli/scratch.cpp: see scratch.hpp.
#include "verifier/cli/scratch.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace ckv::cli {
namespace {
std::string made;
pid_t maker = 0;

void remove_made() {
  if (made.empty() || ::getpid() != maker) return;  // a forked copy never removes its parent's
  std::error_code ec;
  std::filesystem::remove_all(made, ec);
}
}  // namespace

void remove_implementation_tmpdir() {
  remove_made();
  if (::getpid() == maker) made.clear();
}

const std::string& implementation_tmpdir() {
  static const bool once = [] {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/ckverify-impl-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) return false;
    made = buf.data(), maker = ::getpid();
    std::atexit(remove_made);
    return true;
  }();
  (void)once;
  return made;
}

}  // namespace ckv::cli
