// verifier/impls/faults/cpu_rng_only.cpp: replays the CPU generator but not the CUDA ones, the
// multi-device RNG bug (seed 000, section 5): dropout on a GPU draws new masks in the recompute.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct CpuRngOnlyFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void replay_rng() const override { forward_rng_.restore(/*cuda=*/false); }
};
}  // namespace
ImplEntry cpu_rng_only() {
  return {{"cpu-rng-only", "replays the CPU generator but not the CUDA generators", "rng-replay",
           "dropout on a CUDA device", true},
          [] { return std::make_unique<FrameImpl<CpuRngOnlyFrame>>(); }};
}
}  // namespace ckv::faults
