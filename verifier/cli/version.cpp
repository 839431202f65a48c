// verifier/cli/version.cpp: see version.hpp. The header is generated at every build (cmake/Version.cmake).
#include "verifier/cli/version.hpp"

#include "ckverify_version.hpp"

namespace ckv::cli {

const char* version() {
  return CKVERIFY_VERSION;
}

}  // namespace ckv::cli
