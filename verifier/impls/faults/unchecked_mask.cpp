// verifier/impls/faults/unchecked_mask.cpp: checks for in-place changes only the inputs that require
// grad (and the tensors autograd saved), treating the others as constants: a bool mask, an index or a
// frozen input changed between forward and backward is recomputed from its new value. Plain autograd
// does not save the key mask (only logical_not's copy), so the gradients are those of no forward.
#include <fmt/format.h>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct UncheckedMaskFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void check_unchanged() const override {
    for (size_t k = 0; k < arg_versions_.size(); ++k) {
      if (!args_.at(arg_versions_[k].first).toTensor().requires_grad()) continue;
      if (arg_versions_[k].second.current_version() != arg_saved_versions_[k])
        throw CheckpointError(fmt::format("input {} was modified in place", arg_versions_[k].first));
    }
    for (const Saved& s : saved_)
      if (s.version.enabled() && s.version.current_version() != s.saved_version)
        throw CheckpointError(s.what() + " was modified in place");
  }
};
}  // namespace
ImplEntry unchecked_mask() {
  return {
      {"unchecked-mask", "checks only inputs that require grad for in-place changes: a mask edit is recomputed from",
       "refuses-inplace", "inplace=true inplace_on=mask"},
      [] { return std::make_unique<FrameImpl<UncheckedMaskFrame>>(); }};
}
}  // namespace ckv::faults
