// verifier/dist/collectives.hpp: the collectives of a tensor-parallel region as autograd functions
// (Megatron-style), and the ledger that counts every collective they issue.
//
// enter_parallel(x): identity forward, all-reduce of the gradient in backward (where a replicated
//   activation enters column-parallel layers: each rank's gradient of x is a partial sum).
// leave_parallel(y): all-reduce forward (the row-parallel partial sums become the full output),
//   identity backward.
//
// The ledger records each collective with its pass: `forward` when issued outside any backward call,
// `recompute` when a forward collective is issued inside one (a checkpoint's recompute repeating it),
// `backward` when issued by a backward function. The rule a checkpoint must keep: a recompute may repeat
// forward collectives (or avoid them, by saving their results), and never issues a backward collective
// more often than the run without checkpointing does.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "verifier/dist/group.hpp"

namespace ckv::dist {

enum class Pass { forward, recompute, backward };
enum class Collective { all_reduce };
const char* to_string(Pass p);
const char* to_string(Collective c);

struct CollectiveRecord {
  Collective kind = Collective::all_reduce;
  Pass pass = Pass::forward;
  int64_t bytes = 0;
  std::string where;     // the caller's label (the region: "layer1.attn.out")
  double seconds = 0.0;  // wall time inside the collective on this rank
};

class CollectiveLedger {
 public:
  void add(CollectiveRecord r);
  std::vector<CollectiveRecord> records() const;
  int count(Pass pass) const;
  int64_t bytes(Pass pass) const;

 private:
  mutable std::mutex mu_;
  std::vector<CollectiveRecord> records_;
};

// Sums t over `group`'s ranks into a new tensor (t is left alone) and records it in `ledger` (may be
// null) with its pass, label, bytes and the time spent inside the collective.
torch::Tensor all_reduce_recorded(const Group& group, const torch::Tensor& t, CollectiveLedger* ledger, Pass pass,
                                  const std::string& where);

// The ledger rule, for one rank: `test` (a run under a checkpoint) against `plain` (the same run
// without). A recompute may repeat forward collectives (Pass::recompute) or save their results; it must
// never issue a backward collective more often than the plain run does. One line per label whose
// backward collectives outnumber the plain run's ("dp.3: 4 backward all_reduce, 2 without
// checkpointing"); empty when the rule holds. A label the plain run issued none for is a gradient path
// it does not have (an input made to require grad: more communication, no repeat) and is not counted.
std::vector<std::string> ledger_violations(const std::vector<CollectiveRecord>& plain,
                                           const std::vector<CollectiveRecord>& test);

// A tensor-parallel region's group and the ledger its collectives go to. The backward functions of the
// graphs built with it hold it (shared ownership), so it outlives them.
struct ParallelRegion {
  std::shared_ptr<Group> group;
  std::shared_ptr<CollectiveLedger> ledger;  // may be null: nothing recorded
};

torch::Tensor enter_parallel(const torch::Tensor& x, const std::shared_ptr<ParallelRegion>& region,
                             const std::string& where);
// keep_in_checkpoint: inside a checkpointed call that keeps the recompute contract (segment_scope.hpp),
// the forward keeps the all-reduce's output in the call's SegmentState and the recompute reuses it
// instead of communicating again: a checkpoint then recomputes only the rank's local ops (the selective
// plan that saves the communicated result), for the memory of the kept outputs. The kept output is found
// by `where`: a call that leaves a region of the same label twice is refused (std::logic_error).
torch::Tensor leave_parallel(const torch::Tensor& y, const std::shared_ptr<ParallelRegion>& region,
                             const std::string& where, bool keep_in_checkpoint = false);

}  // namespace ckv::dist
