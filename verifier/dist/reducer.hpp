// verifier/dist/reducer.hpp: data parallelism as DDP does it. Every replica runs the whole model on
// its own data; a hook on each parameter's gradient accumulator (a post-hook of its AccumulateGrad node,
// where DDP hooks in) averages the accumulated gradient over the replicas as soon as the backward has
// accumulated it. After a backward the replicas hold the same gradient: the gradient of the mean of
// their losses. Averaging is linear and leaves replicated values alone, so reducing after every
// micro-batch's backward gives the same result as reducing after the last one only.
//
// The hook must fire once per parameter per backward. It fires once per accumulation: a reentrant
// checkpoint whose recompute runs a nested backward accumulates into a parameter once per nested
// backward, so a parameter read by two checkpointed segments (tied weights), or inside and outside one,
// is accumulated and reduced twice: DDP raises "Expected to mark a variable ready only once"; a reducer
// that does not check averages a partial gradient and adds the rest unreduced. fires() counts, per
// backward, how often each parameter's hook fired; the reductions go to the ledger as backward
// collectives ("dp.<parameter name>", or its index where no names are given). A replica whose accumulator ran without a
// gradient joins the reduction with zeros. A backward with create_graph through the reducer is refused.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "verifier/dist/collectives.hpp"

namespace ckv::dist {

class GradReducer {
 public:
  // Hooks every parameter of `params` that requires grad. `replicas`: the data-parallel group.
  GradReducer(std::shared_ptr<Group> replicas, std::vector<torch::Tensor> params,
              std::shared_ptr<CollectiveLedger> ledger = nullptr, std::vector<std::string> names = {});
  // The hooks stay on the accumulators (autograd cannot remove them) but do nothing from then on.
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Starts counting a backward's fires from zero. Throws std::logic_error when a parameter no longer has
  // the accumulator the hook is on (set_data to another dtype or device replaces it).
  void begin_backward();
  // Per parameter (the constructor's order), how often its hook fired since begin_backward(): 0 for a
  // parameter that got no gradient (or does not require grad), 1 as it should be.
  std::vector<int> fires() const;

  struct State;  // shared with the hooks

 private:
  std::shared_ptr<State> state_;
  // (parameter index, its accumulator), kept alive: the hooks live on them.
  std::vector<std::pair<size_t, std::shared_ptr<torch::autograd::Node>>> accumulators_;
};

}  // namespace ckv::dist
