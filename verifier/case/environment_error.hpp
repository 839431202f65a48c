// verifier/case/environment_error.hpp: the one error every layer may raise when a Case cannot run on
// this machine or build (no such device, too large, a LibTorch too old for a precision). Never the
// implementation's fault: the CLI reports it as exit 2, naming what is missing.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

namespace ckv {

class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether an exception says the process ran out of memory (std::bad_alloc, LibTorch's CPU allocator,
// the CUDA caching allocator). Out of memory is the machine's limit as far as ckverify can tell (a
// leak shows on smaller Cases as memory-saved), never a finding against the implementation.
inline bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string msg = e.what();
  const std::string head = msg.substr(0, msg.find('\n'));
  return head.find("out of memory") != std::string::npos || head.find("not enough memory") != std::string::npos ||
         head.find("std::bad_alloc") != std::string::npos;
}

}  // namespace ckv
