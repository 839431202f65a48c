// properties/recompute_count.cpp: recompute-count. In every micro-batch of every step, each segment's
// forward ran once; a checkpointed segment through which gradient flows was recomputed at least once and
// at most once per backward pass (two with a gradient penalty); a checkpointed segment without gradient
// at most once per pass; a plain segment never during backward. Under a strategy (which decides what to
// checkpoint, step by step), each block's forward ran once and a block recomputed at most once per
// backward pass of that forward; the summary gives the effective plan. A recompute receives the
// non-tensor arguments its forward received (others make it recompute another function).
#include <fmt/format.h>

#include <map>
#include <tuple>

#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "recompute-count";

std::string describe(const Segment& s) {
  const Unit &a = s.units.front(), &b = s.units.back();
  if (a.part == BlockPart::embed && s.units.size() == 1) return "input projection";
  const int first = a.part == BlockPart::embed && s.units.size() > 1 ? s.units[1].layer : a.layer;
  return first == b.layer ? fmt::format("layer {}", b.layer) : fmt::format("layers {}..{}", first, b.layer);
}

Finding judge(const Observations& o) {
  if (!o.test.completed) return Finding::not_applicable(kName, "the run under test did not complete");
  // (step, micro, segment) -> calls in the forward, and per backward pass
  std::map<std::tuple<int, int, int>, std::vector<int>> calls;
  // (step, micro, segment) -> the non-tensor arguments of its forward, and of the first recompute that
  // received others (a recompute of another function: another layer range, another weight).
  std::map<std::tuple<int, int, int>, std::string> forward_scalars;
  std::map<std::tuple<int, int, int>, const SegmentCallRecord*> other_scalars;
  for (const auto& r : o.test.segment_calls) {
    auto& v = calls[{r.step, r.micro, r.segment}];
    v.resize(static_cast<size_t>(std::max<int>(o.passes, r.phase) + 1), 0);
    ++v[static_cast<size_t>(r.phase)];
    if (r.phase == 0) forward_scalars.try_emplace({r.step, r.micro, r.segment}, r.scalars);
  }
  // (On ranks the records gathered from the other ranks carry no arguments: not compared there.)
  if (o.c.ranks() == 1)
    for (const auto& r : o.test.segment_calls) {
      const auto it = forward_scalars.find({r.step, r.micro, r.segment});
      if (r.phase > 0 && it != forward_scalars.end() && r.scalars != it->second)
        other_scalars.try_emplace({r.step, r.micro, r.segment}, &r);
    }
  for (int step = 0; step < o.c.steps; ++step)
    for (int m = 0; m < o.c.micro; ++m)
      for (size_t s = 0; s < o.segments.size(); ++s) {
        std::vector<int> v = calls[{step, m, static_cast<int>(s)}];
        v.resize(static_cast<size_t>(o.passes + 1), 0);
        int backward = 0, most = 0;
        for (size_t k = 1; k < v.size(); ++k) backward += v[k], most = std::max(most, v[k]);
        const bool ckpt = o.segments[s].checkpointed;
        std::string wrong;
        if (v[0] != 1)
          wrong = fmt::format("its forward ran {} time(s) in the forward pass, expected 1", v[0]);
        else if (!ckpt && backward > 0)
          wrong = fmt::format("it is not checkpointed but ran {} time(s) during backward", backward);
        else if (ckpt && most > 1)
          wrong = fmt::format("it was recomputed {} time(s) in one backward pass, expected once", most);
        else if (ckpt && o.grad_flows[s] && backward == 0 && !o.strategy)
          wrong =
              "gradient should flow through it but it was never recomputed (its activations were kept, or it ran "
              "without a graph)";
        else if (const auto it = other_scalars.find({step, m, static_cast<int>(s)}); it != other_scalars.end())
          wrong = fmt::format(
              "its recompute (backward pass {}) received other non-tensor arguments than its forward: {} (the "
              "forward: {}); it recomputed another function",
              it->second->phase, it->second->scalars.empty() ? "none" : it->second->scalars,
              forward_scalars.at({step, m, static_cast<int>(s)}));
        if (!wrong.empty() && o.strategy)
          return Finding::fail(kName, step, fmt::format("step {} micro {} block {}", step, m, s),
                               wrong + " (the strategy's effective plan: " + describe_effective_plan(o) + ")");
        if (!wrong.empty())
          return Finding::fail(
              kName, step, fmt::format("step {} micro {} segment {} ({})", step, m, s, describe(o.segments[s])), wrong);
      }
  if (o.strategy)
    return Finding::pass(kName, fmt::format("{} block(s) x {} step(s) x {} micro-batch(es) ran as often as expected; "
                                            "the strategy's effective plan: {}",
                                            o.segments.size(), o.c.steps, o.c.micro, describe_effective_plan(o)));
  return Finding::pass(kName, fmt::format("{} segment(s) x {} step(s) x {} micro-batch(es) ran as often as expected",
                                          o.segments.size(), o.c.steps, o.c.micro));
}
}  // namespace

Property recompute_count_property() {
  return {kName,
          "each segment's forward runs once; a checkpointed one is recomputed at most once per backward pass (at least "
          "once when gradient flows through it), with its forward's non-tensor arguments; a plain one never",
          judge};
}

}  // namespace ckv
