// properties/side_effect_once.cpp: side-effect-once. After every step, every side-effect ledger of the
// run under test (the counters, the log file byte for byte, BatchNorm's running statistics bitwise, the
// cache's call counts, the position of every generator) equals the non-checkpointed run's, and the
// non-checkpointed run's counters, log and cache counts equal the model of their effect (one per
// forward). A module that does not know about recomputation (fx=external) inside a checkpointed segment
// cannot be made safe by any checkpoint: such a Case is reported as not applicable, saying so.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "properties/compare.hpp"
#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "side-effect-once";

std::string expected_log(const Case& c, int steps) {
  // Lines in forward order: per forward, every layer writes its log line(s).
  std::string out;
  for (int s = 0; s < steps; ++s)
    for (int m = 0; m < c.micro; ++m)
      for (int l = 0; l < c.model.layers; ++l) {
        if (c.model.has(kLog)) out += fmt::format("log step {} micro {} layer {}\n", s, m, l);
        if (c.model.has(kExternal)) out += fmt::format("external step {} micro {} layer {}\n", s, m, l);
      }
  return out;
}

// The first line where two logs differ, for the message.
std::string first_difference(const std::string& actual, const std::string& expected) {
  std::istringstream a(actual), e(expected);
  std::string la, le;
  for (int n = 1;; ++n) {
    const bool ha = static_cast<bool>(std::getline(a, la)), he = static_cast<bool>(std::getline(e, le));
    if (!ha && !he) return "identical";
    if (!ha || !he || la != le)
      return fmt::format("line {}: \"{}\" where \"{}\" was expected", n, ha ? la : "(end)", he ? le : "(end)");
  }
}

// Whether an effect module runs inside a checkpointed segment that is recomputed.
// A checkpointed segment with an effect module that is (or may be) recomputed: gradient flows through
// it, or the run under test recomputed it anyway (a recompute without gradient is wasted work, not a
// wrong result: it is not this property's to fail). -1: none.
int checkpointed_effect_segment(const Observations& o) {
  auto recomputed = [&](size_t s) {
    return std::any_of(o.test.segment_calls.begin(), o.test.segment_calls.end(),
                       [&](const SegmentCallRecord& r) { return r.segment == static_cast<int>(s) && r.phase > 0; });
  };
  for (size_t s = 0; s < o.segments.size(); ++s) {
    if (!o.segments[s].checkpointed || !(o.grad_flows[s] || recomputed(s))) continue;
    for (const Unit& u : o.segments[s].units)
      if (u.part == BlockPart::whole || u.part == BlockPart::ffn) return static_cast<int>(s);
  }
  return -1;
}

Finding judge(const Observations& o) {
  if (!o.test.completed) return Finding::not_applicable(kName, "the run under test did not complete");
  const Case& c = o.c;
  if (c.model.has(kExternal))
    if (const int s = checkpointed_effect_segment(o); s >= 0)
      return Finding::not_applicable(
          kName, fmt::format("fx=external runs inside checkpointed segment {}: a module that does not know about "
                             "recomputation must never be checkpointed (any checkpoint replays it)",
                             s));
  for (size_t s = 0; s < o.test.steps.size(); ++s) {
    const Ledger &t = o.test.steps[s].ledger, &b = o.baseline.steps[s].ledger;
    const int step = static_cast<int>(s);
    // How the implementation's own language marks a recompute (docs/properties.md, side-effect-once).
    const std::string mark =
        c.impl.rfind("py:", 0) == 0
            ? " (a recompute not marked with ckverify.segment_scope replays the module's effect; torch's "
              "checkpoint marks it given context_fn=ckverify.recompute_aware_context)"
            : " (a recompute not marked with ckv::SegmentScope, segment_scope.hpp, replays the module's effect)";
    auto fail = [&](const std::string& where, const std::string& what) {
      const bool module =
          where.find("generators") == std::string::npos && where.find("(baseline)") == std::string::npos;
      return Finding::fail(kName, step, fmt::format("step {} {}", step, where), module ? what + mark : what);
    };
    for (int l = 0; l < c.model.layers; ++l) {
      const size_t li = static_cast<size_t>(l);
      if (c.model.has(kCounter) && t.counter[li] != b.counter[li])
        return fail(fmt::format("layer{} counter", l),
                    fmt::format("the counter of layer {} reads {} with checkpointing, {} without", l, t.counter[li],
                                b.counter[li]));
      if (c.model.has(kCache) && t.cache_calls[li] != b.cache_calls[li])
        return fail(fmt::format("layer{} cache", l),
                    fmt::format("the cache of layer {} counted {} forward(s) in the step with checkpointing, {} "
                                "without: a recompute updated state it reads",
                                l, t.cache_calls[li], b.cache_calls[li]));
      const int64_t forwards = static_cast<int64_t>(step + 1) * c.micro;
      if (c.model.has(kCounter) && b.counter[li] != forwards)
        return fail(fmt::format("layer{} counter (baseline)", l),
                    fmt::format("the non-checkpointed run counted {} forwards of layer {}, the model says {}",
                                b.counter[li], l, forwards));
    }
    if (t.log != b.log)
      return fail("log", "the log differs from the non-checkpointed run's at " + first_difference(t.log, b.log));
    if (b.log != expected_log(c, step + 1) && (c.model.has(kLog) || c.model.has(kExternal)))
      return fail("log (baseline)", "the non-checkpointed run's log differs from one line per forward at " +
                                        first_difference(b.log, expected_log(c, step + 1)));
    for (size_t k = 0; k < b.batchnorm.items.size(); ++k) {
      const NamedArray& e = b.batchnorm.items[k];
      const auto r = compare_values({e.name, e.shape, {"i"}}, t.batchnorm.items.at(k).data, e.data,
                                    baseline_tolerance(c.precision));
      if (!r.ok())
        return fail(e.name, "running statistics differ from the non-checkpointed run's (updated in a recompute?): " +
                                r.message());
    }
    if (const std::string d = t.rng.differences(b.rng); !d.empty())
      return fail("generators",
                  "after the step these generators are not where the non-checkpointed run leaves them: " + d +
                      "; the checkpointed run drew "
                      "a different amount of random numbers (a recompute that did not put the "
                      "generator back, or a forward that drew for other shapes" +
                      std::string(o.strategy ? ", or the strategy drawing random numbers of its own" : "") + ")");
  }
  std::string what =
      c.model.effects ? "fx=" + effects_to_string(c.model.effects) + " and the generators" : "the generators";
  return Finding::pass(kName, fmt::format("{} step(s): {} as without checkpointing", o.test.steps.size(), what));
}
}  // namespace

Property side_effect_once_property() {
  return {kName,
          "after every step the side-effect ledger (counters, log bytes, BatchNorm running statistics bitwise, cache "
          "state, every generator's position) equals the non-checkpointed run's, which applies each effect once per "
          "forward",
          judge};
}

}  // namespace ckv
