// verifier/run/parallel.hpp: a Case with tp or dp > 1 as the run stage sees it on one of its ranks
// (docs/parallel.md). World rank r is tensor-parallel rank r % tp of data-parallel replica r / tp. Every
// rank runs observe() on its own shard and its replica's micro-batches, in the same order; each training
// run gets process groups of its own (a run that failed on one rank cannot leave another run's
// collectives out of step), and the ranks agree over the world group at fixed points: after each step of
// the run under test, after each run, before every decision the records drive. The records are then
// gathered so that every rank holds what the unsharded model, running every micro-batch of the step in
// one process, would have recorded (gradients, parameters and masks joined along their split dimension
// over the tensor-parallel ranks; the replicas' micro-batches side by side): every property applies
// unchanged, and rank 0 judges.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/params.hpp"
#include "verifier/case/case.hpp"
#include "verifier/dist/group.hpp"

namespace ckv {

struct RunRecord;

// The process groups of one training run: its tensor-parallel group (the ranks of its replica) and its
// data-parallel group (its shard's replicas); null where the degree is 1.
struct RunGroups {
  std::shared_ptr<dist::Group> tp, dp;
};

// Thrown by observe on a rank whose run under test failed where the ranks could not agree on it: a peer
// was gone or waited in another collective, so the run failed on some ranks only and nothing can be
// judged together. `at`: when this rank's run failed (steady_clock seconds, one clock for every process
// of the machine), so that the first rank to fail is told from the ranks that failed for want of it.
class RankRunFailed : public std::runtime_error {
 public:
  RankRunFailed(const std::string& what, double at) : std::runtime_error(what), at(at) {}
  double at;
};
// Now, in RankRunFailed::at's seconds.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class ParallelRun {
 public:
  ParallelRun(std::shared_ptr<dist::Group> world, const Case& c);
  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int tp_rank() const { return rank() % tp_; }
  int dp_rank() const { return rank() / tp_; }
  const dist::Group& world() const { return *world_; }
  // The ranks of this rank's replica (tp > 1), for what the tensor-parallel ranks compare; null at tp=1.
  const dist::Group* tp_group() const { return tp_group_.get(); }
  // The replicas of this rank's shard (dp > 1), for what the replicas compare; null at dp=1.
  const dist::Group* dp_group() const { return dp_group_.get(); }
  // Fresh groups for one training run (every rank calls it in the same order).
  RunGroups run_groups() const;
  // The seed of this rank's model-parallel stream (its own per tensor-parallel rank, equal across replicas).
  uint64_t stream_seed() const { return stream_seed_; }
  // The micro-batches of each step this rank runs: [first_micro(), first_micro() + micro_count()).
  int micro_count() const { return micro_count_; }
  int first_micro() const { return dp_rank() * micro_count_; }

  // Agreement over the world group (every rank calls each in the same order). `wait`: how long this rank
  // waits for the others before it throws, if not the group's timeout.
  bool all(bool mine, std::optional<std::chrono::milliseconds> wait = std::nullopt) const;
  bool any(bool mine) const { return !all(!mine); }
  double max(double mine) const;
  // Every rank's string, in rank order.
  std::vector<std::string> strings(const std::string& mine) const;
  // Every rank's vector, in rank order (the sizes may differ).
  std::vector<std::vector<double>> vectors(const std::vector<double>& mine) const;
  // Every rank's list of vectors (as long as this rank's), in rank order, in one exchange.
  std::vector<std::vector<std::vector<double>>> vectors_many(const std::vector<std::vector<double>>& mine) const;
  // Rank 0's vector, on every rank.
  std::vector<double> rank0(const std::vector<double>& mine) const { return vectors(mine).at(0); }

  // Whether the tensor-parallel ranks of every replica recorded the same sequence of dropout and ReLU
  // calls at the same shapes (the same program): what gathering the masks, and comparing them across
  // ranks, needs.
  bool same_calls(const RunRecord& r) const;
  // The record of a run as the unsharded model, running every micro-batch of the step, would have kept
  // it, on every rank alike: completed only where it completed on every rank (else the error of the
  // lowest failing rank, named); the steps every rank completed, their gradients, parameters and
  // optimizer moments gathered (replica 0's); per micro-batch the losses and x.grad of the replica that
  // ran it; hook calls, counters and cache counts summed over the replicas, the log's lines in step and
  // micro-batch order; the masks and ReLU sides gathered over the tensor-parallel ranks where every rank
  // completed (else this rank's shard), and with the noise, jitter and segment calls, every replica's.
  // Memory, times and generator positions stay this rank's. Returns whether the masks were gathered
  // (every rank completed and recorded the same sequence of calls at the same shapes).
  bool gather(RunRecord& r) const;

 private:
  // A parameter set's numbers, item after item.
  static std::vector<double> flat(const ParamSet& shard);
  // The unsharded parameters from every rank's numbers of `shard` (`ranks`, flat, in rank order): from the
  // tensor-parallel ranks of replica 0 (model/shard.hpp, shard_dim; optimizer moments "exp_avg.NAME" split
  // as NAME), split ones joined along their dimension, replicated ones rank 0's. (The replicas hold the
  // same values: parallel-consistency judges that.)
  ParamSet join_shards(const ParamSet& shard, std::vector<std::vector<double>> ranks) const;
  std::shared_ptr<dist::Group> world_;
  int tp_ = 1, dp_ = 1, micro_count_ = 1;
  std::shared_ptr<dist::Group> tp_group_, dp_group_;
  uint64_t stream_seed_;
  mutable int runs_ = 0;
};

}  // namespace ckv
