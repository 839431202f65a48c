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

// A file (or directory) named on the command line. `path` is what is opened: `given` made absolute
// against the working directory when the command line was parsed (args.hpp: add_file), so a plugin or a
// Python module that changes the working directory cannot move where it is written. Messages show
// `given`, as it was spelled.
struct FileArg {
  std::string given;  // "": not given
  std::string path;
  bool empty() const { return given.empty(); }
};
// `given` resolved against the working directory now ("" stays "").
FileArg file_arg(const std::string& given);
// FILE.json's sibling FILE.NAME.json (both spellings).
FileArg beside(const FileArg& file, const std::string& name);
// DIR/NAME (both spellings).
FileArg inside(const FileArg& dir, const std::string& name);

// (option, file) pairs; files not given are skipped. Throws UsageError naming the option. `inputs` are
// the files the command reads ("the case file", path as opened): no output may be one of them, whatever
// the spelling or a symbolic link says.
void check_outputs(const std::vector<std::pair<std::string, FileArg>>& outputs,
                   const std::vector<std::pair<std::string, std::string>>& inputs = {});
// The whole of a regular file of at most max_bytes (never a device, FIFO or directory; it is not opened
// before it is known to be one). Throws UsageError naming the path.
std::string read_regular_file(const std::string& path, size_t max_bytes);
// Throws UsageError when the file cannot be written (nothing is left behind).
void write_atomically(const FileArg& file, const std::string& text);

}  // namespace ckv::cli
