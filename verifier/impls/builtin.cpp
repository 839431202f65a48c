// verifier/impls/builtin.cpp: ckverify's checkpoint library (verifier/checkpoint/) behind the
// implementation interface: the first implementation the gate verifies.
#include "verifier/impls/faults/frame_impl.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv {

std::unique_ptr<CheckpointImpl> make_builtin(CheckpointOptions options) {
  return std::make_unique<faults::FrameImpl<checkpoint_detail::RecomputeFrame>>(options);
}

}  // namespace ckv
