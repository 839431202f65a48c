// verifier/impls/faults/reentrant_no_autocast.cpp: the reentrant skeleton recomputing under backward's
// autocast state (autocast off) instead of the forward's: the segment's backward runs through an fp32
// graph while its forward ran in bf16 or fp16, so the gradients are not those of the forward that ran
// (torch's reentrant checkpoint before it saved the autocast state for the recompute). Nothing fails: the
// segment's outputs are fp32 either way. autocast-replay sees the recompute's state at every site;
// audit-amp sees the segment's parameter gradients drift by about their whole AMP error.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/reentrant.hpp"

namespace ckv::faults {
ImplEntry reentrant_no_autocast() {
  ReentrantVariant v;
  v.replay_autocast = false;
  return {{"reentrant-no-autocast", "reentrant, recomputing with autocast off: the backward of an AMP forward in fp32",
           "autocast-replay", "prec=bf16 or fp16"},
          [v] { return std::make_unique<ReentrantCheckpoint>(v); }};
}
}  // namespace ckv::faults
