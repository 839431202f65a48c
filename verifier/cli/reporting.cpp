// verifier/cli/reporting.cpp: see reporting.hpp.
#include "verifier/cli/reporting.hpp"

#include <torch/version.h>

#include <iostream>

#include "verifier/cli/output.hpp"
#include "verifier/cli/version.hpp"

namespace ckv::cli {

const Finding* failed_finding(const std::vector<Finding>& fs, const std::string& property) {
  const Finding* found = nullptr;
  for (const auto& f : fs)
    if (f.failed() && f.property == property) found = &f;
  return found;
}

void set_failed(report::PropertyResult& p, const Finding& f) {
  p.failed = true, p.where = f.where, p.detail = f.detail;
}

report::PropertyResult one_case_result(const Finding& f, bool skipped) {
  report::PropertyResult p;
  p.name = f.property;
  p.skipped = skipped;
  p.skipped_failures = p.skipped && f.failed() ? 1 : 0;
  p.held = f.held && f.applicable && !p.skipped ? 1 : 0;
  p.not_applicable = f.applicable || p.skipped ? 0 : 1;
  p.not_applicable_why = p.not_applicable ? f.detail : "";
  p.failed = f.failed() && !p.skipped;
  p.where = f.where;
  p.detail = f.detail;
  return p;
}

report::Failure make_failure(const Case& c, const std::vector<Finding>& fs, const Finding& head,
                             const std::string& repro, const std::set<std::string>& skipped) {
  report::Failure f;
  f.property = head.property;
  f.where = head.where;
  f.detail = head.detail;
  f.trace = head.trace;
  f.case_line = to_line(c);
  f.case_json = to_json(c);
  f.repro = repro;
  f.seed = c.seed;
  for (const auto& o : fs)
    if (o.failed() && o.property != head.property && !skipped.count(o.property))
      f.also.push_back({o.property, o.where, o.detail});
  return f;
}

int emit(report::Report& r, const Outputs& out) {
  // A merged report keeps its shards' versions (merge refuses shards whose versions differ).
  if (r.torch.empty()) r.torch = TORCH_VERSION;
  if (r.version.empty()) r.version = version();
  std::cout << report::to_console(r) << std::flush;
  std::string failed;
  for (const auto& [option, file] : out.paths()) {
    if (file.empty()) continue;
    const std::string text = option == "--json"    ? report::to_json(r)
                             : option == "--junit" ? report::to_junit_xml(r)
                                                   : report::to_markdown(r);
    try {
      write_atomically(file, text);
    } catch (const UsageError& e) {
      failed += std::string(failed.empty() ? "" : "; ") + e.what();
    }
  }
  if (!failed.empty()) throw UsageError(failed);
  return r.exit_code;
}

}  // namespace ckv::cli
