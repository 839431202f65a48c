// verifier/impls/faults/recompute_twice.cpp: runs the recompute twice (a retry loop, or a recompute per
// consumer of the segment's outputs): gradients stay right, the compute bill and any side effect double.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct TwiceFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void recompute() override {
    RecomputeFrame::recompute();
    RecomputeFrame::recompute();
  }
};
}  // namespace
ImplEntry recompute_twice() {
  return {{"recompute-twice", "runs the recompute twice in backward", "recompute-count",
           "any checkpointed segment with gradient flowing"},
          [] { return std::make_unique<FrameImpl<TwiceFrame>>(); }};
}
}  // namespace ckv::faults
