// verifier/impls/faults/per_segment_state.cpp: keeps the forward's RNG state per segment (a member of
// the wrapped module) instead of per call: when a second forward of the same segment runs before the
// first one's backward (micro-batches forwarded first, pipelines), the recompute replays the wrong state.
#include <map>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
class PerSegmentStateImpl : public CheckpointImpl {
  struct Frame : checkpoint_detail::RecomputeFrame {
    Frame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions o, std::map<int, RngState>* slots,
          int segment)
        : RecomputeFrame(std::move(fn), std::move(args), o), slots_(slots), segment_(segment) {}
    void capture_state() override {
      RecomputeFrame::capture_state();
      (*slots_)[segment_] = forward_rng_;
    }
    void replay_rng() const override { slots_->at(segment_).restore(); }
    std::map<int, RngState>* slots_;
    int segment_;
  };

 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    return checkpoint_detail::checkpoint_with<Frame>(call.fn, call.args, full_recompute(), &slots_, call.segment);
  }

 private:
  std::map<int, RngState> slots_;  // segment -> the RNG state of its latest forward
};
}  // namespace
ImplEntry per_segment_state() {
  return {{"per-segment-state", "keeps the forward's RNG state per segment, not per call", "rng-replay",
           "micro>1 with sched=ffbb and dropout"},
          [] { return std::make_unique<PerSegmentStateImpl>(); }};
}
}  // namespace ckv::faults
