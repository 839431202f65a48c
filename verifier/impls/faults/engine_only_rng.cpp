// verifier/impls/faults/engine_only_rng.cpp: snapshots the CPU generator the cheap way, its Mersenne
// Twister engine (CPUGeneratorImpl::engine / set_engine, no 5 KiB state tensor per call), and so leaves
// out what else the generator's state holds: the normal sample Box-Muller cached for the next draw. A
// recompute whose segment draws normals then starts from whatever cache the backward left: an odd number
// of normals drawn one by one (randn of fewer than 16 values, as rand=jitter draws per token where
// batch x seq is odd) moves every later draw of the segment by one. Dropout (uniform draws) and normals
// drawn in pairs never see the cache.
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
at::Generator default_cpu() {
  return at::detail::getDefaultCPUGenerator();  // a handle on the one default generator
}
at::CPUGeneratorImpl* cpu_generator(const at::Generator& g) {
  return at::check_generator<at::CPUGeneratorImpl>(g);
}

struct EngineOnlyFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  at::mt19937 engine_;
  void capture_state() override {
    RecomputeFrame::capture_state();  // the autocast state (and the CUDA generators, replayed as the builtin)
    at::Generator g = default_cpu();
    std::lock_guard<std::mutex> lock(g.mutex());
    engine_ = cpu_generator(g)->engine();
  }
  void replay_rng() const override {
    const RngState backward = RngState::capture();
    forward_rng_.restore();            // the CUDA generators, as the builtin replays them
    backward.restore(/*cuda=*/false);  // the CPU generator as backward left it (its cached normal too) ...
    at::Generator g = default_cpu();
    std::lock_guard<std::mutex> lock(g.mutex());
    cpu_generator(g)->set_engine(engine_);  // ... with the forward's engine
  }
};
}  // namespace
ImplEntry engine_only_rng() {
  return {{"engine-only-rng",
           "replays the CPU generator's Mersenne Twister engine but not the normal sample it caches: an odd number "
           "of normals drawn one by one shifts the recompute's draws",
           "rng-replay", "rand=jitter where batch x seq is odd (under 16)"},
          [] { return std::make_unique<FrameImpl<EngineOnlyFrame>>(); }};
}
}  // namespace ckv::faults
