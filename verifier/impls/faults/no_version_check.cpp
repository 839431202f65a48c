// verifier/impls/faults/no_version_check.cpp: skips the in-place check, so an input modified between
// forward and backward is silently recomputed from its new value: wrong gradients, no error.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct NoVersionCheckFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  void check_unchanged() const override {}
};
}  // namespace
ImplEntry no_version_check() {
  return {{"no-version-check", "recomputes from an input modified in place instead of refusing", "refuses-inplace",
           "inplace=true"},
          [] { return std::make_unique<FrameImpl<NoVersionCheckFrame>>(); }};
}
}  // namespace ckv::faults
