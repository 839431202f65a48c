// verifier/impls/faults/frame_impl.hpp: an implementation that checkpoints every segment with a
// RecomputeFrame of type Frame (verifier/checkpoint/frame.hpp). The builtin uses RecomputeFrame
// itself (with early stop); most faults derive a frame that breaks exactly one step of it.
#pragma once

#include "verifier/checkpoint/frame.hpp"
#include "verifier/impls/interface.hpp"

namespace ckv::faults {

// The faults recompute the whole segment (no early stop), as most hand-written checkpoints do: a
// replayed effect or a redrawn noise term after a segment's last saving op is then reached, and shows.
inline CheckpointOptions full_recompute() {
  CheckpointOptions o;
  o.early_stop = false;
  return o;
}

template <class Frame>
class FrameImpl : public CheckpointImpl {
 public:
  explicit FrameImpl(CheckpointOptions options = full_recompute()) : options_(options) {}
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    if (call.generators.empty()) return checkpoint_detail::checkpoint_with<Frame>(call.fn, call.args, options_);
    CheckpointOptions options = options_;  // the call's generators replayed besides the configured ones
    options.generators.insert(options.generators.end(), call.generators.begin(), call.generators.end());
    return checkpoint_detail::checkpoint_with<Frame>(call.fn, call.args, options);
  }

 private:
  CheckpointOptions options_;
};

}  // namespace ckv::faults
