// verifier/impls/faults/replays_effects.cpp: recomputes without telling the modules it is a recompute
// (segment_scope.hpp): every counter, log line, running-statistics update and cache update in the
// segment happens twice, as in any checkpoint that ignores side effects.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct ReplaysEffectsFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  bool marks_recompute() const override { return false; }
};
}  // namespace
ImplEntry replays_effects() {
  return {{"replays-effects",
           "recomputes without telling the modules: counters, logs, running statistics and caches update twice",
           "side-effect-once", "fx=counter, log, bn or cache inside a checkpointed segment"},
          [] { return std::make_unique<FrameImpl<ReplaysEffectsFrame>>(); }};
}
}  // namespace ckv::faults
