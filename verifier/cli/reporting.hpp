// verifier/cli/reporting.hpp: the properties' Findings as the report holds them (reports/report.hpp),
// and the report's way out (the console first, then the files asked for). `check`, `repro` and `merge`
// report through these; `bench` names a failing plan's finding the same way.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "properties/property.hpp"
#include "reports/report.hpp"
#include "verifier/case/case.hpp"
#include "verifier/cli/output.hpp"

namespace ckv::cli {

// The failed Finding of `property` among fs, or null.
const Finding* failed_finding(const std::vector<Finding>& fs, const std::string& property);

// A property's result as failed by f: where and what.
void set_failed(report::PropertyResult& p, const Finding& f);

// A property's result over one Case (repro): f held, failed or did not apply; a `skipped` property
// (--skip) is never held or failed, and counts the failure it would have had.
report::PropertyResult one_case_result(const Finding& f, bool skipped);

// Case c's failure as the report holds it: `head` (one of fs) is its headline, every other failed
// Finding of fs is listed as also failing, except the `skipped` properties'.
report::Failure make_failure(const Case& c, const std::vector<Finding>& fs, const Finding& head,
                             const std::string& repro, const std::set<std::string>& skipped = {});

// The report files of check, repro and merge (empty for the ones not asked for).
struct Outputs {
  FileArg json, junit, markdown;
  std::vector<std::pair<std::string, FileArg>> paths() const {
    return {{"--json", json}, {"--junit", junit}, {"--markdown", markdown}};
  }
};

// Prints the report on the console, then writes the files asked for; returns the report's exit code.
// The console comes first: a file that cannot be written must not lose the diagnosis. Throws
// UsageError naming each file that could not be written.
int emit(report::Report& r, const Outputs& out);

}  // namespace ckv::cli
