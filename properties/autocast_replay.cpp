// properties/autocast_replay.cpp: autocast-replay. Every recomputed call of a dropout site ran under the
// autocast state of the first forward (enabled flag and dtype for the Case's device type) and with grad
// enabled (a recompute without grad builds no graph). Naming the site here comes before grad-baseline
// sees the consequence.
#include <fmt/format.h>

#include "properties/property.hpp"
#include "properties/replay.hpp"

namespace ckv {
namespace {
const char* kName = "autocast-replay";

std::string describe(bool enabled, at::ScalarType dtype) {
  return enabled ? fmt::format("autocast on ({})", c10::toString(dtype)) : "autocast off";
}

Finding judge(const Observations& o) {
  const bool cuda = o.c.device != "cpu";
  size_t compared = 0;
  for (const ReplayPair& p : replay_pairs(o.test.sites)) {
    const SiteCall& r = *p.later;
    if (!p.first) continue;  // rng-replay names a recompute without a first forward
    ++compared;
    const compat::AutocastState &a = r.autocast, &f = p.first->autocast;
    const bool ea = cuda ? a.cuda_enabled : a.cpu_enabled, ef = cuda ? f.cuda_enabled : f.cpu_enabled;
    const at::ScalarType da = cuda ? a.cuda_dtype : a.cpu_dtype, df = cuda ? f.cuda_dtype : f.cpu_dtype;
    if (ea != ef || (ea && da != df))
      return Finding::fail(
          kName, r.step, site_label(r),
          fmt::format("the recompute ran under {} but the first forward under {}", describe(ea, da), describe(ef, df)));
    if (!r.grad_enabled)
      return Finding::fail(kName, r.step, site_label(r), "the recompute ran with grad disabled: it builds no graph");
  }
  if (compared == 0) return Finding::not_applicable(kName, "no segment was recomputed");
  return Finding::pass(kName,
                       fmt::format("{} recomputed site call(s) under the first forward's autocast state", compared));
}
}  // namespace

Property autocast_replay_property() {
  return {kName,
          "every recompute runs under the first forward's autocast state (enabled, dtype) with grad enabled, per site",
          judge};
}

}  // namespace ckv
