// verifier/impls/faults/single_recompute.cpp: recomputes at most once per forward and fails when
// backward asks again (early non-reentrant checkpoints popped their storage on unpack): a gradient
// penalty, whose second backward goes through the segment again, breaks.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct SingleRecomputeFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void recompute() override {
    if (done_)
      throw CheckpointError(
          "checkpoint: this segment was already recomputed; backward through a checkpoint twice is "
          "not supported");
    done_ = true;
    RecomputeFrame::recompute();
  }
  bool done_ = false;
};
}  // namespace
ImplEntry single_recompute() {
  return {{"single-recompute", "recomputes once per forward; a second backward through the segment fails", "completes",
           "gp>0 (double backward)"},
          [] { return std::make_unique<FrameImpl<SingleRecomputeFrame>>(); }};
}
}  // namespace ckv::faults
