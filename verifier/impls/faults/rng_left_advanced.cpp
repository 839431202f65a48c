// verifier/impls/faults/rng_left_advanced.cpp: replays the forward's generators for the recompute and puts
// the backward's back only on the error path (the "restore in the catch block" pattern), not after a
// recompute that succeeds: the random stream is left where the recompute's draws ended, so every later
// draw (dropout, noise, data shuffling) shifts.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct LeftAdvancedFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void recompute() override {
    check_unchanged();
    checkpoint_detail::GlobalStateGuard guard(/*rng=*/false);  // autocast and grad mode only
    const RngState before = RngState::capture();
    try {
      replay_rng();
      compat::ScopedAutocastState autocast(recompute_autocast());
      torch::AutoGradMode grad_on(true);
      run_fn_collecting();
    } catch (...) {
      before.restore();
      throw;
    }
  }
};
}  // namespace
ImplEntry rng_left_advanced() {
  return {{"rng-left-advanced", "leaves the generators where the recompute's draws ended instead of putting them back",
           "side-effect-once", "dropout or fx=noise in a checkpointed segment"},
          [] { return std::make_unique<FrameImpl<LeftAdvancedFrame>>(); }};
}
}  // namespace ckv::faults
