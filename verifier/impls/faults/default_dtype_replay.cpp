// verifier/impls/faults/default_dtype_replay.cpp: re-enables autocast for the recompute but with the
// device type's default lower-precision dtype instead of the forward's (fairscale issue 1199: an fp16
// recompute inside a bf16 region). On CPU the default is bf16, so only an fp16 forward shows it.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
struct DefaultDtypeFrame : checkpoint_detail::RecomputeFrame {
  using RecomputeFrame::RecomputeFrame;
  compat::AutocastState recompute_autocast() const override {
    compat::AutocastState s = forward_autocast_;
    s.cpu_dtype = at::kBFloat16;
    s.cuda_dtype = at::kHalf;
    return s;
  }
};
}  // namespace
ImplEntry default_dtype_replay() {
  return {{"default-dtype-replay", "recomputes under autocast with the device's default dtype, not the forward's",
           "autocast-replay", "prec=fp16 on CPU (bf16 on CUDA)", false, false, true},
          [] { return std::make_unique<FrameImpl<DefaultDtypeFrame>>(); }};
}
}  // namespace ckv::faults
