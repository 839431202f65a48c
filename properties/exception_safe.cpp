// properties/exception_safe.cpp: exception-safe. When a recompute throws (the run stage plants a failure
// in the first recompute of the last checkpointed segment), the exception reaches the caller of backward
// and the generators of every device, the autocast state and grad mode are as they were before backward.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "exception-safe";

Finding judge(const Observations& o) {
  const ThrowExperiment& e = o.throw_exp;
  if (!e.ran && e.forward_failed)
    return Finding::fail(kName, 0, "the experiment's step 0 forward",
                         "the implementation raised in a second run of the run under test's step 0, before the "
                         "experiment changed anything, where the run under test did not (state kept across runs?): " +
                             e.why_not);
  if (!e.ran) return Finding::not_applicable(kName, e.why_not);
  const std::string where = fmt::format("step 0 micro 0 segment {} recompute", e.segment);
  // No recompute of the target segment ran in that backward (the implementation kept its activations, or
  // no gradient reached the segment): there was no recompute to throw, so nothing here to judge; whether
  // that is right is for memory-saved, recompute-count and grad-baseline to say.
  if (!e.threw && !e.recomputed)
    return Finding::not_applicable(
        kName, fmt::format("segment {} was not recomputed in the experiment's backward, so no failure could be "
                           "planted in its recompute",
                           e.segment));
  if (!e.threw) return Finding::fail(kName, 0, where, "backward completed although the recompute threw");
  if (!e.planted_message_seen)
    return Finding::fail(kName, 0, where, "the planted exception did not reach the caller; got: " + e.message);
  std::vector<std::string> leaks;
  if (const std::string d = e.after.rng.differences(e.before.rng); !d.empty()) leaks.push_back("RNG state of " + d);
  if (e.after.autocast != e.before.autocast) leaks.push_back("autocast state");
  if (e.after.grad_enabled != e.before.grad_enabled) leaks.push_back("grad mode");
  if (!leaks.empty())
    return Finding::fail(kName, 0, where,
                         fmt::format("after a throwing recompute these were not restored: {}", fmt::join(leaks, "; ")));
  return Finding::pass(kName, "RNG (every device), autocast and grad mode restored after a throwing recompute");
}
}  // namespace

Property exception_safe_property() {
  return {kName,
          "a recompute that throws propagates, and leaves RNG (every device), autocast and grad mode as they were",
          judge};
}

}  // namespace ckv
