// verifier/cli/output.hpp: how ckverify writes files it is asked to write (reports, the repro Case).
// Every path is checked before any work starts: it must be new or a regular file (never a device, a
// directory or a symbolic link), in an existing directory, and distinct from every other output of the
// same run. A file is written whole or not at all: into a temporary file created exclusively, with an
// unpredictable name, in the target's directory, then renamed over the target (rename replaces a link
// planted meanwhile instead of following it).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ckv::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// (option, path) pairs; empty paths are skipped. Throws UsageError naming the option. `inputs` are the
// files the command reads ("the case file", path): no output may be one of them, whatever the spelling
// or a symbolic link says.
void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<std::pair<std::string, std::string>>& inputs = {});
// The whole of a regular file of at most max_bytes (never a device, FIFO or directory; it is not opened
// before it is known to be one). Throws UsageError naming the path.
std::string read_regular_file(const std::string& path, size_t max_bytes);
// Throws UsageError when the file cannot be written (nothing is left behind).
void write_atomically(const std::string& path, const std::string& text);

}  // namespace ckv::cli
