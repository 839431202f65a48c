// verifier/impls/faults/single_recompute.cpp: recomputes at most once per forward and fails when
// backward asks again (early non-reentrant checkpoints popped their storage on unpack): a gradient
// penalty, whose second backward goes through the segment again, breaks.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct SingleRecomputeFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  torch::Tensor unpack(size_t index) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool consumed = index >= recomputed_.size() || !recomputed_[index].defined();
      if (consumed && done_)
        throw CheckpointError("checkpoint: saved tensor " + std::to_string(index) +
                              " was already handed out; backward through a checkpoint twice is not supported");
      done_ = done_ || consumed;
    }
    return RecomputeFrame::unpack(index);
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
