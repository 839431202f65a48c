// verifier/impls/faults/no_restore_on_throw.cpp: sets the forward's RNG, autocast and grad mode by hand
// for the recompute and puts the backward's state back only when fn returns: a recompute that throws
// (an OOM retried by the training loop) leaves the random stream at the forward's position.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct NoRestoreFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void recompute() override {
    check_unchanged();
    const RngState rng = RngState::capture();
    const compat::AutocastState autocast = compat::AutocastState::current();
    const bool grad = torch::GradMode::is_enabled();
    replay_rng();
    recompute_autocast().apply();
    torch::GradMode::set_enabled(true);
    run_fn_collecting();
    rng.restore();
    autocast.apply();
    torch::GradMode::set_enabled(grad);
  }
};
}  // namespace
ImplEntry no_restore_on_throw() {
  return {{"no-restore-on-throw", "restores RNG, autocast and grad mode only when the recompute succeeds",
           "exception-safe", "a recompute that throws"},
          [] { return std::make_unique<FrameImpl<NoRestoreFrame>>(); }};
}
}  // namespace ckv::faults
