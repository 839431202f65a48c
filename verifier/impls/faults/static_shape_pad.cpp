// verifier/impls/faults/static_shape_pad.cpp: keeps one static input shape per segment, the longest
// sequence the segment has seen, as checkpoints that need fixed shapes do (CUDA-graph capture, buffers
// preallocated once for the checkpointed inputs): a shorter call is zero-padded to that length along the
// sequence dimension, checkpointed on the padded tensors, and its outputs are sliced back. Forward and
// recompute agree with each other, and while every call has the same shape it is the builtin. When the
// shape changes across micro-batches, whatever mixes positions sees the padding: attention over every
// key, BatchNorm's statistics, the aux loss's mean. (A bool mask is padded with false, so masked
// attention alone would not show it.)
#include <algorithm>
#include <map>

#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {
namespace {
// [B, S, ...] tensors padded along dim 1 from `from` to `to` positions (zeros; false for a bool mask).
torch::Tensor pad_positions(const torch::Tensor& t, int64_t from, int64_t to) {
  if (t.dim() < 2 || t.size(1) != from || to == from) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[1] = to - from;
  return torch::cat({t, torch::zeros(shape, t.options())}, 1);
}

class StaticShapePadImpl : public CheckpointImpl {
 public:
  // A run starts afresh (a worker runs many Cases with one implementation: shapes of an earlier Case
  // must not pad this one's).
  void begin_step(int step) override {
    if (step == 0) longest_.clear();
  }
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    if (call.args.empty() || !call.args[0].isTensor() || call.args[0].toTensor().dim() < 2) return builtin_->run(call);
    const int64_t length = call.args[0].toTensor().size(1);
    int64_t& longest = longest_[call.segment];
    longest = std::max(longest, length);
    if (longest == length) return builtin_->run(call);
    const int64_t padded = longest;
    std::vector<c10::IValue> args;
    for (const auto& a : call.args) args.emplace_back(a.isTensor() ? pad_positions(a.toTensor(), length, padded) : a);
    SegmentFunction fn = [inner = call.fn, length, padded](const std::vector<c10::IValue>& a) {
      std::vector<torch::Tensor> outs = inner(a);
      for (auto& o : outs)
        if (o.defined() && o.dim() >= 2 && o.size(1) == padded) o = o.narrow(1, 0, length);
      return outs;
    };
    return checkpoint(fn, std::move(args));
  }

 private:
  std::unique_ptr<CheckpointImpl> builtin_ = make_builtin();
  std::map<int, int64_t> longest_;
};
}  // namespace
ImplEntry static_shape_pad() {
  return {{"static-shape-pad",
           "pads every call to the longest sequence its segment has seen and slices the outputs back", "grad-baseline",
           "seqvar>0 (shapes vary across micro-batches) with bidirectional attention, fx=bn or segio=multi"},
          [] { return std::make_unique<StaticShapePadImpl>(); }};
}
}  // namespace ckv::faults
