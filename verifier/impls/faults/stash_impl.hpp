// verifier/impls/faults/stash_impl.hpp: an implementation that checkpoints every segment with a
// RecomputeFrame of type Frame (no early stop) and gives each frame a stash that end_step clears: the
// faults that keep what they recomputed until the step ends (keep-activations, thread-recompute-cache).
#pragma once

#include <memory>
#include <vector>

#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {

using Stash = std::shared_ptr<std::vector<torch::Tensor>>;

template <class Frame>
class StashImpl : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    return checkpoint_detail::checkpoint_with<Frame>(call.fn, call.args, full_recompute(), stash_);
  }
  void end_step(int) override { stash_->clear(); }

 private:
  Stash stash_ = std::make_shared<std::vector<torch::Tensor>>();
};

}  // namespace ckv::faults
