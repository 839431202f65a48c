// verifier/impls/faults/nograd_forward_cache.cpp: the reentrant skeleton with autocast's cast cache left
// on in its no-grad forward (as torch.utils.checkpoint(use_reentrant=True) leaves it): the bf16 cast of a
// weight that a matmul takes directly is cached without a graph (LibTorch >= 2.0: 1.13 does not autocast
// matmul on CPU), and a later use of the same weight
// outside the segment, in the same autocast region, reuses it and gets no gradient (a tied
// embedding/head: tie=head puts the input projection in the first segment and the head outside).
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/reentrant.hpp"

namespace ckv::faults {
ImplEntry nograd_forward_cache() {
  ReentrantVariant v;
  v.guard_cast_cache = false;
  return {{"nograd-forward-cache",
           "reentrant, with autocast's cast cache on in its no-grad forward: shared weights lose gradients",
           "grad-baseline", "tie=head with prec=bf16 or fp16, the first segment checkpointed", false, true},
          [v] { return std::make_unique<ReentrantCheckpoint>(v); }};
}
}  // namespace ckv::faults
