// verifier/cli/search.hpp: the gate's search over generated Cases, shared by `check` and `faults`.
// Case i of a run is a pure function of (seed, i): generated from its own RapidCheck random stream, so a
// seed names the same cases whatever else changes. The first case on which a property fails locks that
// property (or the pinned one), and the case is shrunk greedily through RapidCheck's shrink tree,
// accepting only smaller Cases that fail the same property, so the shrunk Case reproduces the original
// diagnosis. The time budget bounds the whole search, shrinking included.
#pragma once

#include <cstdint>
#include <map>
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
  bool progress = false;
  int max_shrink_runs = 2000;
};

struct SearchResult {
  int ran = 0;  // cases judged before the search stopped (shrink runs not counted)
  bool budget_hit = false;
  double elapsed_s = 0.0;
  std::map<std::string, int> held, not_applicable;
  std::map<std::string, std::string> not_applicable_why;
  // A failure, when one was found:
  std::string property;
  int failing_index = -1;         // the generated case that failed first (0-based)
  Case failing_case;              // after shrinking
  std::vector<Finding> findings;  // of the shrunk Case
  int shrink_steps = 0, shrink_runs = 0;
  bool shrink_cut_short = false;
};

SearchResult search(const SearchOptions& o);

// Case i of seed `seed` (with its shrink tree), as search() generates it.
rc::Shrinkable<Case> generate(const rc::Gen<Case>& gen, uint64_t seed, int i);

// The gate on one Case against the implementation the Case names.
std::vector<Finding> run_checks(const Case& c);

}  // namespace ckv::cli
