// verifier/impls/faults/frame_impl.hpp: an implementation that checkpoints every segment with a
// RecomputeFrame of type Frame (verifier/checkpoint/frame.hpp). The builtin uses RecomputeFrame
// itself; most faults derive a frame that breaks exactly one step of it.
#pragma once

#include "verifier/checkpoint/frame.hpp"
#include "verifier/impls/interface.hpp"

namespace ckv::faults {

template <class Frame>
class FrameImpl : public CheckpointImpl {
 public:
  explicit FrameImpl(CheckpointOptions options = {}) : options_(options) {}
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    return checkpoint_detail::checkpoint_with<Frame>(call.fn, call.args, options_);
  }

 private:
  CheckpointOptions options_;
};

}  // namespace ckv::faults
