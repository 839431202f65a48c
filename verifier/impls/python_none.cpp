// verifier/impls/python_none.cpp: the build without the Python bridge (the floor build: Debian's
// LibTorch has no Python bindings). py: specs are refused with one line.
#include <stdexcept>

#include "verifier/case/case.hpp"
#include "verifier/impls/loader.hpp"

namespace ckv {

bool python_bridge_available() {
  return false;
}

std::unique_ptr<CheckpointImpl> load_python(const std::string& spec) {
  throw std::invalid_argument(
      "--impl " + sanitize(spec, 200) +
      ": this build has no Python bridge (only the primary build, on the torch wheel, has one)");
}

}  // namespace ckv
