// verifier/impls/faults/rng_ring.cpp: keeps the forward's RNG states in a preallocated ring of 32
// slots, one per checkpointed call in call order, as buffers sized once for "enough" checkpoints do
// (DeepSpeed's `number_checkpoints`-sized partition buffers). While at most 32 checkpointed calls wait
// for their backward it is correct; a deeper stack, or micro-batches forwarded first, wraps the ring
// and the oldest calls replay a newer call's state.
#include <array>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
constexpr size_t kRingSlots = 32;

class RngRingImpl : public CheckpointImpl {
  using Ring = std::array<RngState, kRingSlots>;
  struct Frame : checkpoint_detail::RecomputeFrame {
    Frame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions o, Ring* ring, size_t slot)
        : RecomputeFrame(std::move(fn), std::move(args), o), ring_(ring), slot_(slot) {}
    void capture_state() override {
      RecomputeFrame::capture_state();
      (*ring_)[slot_] = forward_rng_;
    }
    void replay_rng() const override { (*ring_)[slot_].restore(); }
    Ring* ring_;
    size_t slot_;
  };

 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    const size_t slot = next_++ % kRingSlots;
    return checkpoint_detail::checkpoint_with<Frame>(call.fn, call.args, full_recompute(), &ring_, slot);
  }

 private:
  Ring ring_;
  size_t next_ = 0;
};
}  // namespace
ImplEntry rng_ring() {
  return {{"rng-ring-32", "keeps RNG states in a ring of 32 slots: more waiting calls overwrite the oldest",
           "rng-replay", "more than 32 checkpointed calls before their backward (a deep stack) with dropout"},
          [] { return std::make_unique<RngRingImpl>(); }};
}
}  // namespace ckv::faults
