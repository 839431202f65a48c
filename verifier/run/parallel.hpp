// verifier/run/parallel.hpp: a Case with tp > 1 as the run stage sees it on one of its ranks
// (docs/parallel.md). Every rank runs observe() on its own shard in the same order; each training run
// gets a process group of its own (a run that failed on one rank cannot leave another run's collectives
// out of step), and the ranks agree over the world group at fixed points: after each step of the run
// under test, after each run, before every decision the records drive. The records are then gathered
// so that every rank holds what the unsharded model would have recorded (gradients, parameters and
// masks joined along their split dimension; what is replicated, rank 0's): every property applies
// unchanged, and rank 0 judges.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "reference/params.hpp"
#include "verifier/case/case.hpp"
#include "verifier/dist/group.hpp"

namespace ckv {

struct RunRecord;

// Rank `rank` of a Case's tensor-parallel ranks. The world is the tensor-parallel group (tp == world).
class ParallelRun {
 public:
  ParallelRun(std::shared_ptr<dist::Group> world, const Case& c);
  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  const dist::Group& world() const { return *world_; }
  // A fresh group of every rank for one training run (every rank calls it in the same order).
  std::shared_ptr<dist::Group> run_group() const;
  // The seed of this rank's model-parallel stream (its own per tensor-parallel rank).
  uint64_t stream_seed() const { return stream_seed_; }

  // Agreement over the world group (every rank calls each in the same order).
  bool all(bool mine) const;
  bool any(bool mine) const { return !all(!mine); }
  double max(double mine) const;
  // Every rank's string, in rank order.
  std::vector<std::string> strings(const std::string& mine) const;
  // Every rank's vector, in rank order (the sizes may differ).
  std::vector<std::vector<double>> vectors(const std::vector<double>& mine) const;
  // Rank 0's vector, on every rank.
  std::vector<double> rank0(const std::vector<double>& mine) const { return vectors(mine).at(0); }

  // The unsharded parameters from every rank's shard (model/shard.hpp, shard_dim; optimizer moments
  // "exp_avg.NAME" split as NAME): split ones joined along their dimension, replicated ones rank 0's.
  ParamSet gather(const ParamSet& shard) const;
  // Whether every rank recorded the same sequence of dropout and ReLU calls at the same shapes (the same
  // program): what gathering the masks, and comparing them across ranks, needs.
  bool same_calls(const RunRecord& r) const;
  // The record of a run as the unsharded model would have kept it, on every rank alike: completed only
  // where it completed on every rank (else the error of the lowest failing rank, named); the steps every
  // rank completed, their gradients, parameters and optimizer moments gathered, the losses, x.grad, hook
  // counts and ledger rank 0's; the masks and ReLU sides gathered where every rank completed (else this
  // rank's shard); segment calls rank 0's. Memory and times stay this rank's. Returns whether the masks
  // were gathered (every rank completed and recorded the same sequence of calls at the same shapes).
  bool gather(RunRecord& r) const;

 private:
  std::shared_ptr<dist::Group> world_;
  uint64_t stream_seed_;
  mutable int runs_ = 0;
};

}  // namespace ckv
