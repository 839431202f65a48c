// verifier/impls/faults/tensor_parallel.cpp: the faults that model-parallel checkpointing shipped, shown
// on Cases with tp > 1 (docs/parallel.md). Two are checkpoints that mishandle the model-parallel RNG
// tracker's stream (SegmentCall::generators); two are framework bugs around a correct checkpoint (the
// builtin), applied by the trainer to the sharded model (ParallelFault); one is a reentrant design that
// differentiates its recompute in two passes, so every backward collective inside it runs twice; one,
// on Cases with dp > 1, is torch's reentrant design, whose nested backward fires the data-parallel
// reducer's hook of a shared parameter twice.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"
#include "verifier/impls/faults/reentrant.hpp"

namespace ckv::faults {
namespace {

// Replays the default generators only, as torch.utils.checkpoint does unless told of the tracker
// (Megatron's checkpoint before its tracker was forked in the recompute): dropout inside the
// tensor-parallel regions draws new masks in the recompute.
class TrackerNotReplayed : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    return checkpoint_detail::checkpoint_with<checkpoint_detail::RecomputeFrame>(call.fn, call.args, full_recompute());
  }
};

// Replays the tracker's stream for the recompute but leaves it where the recompute left it: the
// stream's later draws (the next segments' forwards, the next step) repeat or skip masks.
struct TrackerLeftAdvancedFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void recompute() override {
    const SegmentFunction original = fn_;
    std::vector<torch::Tensor> after;
    const std::vector<at::Generator> streams = options_.generators;
    fn_ = [&](const std::vector<c10::IValue>& args) {
      std::vector<torch::Tensor> out = original(args);
      for (const at::Generator& g : streams) after.push_back(g.get_state());
      return out;
    };
    RecomputeFrame::recompute();  // restores every generator to its backward-time state ...
    fn_ = original;
    for (size_t i = 0; i < after.size() && i < streams.size(); ++i) {
      at::Generator g = streams[i];
      g.set_state(after[i]);  // ... and this puts the streams back where the recompute left them
    }
  }
};

// The reentrant skeleton with one variant flag set, searched on Cases with `case_fields`.
ImplEntry reentrant(const char* name, const char* what, const char* killed_by, const char* exposed,
                    const char* case_fields, bool ReentrantVariant::*flag) {
  ImplEntry e{{name, what, killed_by, exposed}, [flag] {
                ReentrantVariant v;
                v.*flag = true;
                return std::make_unique<ReentrantCheckpoint>(v);
              }};
  e.info.case_fields = case_fields;
  return e;
}

ImplEntry framework(const char* name, const char* what, const char* killed_by, const char* exposed, ParallelFault f) {
  ImplEntry e{{name, what, killed_by, exposed}, [] { return make_builtin(); }};
  e.info.parallel_fault = f;
  e.info.case_fields = "tp=2";
  return e;
}
}  // namespace

ImplEntry tracker_not_replayed() {
  ImplEntry e{{"tracker-not-replayed",
               "replays the default generators but not the model-parallel stream it is shown: dropout inside a "
               "tensor-parallel region draws new masks in the recompute",
               "rng-replay", "tp>1 with dropout inside a region (drop.attn_probs or drop.ffn_hidden) recomputed"},
              [] { return std::make_unique<TrackerNotReplayed>(); }};
  e.info.case_fields = "tp=2";
  return e;
}

ImplEntry tracker_left_advanced() {
  ImplEntry e{{"tracker-left-advanced",
               "replays the model-parallel stream for the recompute but leaves it where the recompute left it",
               "side-effect-once", "tp>1 with dropout inside a region recomputed"},
              [] { return std::make_unique<FrameImpl<TrackerLeftAdvancedFrame>>(); }};
  e.info.case_fields = "tp=2";
  return e;
}

ImplEntry tracker_same_seed() {
  return framework("tracker-same-seed",
                   "the model-parallel stream is seeded equally on every tensor-parallel rank: the ranks drop the "
                   "same units of their shards",
                   "parallel-consistency", "tp>1 with dropout inside a region", ParallelFault::same_stream_seed);
}

ImplEntry replicated_from_stream() {
  return framework("replicated-from-stream",
                   "replicated dropout (attn_out, ffn_out) draws from the model-parallel stream: the ranks drop "
                   "different units of the same activation",
                   "parallel-consistency", "tp>1 with replicated dropout (drop.attn_out or drop.ffn_out)",
                   ParallelFault::replicated_from_stream);
}

ImplEntry reentrant_two_pass() {
  return reentrant("reentrant-two-pass",
                   "a reentrant checkpoint that differentiates its recompute in two passes (inputs, then parameters): "
                   "every backward collective inside a segment runs twice",
                   "collective-ledger", "tp>1 with a checkpointed segment whose inputs and parameters both need grad",
                   "tp=2", &ReentrantVariant::two_pass);
}

ImplEntry reentrant_nested_backward() {
  return reentrant("reentrant-nested-backward",
                   "a reentrant checkpoint whose recompute runs a nested backward (as torch's use_reentrant=True): a "
                   "parameter read by two checkpointed segments is accumulated, and its data-parallel hook fires, "
                   "once per nested backward",
                   "collective-ledger", "dp>1 with a parameter read by two checkpointed segments (tie=blocks)",
                   "dp=2 tie=blocks", &ReentrantVariant::nested_backward);
}

ImplEntry grads_by_hand() {
  return reentrant("grads-by-hand",
                   "a reentrant checkpoint that adds its parameters' gradients to .grad by hand instead of returning "
                   "them: their accumulators never run, so a data-parallel reducer never averages them",
                   "parallel-consistency", "dp>1 with a checkpointed segment whose parameters train", "dp=2",
                   &ReentrantVariant::params_by_hand);
}

}  // namespace ckv::faults
