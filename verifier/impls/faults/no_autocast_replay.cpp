// verifier/impls/faults/no_autocast_replay.cpp: recomputes under whatever autocast state backward runs
// in (autocast off), not the forward's (pytorch issue 71124): the recompute saves fp32 tensors where the
// forward saved bf16 ones.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct NoAutocastReplayFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  compat::AutocastState recompute_autocast() const override { return compat::AutocastState::current(); }
};
}  // namespace
ImplEntry no_autocast_replay() {
  return {{"no-autocast-replay", "recomputes under the backward's autocast state instead of the forward's",
           "autocast-replay", "prec=bf16 or fp16"},
          [] { return std::make_unique<FrameImpl<NoAutocastReplayFrame>>(); }};
}
}  // namespace ckv::faults
