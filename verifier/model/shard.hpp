// verifier/model/shard.hpp: the model under test split across tensor-parallel ranks, Megatron-style.
// Each rank holds heads/tp of the attention heads (q, k, v column-parallel: a slice of their output
// rows; the output projection row-parallel: the same slice of its input columns) and d_ff/tp of the
// FFN's hidden units (fc1 and gate column-parallel, fc2 row-parallel). Norms, BatchNorm, the head and
// the biases of the row-parallel projections (added once, after the reduction) are replicated.
//
// A tensor-parallel region starts where a replicated activation enters the column-parallel layers
// (dist::enter_parallel: identity forward, all-reduce of the gradient) and ends after the row-parallel
// one (dist::leave_parallel: all-reduce forward, identity backward). Dropout inside a region
// (attn_probs, ffn_hidden: each rank drops its own shard of the activation) draws from the tracker's
// kModelParallelStream, seeded per tensor-parallel rank; dropout outside (attn_out, ffn_out) and the
// noise and jitter draw from the default generator, which the ranks seed equally.
//
// The dropout masks and ReLU sides a rank records are its shard's; gathered along their split
// dimension over the ranks, they are what the unsharded model drew (the reference is fed them).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "reference/params.hpp"
#include "verifier/case/case.hpp"  // tp_error
#include "verifier/model/site_tap.hpp"

namespace ckv {
namespace dist {
class Group;
class RngTracker;
struct ParallelRegion;
}  // namespace dist

// The tracker stream dropout inside a tensor-parallel region draws from.
inline constexpr const char* kModelParallelStream = "model-parallel";

// Which of `size` tensor-parallel ranks a model is. size 1 is the unsharded model (nothing else set).
struct TensorShard {
  int rank = 0, size = 1;
  std::shared_ptr<dist::ParallelRegion> region;  // the tensor-parallel group and its ledger
  dist::RngTracker* tracker = nullptr;           // holds kModelParallelStream; outlives the model
  // Selective: inside a checkpoint, each region's forward all-reduce output is kept and the recompute
  // reuses it (dist::leave_parallel's keep_in_checkpoint): only local ops are recomputed.
  bool keep_reduced = false;
  // A fault (ParallelFault::replicated_from_stream): dropout outside the regions draws from the
  // model-parallel stream too, so the ranks drop different units of one replicated activation.
  bool replicated_from_stream = false;
  bool sharded() const { return size > 1; }
};

// The dimension of a layout parameter that tensor parallelism splits: 0 (rows: a column-parallel
// layer's outputs), 1 (columns: a row-parallel layer's inputs), or -1 (replicated).
int shard_dim(const std::string& param_name);
// The dimension of a dropout site's tensor split across tensor-parallel ranks, or -1 (replicated).
int site_shard_dim(DropoutSite s);
// Rank `rank`'s slice of the full parameters `full` (replicated ones whole), names and order kept.
ParamSet shard_params(const ParamSet& full, int rank, int size);

// The records of every tensor-parallel rank joined along their split dimension, in call order: the
// unsharded model's masks and ReLU sides. Every rank of `tp` calls these with its own records of the
// same sequence of calls (the same program); replicated sites come back as this rank's. In place, in
// one exchange.
void gather_calls(const dist::Group& tp, std::vector<SiteCall>& sites, std::vector<ReluCall>& relu);

// Parallel consistency of one tensor-parallel group after a run, from each rank's own records (every
// rank of `tp` calls it; the lines come back the same on every rank, empty when it holds):
//   - the first-forward masks of a site inside a region differ between every two ranks (each rank's
//     stream is its own; judged only where two independent masks would agree with probability under
//     1e-9, over the positions both ranks know);
//   - the masks of a site outside the regions are equal on every rank (one default stream);
//   - the replicated parameters and their gradients are bit-identical on every rank.
class TransformerImpl;
std::vector<std::string> parallel_consistency(const dist::Group& tp, const std::vector<SiteCall>& calls,
                                              const std::array<double, kNumDropoutSites>& p,
                                              const TransformerImpl& model);
// The consistency of one shard's data-parallel replicas after a run (every rank of `dp` calls it; the
// lines come back the same on every rank of it, empty when it holds): every parameter, and its gradient,
// bit-identical on every replica (the reducer averaged the gradients, the optimizer updated alike).
std::vector<std::string> replica_consistency(const dist::Group& dp, const TransformerImpl& model);

}  // namespace ckv
