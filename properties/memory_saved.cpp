// properties/memory_saved.cpp: memory-saved. Checkpointing exists to free activations; an
// implementation that gets every gradient right but keeps what it recomputed (or never lets go of the
// forward's tensors) passes every other property. Three checks, on every step, from the tensor memory the
// run stage measured (verifier/model/memory.hpp; bytes on the Case's device):
//
//  1. Nothing is left behind: when the step's last backward has returned, the run under test holds no
//     more than the baseline (no checkpointing) holds at the same point, beyond a small slack. Every
//     correct implementation releases what it recomputed once the gradients are out. Allowed: what the
//     interface lets an implementation keep per call until end_step (its input, as a copy, and two
//     copies of the generator states). State allocated once and kept (an RNG tracker, a recompute
//     buffer) is not a leak: the first step is not judged, so a one-step Case does not judge this.
//  2. The peak follows the plan: the step's activation peak (peak minus the level when the step began)
//     is within kFactor of an estimate for the plan, built from the baseline's own measurements, and
//     (since the Case is only judged when that bound is below it) below the baseline's peak. The
//     estimate is the classic one (Chen et al. 2016; Korthikanti et al. 2022 count the per-layer bytes
//     the same way): the forward keeps every plain unit's activations a_i (measured as the growth of
//     the baseline's live memory across that unit) and only the outputs of checkpointed segments; in
//     backward the largest checkpointed segment is rebuilt (sum of its a_i) on top of that, and the
//     gradient temporaries G are the baseline's (its peak minus what its forward kept):
//        est = M_f * (x + sum_plain a_i + sum_ckpt out_s + head) + max_ckpt sum_seg a_i + G,
//     M_f = micro-batches held at once (sched=ffbb: all of them); out_s includes what a correct
//     implementation may keep per call (an input copy, two generator states). With several steps the
//     first is not judged (state allocated once shows there). For L equal blocks this is the
//     textbook shape: every block about L*x + a, every N about (L/N)*x + N*a, k segments about
//     k*x + (L/k)*a.
//     A Case whose estimate is not clearly below the baseline (one segment spanning the stack, a plan
//     that checkpoints little, a gradient penalty, whose double backward keeps the recomputed graph for
//     the second pass) cannot show a saving: the peak is then not judged, and the summary says so.
//     Under a strategy the plan is the effective one: the checkpoints it made (blocks recomputed
//     together, Observations::strategy_groups) are the segments of the estimate.
//  3. Nothing is carried into the next step: what a step allocated and still holds when the next step
//     begins (memory.hpp epochs) is no more than the baseline carries, from the third step on. An
//     implementation that keeps a step's input gradients or recomputed tensors until the next step fits
//     check 1's per-call allowance and raises every later step's peak. Nor kept for good by every step:
//     where every step from the second on ends holding more of the step before's allocations than the
//     baseline, memory grows with training (three steps or more).
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "properties/property.hpp"
#include "properties/tolerance.hpp"

namespace ckv {
namespace {
const char* kName = "memory-saved";
// The bounds are in the tolerance table (tolerance.hpp), with their reasons.
constexpr double kFactor = kMemoryPeakFactor;
constexpr int64_t kMinSlack = kMemoryMinSlack;
constexpr double kSlackFraction = kMemorySlackFraction;

std::string kib(int64_t b) {
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024.0);
}

struct Estimate {
  bool judged = false;
  std::string why_not;
  int64_t estimate = 0, baseline = 0;
};

// What a correct implementation may keep per checkpointed call until the step ends (the interface lets
// it keep fn and its arguments until end_step): a copy of the segment's input (implementations that
// save inputs by clone, or gather them into a buffer) and two copies of the generator states (the CPU
// state and a tracker's, as Megatron-LM keeps them).
int64_t per_call(const Observations& o, size_t s) {
  const MemoryRecord& B = o.baseline.memory;
  const int64_t input = s == 0 ? B.forward_start : B.segment_output.at(s - 1);
  return input + 2 * B.rng_state;
}

// The checkpoints of the plan as [first, last] segments: the plan's segments, or a strategy's groups
// (blocks recomputed together) with every other block on its own.
struct Group {
  size_t first, last;
  bool checkpointed;
};
std::vector<Group> groups_of(const Observations& o) {
  std::vector<Group> out;
  for (size_t s = 0; s < o.segments.size();) {
    size_t last = s;
    if (o.strategy)
      for (const auto& [a, b] : o.strategy_groups)
        if (a >= 0 && static_cast<size_t>(a) == s && b >= a && static_cast<size_t>(b) < o.segments.size())
          last = std::max(last, static_cast<size_t>(b));
    bool ckpt = false;
    for (size_t k = s; k <= last; ++k) ckpt |= o.segments[k].checkpointed;
    out.push_back({s, last, ckpt});
    s = last + 1;
  }
  return out;
}

std::string plan_name(const Observations& o) {
  return o.strategy ? "(the strategy's: " + describe_effective_plan(o) + ")" : o.c.plan.to_string();
}

int64_t held_micro(const Observations& o) {
  return o.c.sched == Schedule::ffbb ? o.c.micro : 1;
}

int64_t slack_of(const Observations& o) {
  const StepMemory& b0 = o.baseline.memory.steps.at(0);
  const double activations = static_cast<double>(held_micro(o) * (b0.after_forward - b0.before));
  return std::max<int64_t>(kMinSlack, static_cast<int64_t>(kSlackFraction * activations));
}

Estimate estimate_peak(const Observations& o) {
  Estimate e;
  const MemoryRecord& B = o.baseline.memory;
  const StepMemory& b0 = B.steps.at(0);
  e.baseline = b0.peak - b0.before;
  if (o.strategy && o.strategy_plan_varies) {
    e.why_not = "the strategy checkpointed other blocks in other steps or micro-batches: no one plan to estimate";
    return e;
  }
  if (o.passes > 1) {
    e.why_not = "gp>0: the double backward keeps the recomputed graph for its second pass, so nothing is saved";
    return e;
  }
  size_t units = 0;
  for (const auto& s : o.segments) units += s.units.size();
  if (B.unit_levels.size() != units || B.segment_output.size() != o.segments.size()) {
    e.why_not = "the baseline's per-unit measurements are incomplete";
    return e;
  }
  const int64_t forward_kept = b0.after_forward - b0.before;
  const int64_t head = forward_kept - (B.unit_levels.empty() ? B.forward_start : B.unit_levels.back());
  int64_t kept = B.forward_start + head, rebuilt = 0;
  size_t u = 0;
  int64_t previous = B.forward_start;
  for (const Group& g : groups_of(o)) {
    int64_t seg_bytes = 0;
    for (size_t s = g.first; s <= g.last; ++s)
      for (size_t k = 0; k < o.segments[s].units.size(); ++k, ++u) {
        seg_bytes += B.unit_levels[u] - previous;
        previous = B.unit_levels[u];
      }
    if (g.checkpointed) {
      kept += B.segment_output[g.last] + per_call(o, g.first);
      if (o.grad_flows[g.last]) rebuilt = std::max(rebuilt, seg_bytes);
    } else {
      kept += seg_bytes;
    }
  }
  const int64_t held = held_micro(o);
  const int64_t temporaries = std::max<int64_t>(0, e.baseline - held * forward_kept);
  // What backward leaves behind (parameter gradients, the input's gradient) builds up while the
  // segments are rebuilt one after another.
  const int64_t left = std::max<int64_t>(0, b0.after_backward - b0.before);
  e.estimate = held * kept + rebuilt + temporaries + left;
  const int64_t slack = slack_of(o);
  if (static_cast<double>(e.estimate) * kFactor + static_cast<double>(slack) >= static_cast<double>(e.baseline)) {
    e.why_not =
        fmt::format("plan {} is not expected to save memory on this Case (estimate {} vs {} without checkpointing)",
                    plan_name(o), kib(e.estimate), kib(e.baseline));
    return e;
  }
  e.judged = true;
  return e;
}

Finding judge(const Observations& o) {
  if (!o.test.completed) return Finding::not_applicable(kName, "the run under test did not complete");
  bool any = false;
  for (size_t s = 0; s < o.segments.size(); ++s) any |= o.segments[s].checkpointed && o.grad_flows[s];
  if (!any) return Finding::not_applicable(kName, "no checkpointed segment has gradient flowing through it");
  const MemoryRecord &B = o.baseline.memory, &T = o.test.memory;
  if (B.steps.empty() || T.steps.size() != B.steps.size())
    return Finding::not_applicable(kName, "the runs' memory was not measured");
  const StepMemory& b0 = B.steps[0];
  const int64_t activations = b0.after_forward - b0.before;
  const int64_t slack = slack_of(o);
  if (B.segment_output.size() != o.segments.size())
    return Finding::not_applicable(kName, "the baseline's per-segment measurements are incomplete");

  // State an implementation allocates once and keeps (an RNG tracker's generator states, a recompute
  // buffer sized to the largest segment) shows in the first step only: from the second step on it is
  // part of the level the step starts from. So the first step is judged only in a one-step Case, and
  // then only its peak: one step cannot tell such state from a leak.
  const size_t first = T.steps.size() > 1 ? 1 : 0;
  int64_t allowed_calls = 0;  // what the step's calls may keep until end_step (per_call)
  for (const Group& g : groups_of(o))
    if (g.checkpointed) allowed_calls += o.c.micro * per_call(o, g.first);
  const bool leak_judged = T.steps.size() > 1;
  for (size_t k = first; leak_judged && k < T.steps.size(); ++k) {
    const StepMemory &t = T.steps[k], &b = B.steps[k];
    const int64_t excess = (t.after_backward - t.before) - (b.after_backward - b.before);
    if (excess > slack + allowed_calls)
      return Finding::fail(kName, static_cast<int>(k), fmt::format("step {}, after backward", k),
                           fmt::format("{} more than the baseline is still held after backward (its forward keeps {}; "
                                       "allowed: the calls' inputs and generator states {} + {}): what the recompute "
                                       "built was not released",
                                       kib(excess), kib(activations), kib(allowed_calls), kib(slack)));
  }
  // 3. Nothing is carried into the next step: what a step allocated, still holds when the next step
  // begins (after end_step, which ends what the interface lets a call keep) and releases during that
  // step is no more than the baseline's. State kept for good (still live when the next step ends) is
  // not counted, and neither are the first two steps, which may allocate it. The slack is what a
  // tracker that replaces its generator states every step carries, and bookkeeping scalars.
  const int64_t carry_slack = kMinSlack + 2 * B.rng_state;
  auto carried = [](const StepMemory& m) { return std::max<int64_t>(0, m.carried - m.kept); };
  int64_t carried_most = 0;
  for (size_t k = 2; k < T.steps.size(); ++k) {
    const int64_t excess = carried(T.steps[k]) - carried(B.steps[k]);
    carried_most = std::max(carried_most, excess);
    if (excess > carry_slack)
      return Finding::fail(kName, static_cast<int>(k), fmt::format("step {}, start", k),
                           fmt::format("{} allocated during step {} was still held when step {} began and released "
                                       "during it, {} more than the baseline (allowed {}): the implementation keeps a "
                                       "step's tensors into the next",
                                       kib(carried(T.steps[k])), k - 1, k, kib(excess), kib(carry_slack)));
  }
  // Kept for good, step after step: state allocated once and kept is not a leak, but memory that every
  // step adds and never releases grows with training (a list of each call's outputs, kept "for
  // inspection"). Judged where each step from the second on ended still holding more of what the step
  // before allocated than the baseline does: two such steps at least (steps >= 3), since state may be
  // allocated in the first step and kept.
  int64_t kept_least = std::numeric_limits<int64_t>::max();
  for (size_t k = 1; k < T.steps.size(); ++k) kept_least = std::min(kept_least, T.steps[k].kept - B.steps[k].kept);
  if (T.steps.size() > 2 && kept_least > carry_slack) {
    const size_t last = T.steps.size() - 1;
    return Finding::fail(kName, static_cast<int>(last), fmt::format("step {}, end", last),
                         fmt::format("at the end of every step from step 1 on, at least {} more than the baseline of "
                                     "what the step before allocated was still held (allowed {}; at the end of step "
                                     "{}: {}): the implementation keeps something of every step for good, and the "
                                     "memory it holds grows with every step",
                                     kib(kept_least), kib(carry_slack), last, kib(T.steps[last].kept)));
  }
  const Estimate e = estimate_peak(o);
  int64_t worst = 0;
  for (size_t k = first; k < T.steps.size(); ++k) {
    const int64_t peak = T.steps[k].peak - T.steps[k].before;
    worst = std::max(worst, peak);
    if (!e.judged) continue;
    const double bound = kFactor * static_cast<double>(e.estimate) + static_cast<double>(slack);
    if (static_cast<double>(peak) > bound)
      return Finding::fail(
          kName, static_cast<int>(k), fmt::format("step {}, activation peak", k),
          fmt::format("plan {} peaked at {} above the step's start; without checkpointing {}, estimate for the plan {} "
                      "(allowed {:.2f}x + {}): tensors were held that the plan does not keep (activations it frees, or "
                      "copies the implementation made)",
                      plan_name(o), kib(peak), kib(e.baseline), kib(e.estimate), kFactor, kib(slack)));
  }
  std::string leak = leak_judged ? "nothing held after backward"
                                 : "after-backward level not judged (one step cannot tell kept state from a leak)";
  if (T.steps.size() > 2)
    leak +=
        fmt::format(", nothing carried into the next step (at most {} more than the baseline) or kept by every step",
                    kib(carried_most));
  if (!e.judged && !leak_judged) return Finding::not_applicable(kName, "one step, and " + e.why_not);
  if (!e.judged) return Finding::pass(kName, fmt::format("{}; peak {} not judged: {}", leak, kib(worst), e.why_not));
  return Finding::pass(kName, fmt::format("activation peak {} vs {} without checkpointing (estimate {}); {}",
                                          kib(worst), kib(e.baseline), kib(e.estimate), leak));
}
}  // namespace

Property memory_saved_property() {
  return {
      kName,
      "after backward the run holds no more than without checkpointing, and carries no more of a step's tensors into "
      "the next; where the plan should save memory, the activation peak is within 1.25x of the plan's estimate and "
      "below the no-checkpoint peak",
      judge};
}

}  // namespace ckv
