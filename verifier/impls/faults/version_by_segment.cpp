// verifier/impls/faults/version_by_segment.cpp: keeps the in-place check's record per segment (a member
// of the wrapped module, overwritten by every forward) instead of per call. When a later micro-batch's
// forward of the same segment runs before an earlier one's backward (micro-batches forwarded first,
// pipelines), the earlier call is checked against the later call's tensors: an input of the earlier call
// modified in place is recomputed from silently.
#include <map>

#include <fmt/format.h>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
using Versions = std::vector<std::pair<c10::VariableVersion, uint32_t>>;  // (counter, value at the forward)

class VersionBySegmentImpl : public CheckpointImpl {
  struct Frame : checkpoint_detail::RecomputeFrame {
    Frame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions o, std::map<int, Versions>* latest,
          int segment)
        : RecomputeFrame(std::move(fn), std::move(args), o), latest_(latest), segment_(segment) {}
    // After the forward: this call's counters become the segment's.
    void publish() {
      Versions v;
      for (size_t k = 0; k < arg_versions_.size(); ++k) v.emplace_back(arg_versions_[k].second, arg_saved_versions_[k]);
      for (const Saved& s : saved_)
        if (s.version.enabled()) v.emplace_back(s.version, s.saved_version);
      (*latest_)[segment_] = std::move(v);
    }
    void check_unchanged() const override {
      for (const auto& [counter, at_forward] : latest_->at(segment_))
        if (counter.current_version() != at_forward)
          throw CheckpointError(fmt::format("segment {}: a tensor was modified in place", segment_));
    }
    std::map<int, Versions>* latest_;
    int segment_;
  };

 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    if (!torch::GradMode::is_enabled()) return call.fn(call.args);
    auto frame = std::make_shared<Frame>(call.fn, call.args, full_recompute(), &latest_, call.segment);
    std::vector<torch::Tensor> out = frame->run_forward();
    frame->publish();
    return out;
  }

 private:
  std::map<int, Versions> latest_;  // segment -> the version counters of its latest forward
};
}  // namespace
ImplEntry version_by_segment() {
  return {{"version-by-segment", "checks the segment's latest call for in-place changes, not the call it recomputes",
           "refuses-inplace", "inplace=true with sched=ffbb, an earlier micro-batch edited"},
          [] { return std::make_unique<VersionBySegmentImpl>(); }};
}
}  // namespace ckv::faults
