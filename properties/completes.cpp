// properties/completes.cpp: completes. The training run under test finishes every step without an
// error wherever the baseline (no checkpointing) does. An implementation that throws is a finding
// against it, never a crash of ckverify.
#include <fmt/format.h>

#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "completes";

Finding judge(const Observations& o) {
  const RunRecord& t = o.test;
  if (t.completed) return Finding::pass(kName, fmt::format("{} step(s) completed", t.steps.size()));
  const std::string phase = t.error_phase <= 0 ? "forward" : fmt::format("backward pass {}", t.error_phase);
  Finding f = Finding::fail(kName, t.error_step, fmt::format("step {} micro {} {}", t.error_step, t.error_micro, phase),
                            "the run under test threw where the baseline did not: " + t.error);
  f.trace = t.error_trace;
  return f;
}
}  // namespace

Property completes_property() {
  return {kName, "the run under test completes every step wherever the non-checkpointed run does", judge};
}

}  // namespace ckv
