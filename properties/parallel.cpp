// properties/parallel.cpp: the properties of a Case that runs as ranks (tp or dp > 1, docs/parallel.md);
// not applicable at tp=dp=1. Every other property judges such a Case on the gathered
// records, as the unsharded model's; these two judge what only the ranks' own records show.
//   parallel-consistency: the masks of dropout inside a tensor-parallel region differ between every two
//     ranks (each draws its own model-parallel stream), the masks of replicated dropout, the replicated
//     parameters and their gradients are equal on every rank (model/shard.hpp, parallel_consistency);
//     every parameter and its gradient are equal on every data-parallel replica (replica_consistency).
//   collective-ledger: a recompute may repeat forward collectives (or avoid them), and the run under test
//     never issues a backward collective more often than the baseline does (dist/collectives.hpp): the
//     data-parallel reducer's hook of a parameter fires once per backward, as without checkpointing.
#include <fmt/format.h>

#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kConsistency = "parallel-consistency";
const char* kLedger = "collective-ledger";

std::string first_and_count(const std::vector<std::string>& lines) {
  if (lines.size() == 1) return lines[0];
  return fmt::format("{} (and {} more)", lines[0], lines.size() - 1);
}

Finding judge_consistency(const Observations& o) {
  const ParallelRecord& p = o.parallel;
  if (!p.ran) return Finding::not_applicable(kConsistency, "tp=dp=1: one process, no ranks to compare");
  if (!p.judged) return Finding::not_applicable(kConsistency, p.why_not);
  if (p.consistency.empty())
    return Finding::pass(kConsistency, fmt::format("{} ranks: model-parallel masks differ, replicated masks, "
                                                   "parameters and gradients equal",
                                                   p.ranks));
  const std::string& first = p.consistency[0];
  return Finding::fail(kConsistency, -1, first.substr(0, first.find(':')),
                       "the ranks' random streams or replicas disagree: " + first_and_count(p.consistency));
}

Finding judge_ledger(const Observations& o) {
  const ParallelRecord& p = o.parallel;
  if (!p.ran) return Finding::not_applicable(kLedger, "tp=dp=1: no collectives");
  if (!p.ledger_judged) return Finding::not_applicable(kLedger, "the run under test did not complete on every rank");
  if (p.ledger.empty())
    return Finding::pass(kLedger, fmt::format("rank 0 issued {} forward, {} recompute and {} backward collective(s); "
                                              "no backward collective more often than without checkpointing",
                                              p.forward, p.recompute, p.backward));
  const std::string& first = p.ledger[0];
  // "rank 1: dp.layer0.attn.wq.weight: 4 backward all_reduce, 2 without checkpointing"
  const bool reducer = first.find(": dp.") != std::string::npos;
  return Finding::fail(kLedger, -1, first.substr(0, first.find(':', first.find(':') + 1)),
                       reducer ? "the data-parallel reducer's hook on a parameter's gradient accumulator fired more "
                                 "often than once per backward (a checkpoint whose recompute runs a nested backward "
                                 "accumulates a shared parameter once per nested backward; DDP raises \"Expected to "
                                 "mark a variable ready only once\"): " +
                                     first_and_count(p.ledger)
                               : "a recompute issued backward collectives again: " + first_and_count(p.ledger));
}
}  // namespace

Property parallel_consistency_property() {
  return {kConsistency,
          "tp or dp > 1: model-parallel dropout masks differ between tensor-parallel ranks; replicated masks, "
          "parameters and gradients are equal on every rank, and every parameter and gradient on every "
          "data-parallel replica",
          judge_consistency};
}

Property collective_ledger_property() {
  return {kLedger,
          "tp or dp > 1: the run under test issues no backward collective more often than the non-checkpointed "
          "run (the data-parallel reducer fires once per parameter per backward)",
          judge_ledger};
}

}  // namespace ckv
