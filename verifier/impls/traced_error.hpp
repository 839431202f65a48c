// verifier/impls/traced_error.hpp: the traceback behind an implementation's exception, where the
// implementation's runtime keeps one (a Python exception: the frames from the Python checkpoint down
// to the line that raised). The run stage records it beside the one-line message, and reports carry it
// (a finding's `trace`), so a failure of a Python implementation says where in its code it failed.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace ckv {

// An exception that brings its traceback along (thrown by the Python bridge).
struct TracedError : std::runtime_error {
  TracedError(const std::string& what, std::string trace) : std::runtime_error(what), trace(std::move(trace)) {}
  std::string trace;
};

// The traceback of `e`: a TracedError's own, else what the registered tracer finds (the Python bridge
// registers one that formats a Python exception thrown through LibTorch, e.g. by a recompute in
// backward); empty when there is none. At most about 8000 printable characters, the end kept.
std::string exception_trace(const std::exception& e);
void set_exception_tracer(std::function<std::string(const std::exception&)> tracer);

}  // namespace ckv
