// verifier/case/environment_error.hpp: the one error every layer may raise when a Case cannot run on
// this machine or build (no such device, too large, a LibTorch too old for a precision). Never the
// implementation's fault: the CLI reports it as exit 2, naming what is missing.
#pragma once

#include <stdexcept>

namespace ckv {

class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ckv
