// verifier/cli/search.hpp: the gate's search over generated Cases, shared by `check` and `faults`.
// Case i of a run is a pure function of (seed, i): generated from its own RapidCheck random stream, so a
// seed names the same cases whatever else changes. The first case on which a property fails locks that
// property (or the pinned one), and the case is shrunk through RapidCheck's shrink tree (one jump to
// the smallest Case it could reach, shrink_jump, then greedily field by field), accepting only smaller Cases that fail
// the same property, so the shrunk Case reproduces the original diagnosis. The time budget bounds the whole search,
// shrinking included. With jobs > 0 every Case runs in worker processes (workers.hpp), a batch at a time; results are
// taken in case order and shrink candidates in their order, so the verdict, the counts and the shrunk Case are the same
// for any number of workers. A shard (index k of n) runs the cases i with i % n == k, and keeps each case's outcome so
// that `ckverify merge` can rebuild the unsharded verdict.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "properties/generators.hpp"
#include "properties/property.hpp"

namespace ckv::cli {

struct SearchOptions {
  CaseGenOptions gen;
  int cases = 4000;
  uint64_t seed = 1;
  double budget_s = 180.0;
  std::string pinned;  // only this property's failure counts (faults); empty: any property
  // check --skip: properties set aside. They still run, but never fail the search or count as held;
  // a case on which one would have failed is counted (SearchResult::skipped_failed).
  std::set<std::string> skipped;
  bool progress = false;
  int max_shrink_runs = 2000;  // per finding
  // check --max-findings: after a failure, set its property aside and go on searching, until this many
  // properties have failed (each with its own shrunk Case) or the cases or the budget run out.
  int max_findings = 1;
  int jobs = 0;     // worker processes; 0 runs the implementation in this process (tests)
  int threads = 1;  // LibTorch intra-op threads per worker
  double case_timeout_s = 120.0;
  int shard_index = 0, shard_count = 1;
  // With workers: run each shrunk finding again in a fresh worker process, to tell a failure of the
  // Case from one that needs the state an implementation kept from earlier cases in its process
  // (FoundFailure::history). Not for ckverify's own implementations (the builtin and the faults make a
  // fresh implementation per Case); `faults` turns it off: a kill is a kill either way.
  bool confirm_fresh = true;
  // Called once the implementation has loaded (in the first worker; with jobs = 0, at once), before any
  // case runs: where check prints its header, so that a spec that cannot load gets only its one-line error.
  std::function<void()> started;
};

// One failing property found by the search, shrunk on its own.
struct FoundFailure {
  std::string property;
  int failing_index = -1;         // the generated case that failed it first (0-based)
  Case failing_case;              // after shrinking
  std::vector<Finding> findings;  // of the shrunk Case
  int shrink_steps = 0, shrink_runs = 0;
  bool shrink_cut_short = false;
  // When the failure did not come back in a fresh worker process: the Cases its worker had run
  // before it (replayed first by `repro --history`; empty when it came back without them), and a
  // note saying which it was. failing_case is then the Case first found, unshrunk.
  std::vector<Case> history;
  std::string history_note;
};

struct SearchResult {
  int ran = 0;  // cases judged before the search stopped (shrink runs not counted)
  bool budget_hit = false;
  double elapsed_s = 0.0;
  std::map<std::string, int> held, not_applicable;
  std::map<std::string, std::string> not_applicable_why;
  std::map<std::string, int> skipped_failed;  // skipped property -> cases on which it would have failed
  // A failure, when one was found:
  std::string property;
  int failing_index = -1;         // the generated case that failed first (0-based)
  Case failing_case;              // after shrinking
  std::vector<Finding> findings;  // of the shrunk Case
  int shrink_steps = 0, shrink_runs = 0;
  bool shrink_cut_short = false;
  std::vector<Case> history;  // as FoundFailure's
  std::string history_note;
  // The findings after the first (max_findings > 1), in the order found.
  std::vector<FoundFailure> further;
  // Per case run (index, one letter per property in property_names() order: H held, N not applicable,
  // F failed, - not reported; for a skipped property S, or X where it would have failed), for merging
  // shards.
  std::vector<std::pair<int, std::string>> outcomes;
};

// The outcome letters of one Case's findings (see SearchResult::outcomes).
std::string outcome_code(const std::vector<Finding>& fs, const std::set<std::string>& skipped = {});

SearchResult search(const SearchOptions& o);

// Case i of seed `seed` (with its shrink tree), as search() generates it.
rc::Shrinkable<Case> generate(const rc::Gen<Case>& gen, uint64_t seed, int i);

// A Case shrinking could reach from `s`, found without running anything: the first allowed shrink of
// each step taken until none is left. Jump::smallest allows every shrink that keeps the plan's kind (a
// Case that checkpoints nothing cannot show an implementation's failure): every field at the value its
// shrink tries first. Jump::sizes allows only those that change the sizes (layers, width, heads, FFN
// width, vocabulary, batch, sequence, steps, micro-batches) and keep every other field. Empty when `s`
// has no such shrink. search() runs both before the greedy walk (search.cpp).
enum class Jump { smallest, sizes };
std::optional<rc::Shrinkable<Case>> shrink_jump(const rc::Shrinkable<Case>& s, Jump jump);

// The gate on one Case against the implementation the Case names.
std::vector<Finding> run_checks(const Case& c);

}  // namespace ckv::cli
