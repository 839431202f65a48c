// verifier/cli/cmd_merge.cpp: see cmd_merge.hpp.
#include "verifier/cli/cmd_merge.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

#include "verifier/case/case.hpp"
#include "verifier/cli/args.hpp"
#include "verifier/cli/output.hpp"

namespace ckv::cli {

CLI::App* add_merge(CLI::App& app, MergeArgs& a) {
  CLI::App* merge = app.add_subcommand(
      "merge", "Combine the --json reports of the shards of one `check` run (--shard K/N) into one verdict.");
  merge->add_option("reports", a.inputs, "The shards' JSON reports")->required();
  add_file(merge, "--json", a.outputs.json, "Write the merged report as JSON to this file");
  add_file(merge, "--junit", a.outputs.junit, "Write the merged report as JUnit XML to this file");
  add_file(merge, "--markdown", a.outputs.markdown, "Write the merged report as Markdown to this file");
  return merge;
}

int run_merge(const MergeArgs& a) {
  const Outputs& out = a.outputs;
  std::vector<std::pair<std::string, std::string>> named;
  for (const auto& in : a.inputs) named.emplace_back("a report to merge", in);
  check_outputs(out.paths(), named);
  std::vector<report::Report> shards;
  for (const auto& in : a.inputs) {
    try {
      shards.push_back(report::from_json(read_regular_file(in, 256 << 20)));
    } catch (const std::invalid_argument& e) {
      throw UsageError(sanitize(in, 200) + ": " + e.what());
    }
    // Each failure's Case is one this ckverify reads, and its case line is that Case's (what the
    // merged report prints and a user replays).
    std::vector<const report::Failure*> failures;
    if (shards.back().failure) failures.push_back(&*shards.back().failure);
    for (const report::Failure& f : shards.back().further) failures.push_back(&f);
    for (const report::Failure* f : failures) {
      Case c;
      try {
        c = case_from_json(f->case_json);
      } catch (const std::exception& e) {
        throw UsageError(sanitize(in, 200) + ": the " + sanitize(f->property, 60) +
                         " failure's \"case\" is not a Case: " + sanitize(e.what(), 200));
      }
      if (to_line(c) != f->case_line)
        throw UsageError(sanitize(in, 200) + ": the " + sanitize(f->property, 60) +
                         " failure's \"case_line\" is not the line of its \"case\"");
    }
  }
  report::Report r;
  try {
    r = report::merge(shards);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("merge: ") + e.what());
  }
  r.command = "check";
  std::cout << "ckverify merge: " << shards.size() << " shard(s) of impl=" << r.impl << " plan=" << r.plan
            << " cases=" << r.cases_requested << " seed=" << r.seed << "\n";
  if (r.failure) std::cout << "\n";
  return emit(r, out);
}

}  // namespace ckv::cli
