// properties/property.hpp: the property registry (DESIGN.md: "a new check is a new entry in one
// property registry"). A property is a name, a one-line statement of when it holds, and a judge: a pure
// function from the run stage's Observations (verifier/run/run.hpp) to a Finding. Everything that lists
// properties (check, faults, list, the help, the reports, each fault's "killed by") reads properties().
// The order is the report order, causes first: a recompute that drew another mask or ran under another
// autocast state also breaks every gradient after it, so the site is named before the consequence.
#pragma once

#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "verifier/impls/interface.hpp"
#include "verifier/run/run.hpp"

namespace ckv {

struct Finding {
  std::string property;
  bool held = true;
  bool applicable = true;  // false: the property does not apply to this Case (never counted as held)
  std::string where;       // failure: the first diverging tensor, site or segment
  std::string detail;      // failure: the one-line diagnosis; held: a summary; not applicable: the reason
  int step = -1;
  std::string trace;  // failure: the implementation's traceback behind it (a Python exception), or empty

  static Finding pass(const std::string& property, std::string summary);
  static Finding fail(const std::string& property, int step, std::string where, std::string detail);
  static Finding not_applicable(const std::string& property, std::string reason);
  bool failed() const { return applicable && !held; }
};

struct Property {
  std::string name;
  std::string holds_when;  // one line, as `ckverify list` prints it
  std::function<Finding(const Observations&)> judge;
};

const std::vector<Property>& properties();
const Property* find_property(const std::string& name);
std::vector<std::string> property_names();

// Every property on one set of observations, in registry order.
std::vector<Finding> judge_all(const Observations& o);
// The gate for one Case: observe (run stage), then judge_all. Throws EnvironmentError (the Case cannot
// run here) and std::runtime_error (the baseline failed: a ckverify bug).
std::vector<Finding> check_case(const Case& c, CheckpointImpl& impl);

// Causes first: the property that should head a finding shrunk for `shrunk_for` whose Case failed
// `findings` (in registry order): recompute-count where it failed (a segment run the wrong number of times
// or with other arguments explains every other symptom), else the first failed property before it, each
// only when not in `set_aside` (skipped, or a finding already), else `shrunk_for` itself.
std::string cause_first(const std::vector<Finding>& findings, const std::string& shrunk_for,
                        const std::set<std::string>& set_aside);

// Findings as one line of JSON (the answer of a worker or a rank) and back; findings_from_line throws
// on a malformed line (nlohmann::json's errors).
std::string findings_to_line(const std::vector<Finding>& fs);
std::vector<Finding> findings_from_line(const std::string& line);

// The gate for a Case with tp > 1 (docs/parallel.md): tp processes of `exe` (ckverify, whose hidden
// subcommand `rank` runs one rank), started and accounted for by dist::run_ranks in a temporary directory
// of their own; rank 0 judges the gathered observations. A rank that crashes, exits or hangs, and a run
// under test that failed on some ranks only (RankRunFailed: the first rank to fail), is a `completes`
// finding naming the rank; throws EnvironmentError where a rank reported one or was stopped from
// outside, and std::runtime_error (a ckverify bug) where a rank's own error came first.
// `ranks_deadline`: when the ranks are killed as hung.
std::vector<Finding> check_case_as_ranks(const Case& c, const std::string& exe,
                                         std::chrono::seconds ranks_deadline = std::chrono::seconds(900));
// The answer file rank `rank` writes in the ranks' directory `dir`.
std::string rank_answer_path(const std::string& dir, int rank);
// The file rank 0 keeps its baseline's progress in (set_baseline_progress, run.hpp), one JSON line
// {"done", "of", "s"}; check_case_as_ranks passes it on to this process's own baseline progress.
std::string rank_progress_path(const std::string& dir);

// The properties, one per file (registered in registry.cpp).
Property rng_replay_property();
Property autocast_replay_property();
Property recompute_count_property();
Property completes_property();
Property refuses_inplace_property();
Property exception_safe_property();
Property side_effect_once_property();
Property resume_property();
Property memory_saved_property();
Property grad_baseline_property();
Property grad_reference_property();
Property parallel_consistency_property();
Property collective_ledger_property();

}  // namespace ckv
