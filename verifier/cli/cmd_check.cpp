// verifier/cli/cmd_check.cpp: see cmd_check.hpp.
#include "verifier/cli/cmd_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "verifier/cli/search.hpp"
#include "verifier/impls/loader.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv::cli {

CLI::App* add_check(CLI::App& app, CheckArgs& a) {
  CLI::App* check = app.add_subcommand("check", "Run the properties (" + property_list() +
                                                    ") over generated Cases; shrink any failure to a minimal Case.");
  check
      ->add_option("--impl", a.impl,
                   "Implementation under test: builtin, a fault name (see `ckverify list`), a C++ plugin "
                   "PATH.so[:key=value,...] or a Python function py:MODULE:CALLABLE[:key=value,...]")
      ->capture_default_str()
      ->each([&a](const std::string&) { a.impl_given = true; });
  check->add_option("--plan", a.plan,
                    std::string("Checkpoint plan for every case (") + kPlanSpellings + "); default: generated");
  check->add_option("--cases", a.cases, "Number of generated cases")->capture_default_str();
  check->add_option("--seed", a.seed_text, "Seed in [0, 2^64); the same seed generates the same cases")
      ->capture_default_str();
  check
      ->add_option("--time-budget", a.budget,
                   "Stop after this many seconds, shrinking included (the report says how many cases ran)")
      ->capture_default_str();
  add_file(check, "--json", a.outputs.json, "Write the report as JSON to this file");
  add_file(check, "--junit", a.outputs.junit, "Write the report as JUnit XML (one testcase per property) to this file");
  add_file(check, "--markdown", a.outputs.markdown, "Write the report as Markdown to this file");
  add_file(check, "--repro-file", a.repro_file, "Where the shrunk failing Case is written")->capture_default_str();
  check->add_option("--device", a.device, "Device for the LibTorch runs: cpu, cuda or cuda:N")->capture_default_str();
  check->add_option("--strategy", a.strategy,
                    "Gate checkpointing strategy code instead of a checkpoint function: py:MODULE:FUNC[:key=value,...] "
                    "called as FUNC(blocks, x, **options) with the Case's blocks as an nn.ModuleList (it decides which "
                    "blocks to checkpoint, with any checkpoint function), or a plugin PATH.so whose implementation "
                    "is a strategy; every property judges the effective plan it produced");
  check
      ->add_option("--skip", a.skip,
                   "PROPERTY: set a property aside (repeatable or a comma list; needs --reason). It still runs but "
                   "never fails the run or counts as held; every report lists it as skipped, with the reason and "
                   "the cases on which it would have failed")
      ->allow_extra_args(false);
  check
      ->add_option("--max-findings", a.max_findings,
                   "After a failure, set its property aside and go on, until this many properties have failed, "
                   "each with its own shrunk Case and repro (the first written to --repro-file, each further one "
                   "beside it as FILE.PROPERTY.json); the exit code is 1 if any failed")
      ->capture_default_str();
  check->add_option("--min-cases", a.min_cases,
                    "Fewer cases than this judged before the time budget ends is a failed run (exit 1), not a pass on "
                    "whatever ran; with --shard K/N each shard needs its share (1/N) and merge judges the whole");
  check->add_option("--reason", a.reason, "Why the --skip properties are set aside (recorded in every report)");
  check->add_option("--only", a.only,
                    "KEY=VALUE: every generated case takes this Case field as given (repeatable; e.g. --only fx=none "
                    "to gate an implementation that does not follow the recompute contract of segment_scope.hpp)");
  check
      ->add_option("-j,--jobs", a.jobs,
                   "Worker processes running the implementation (the verdict is the same for any number); "
                   "default: the machine's cores")
      ->capture_default_str();
  check
      ->add_option("--case-timeout", a.case_timeout,
                   "Seconds one case may take in a worker before it counts as a hang (a completes failure)")
      ->capture_default_str();
  check->add_option("--shard", a.shard,
                    "K/N: run only the cases i with i % N == K-1 (N machines, disjoint cases); `ckverify merge` "
                    "combines their --json reports");
  return check;
}

void finish_check(CheckArgs& a) {
  a.seed = parse_seed(a.seed_text);
  a.gate = gate_options(a.jobs, a.case_timeout, a.shard);
  a.skipped = parse_skip(a.skip, a.reason);
  check_count("--max-findings", a.max_findings, 1, 100);
  check_count("--cases", a.cases, 1, kMaxSearchCases);
  if (a.min_cases < 0 || a.min_cases > a.cases)
    throw UsageError("--min-cases must be in [0, --cases " + std::to_string(a.cases) + "]");
  check_time_budget(a.budget);
  if (a.gate.shard_index >= a.cases)
    throw UsageError("--shard: shard " + std::to_string(a.gate.shard_index + 1) + " of --cases " +
                     std::to_string(a.cases) + " has no case");
}

int run_check(const CheckArgs& a) {
  std::string impl_name = a.impl;
  const std::string& plan_text = a.plan;
  const std::string& strategy = a.strategy;
  const std::string& device = a.device;
  const FileArg& repro_path = a.repro_file;
  const Outputs& out = a.outputs;
  const GateOptions& g = a.gate;
  const Skip& skip = a.skipped;
  const int cases = a.cases, min_cases = a.min_cases, max_findings = a.max_findings;
  const uint64_t seed = a.seed;
  const double budget = a.budget;
  SearchOptions o;
  o.max_findings = max_findings;
  o.skipped = skip.properties;
  if (!strategy.empty()) {
    if (a.impl_given) throw UsageError("--strategy and --impl are exclusive: a strategy chooses its checkpoint");
    if (!plan_text.empty())
      throw UsageError("--strategy and --plan are exclusive: the strategy decides what to checkpoint");
    impl_name = strategy_spec(strategy);
    o.gen.strategy = true;
  }
  o.gen.only = parse_only(a.only);
  for (const auto& w : a.only)
    if (!strategy.empty() && (w == "tie=head" || w == "segio=multi"))
      throw UsageError("--only " + sanitize(w) +
                       ": a strategy is gated on Cases whose blocks are whole units "
                       "(segio=single, tie=none or blocks)");
  o.gen.device = device;
  if (o.gen.strategy) o.gen.plan = Plan{PlanKind::every_block, 0};
  if (!plan_text.empty()) o.gen.plan = parse_plan("--plan", plan_text);
  // Unknown names fail here, as usage errors; a strategy's spec is named as the user gave it.
  auto check_spec = [&](const std::string& spec) {
    try {
      check_impl_spec(spec);
    } catch (const std::invalid_argument& e) {
      std::string m = e.what();
      const std::string as_impl = "--impl " + sanitize(spec, 200);
      if (!o.gen.strategy || m.rfind(as_impl, 0) != 0) throw;
      throw UsageError("--strategy " + sanitize(strategy, 200) + m.substr(as_impl.size()));
    }
  };
  check_spec(impl_name);
  // A plugin is named by its absolute path in every Case, so a repro file replays from any directory.
  impl_name = absolute_impl_spec(impl_name);
  check_spec(impl_name);
  o.gen.impl = impl_name;
  if (o.gen.strategy && !make_impl(impl_name)->is_strategy())
    throw UsageError("--strategy " + sanitize(strategy, 200) +
                     ": the plugin's implementation is not a strategy "
                     "(CheckpointImpl::is_strategy)");
  if (const std::string why = unobservable_here(impl_info(impl_name), device); !why.empty())
    throw EnvironmentError(why);
  std::vector<std::pair<std::string, FileArg>> paths = out.paths();
  paths.emplace_back("--repro-file", repro_path);
  if (!repro_path.empty()) {  // the files a finding may write beside it (finding() below)
    paths.emplace_back("the history file beside --repro-file", beside(repro_path, "history"));
    if (max_findings > 1)
      for (const auto& name : property_names()) {
        const FileArg further = beside(repro_path, name);
        paths.emplace_back("the repro file of a further " + name + " finding", further);
        paths.emplace_back("the history file of a further " + name + " finding", beside(further, "history"));
      }
  }
  check_outputs(paths);
  check_device(device);
  o.cases = cases;
  o.seed = seed;
  o.budget_s = budget;
  o.progress = true;
  g.apply(o);
  // Fixed fields that contradict each other fail on every generated Case: said before the run starts
  // (one line, exit 2), not after its header.
  if (!o.gen.only.empty()) (void)generate(gen_case(o.gen), seed, 0).value();

  // The header, once the implementation has loaded: a spec that cannot load gets only its error line.
  o.started = [&] {
    std::cout << "ckverify check: " << (o.gen.strategy ? "strategy=" + strategy : "impl=" + impl_name) << " plan="
              << (o.gen.strategy      ? "strategy's"
                  : plan_text.empty() ? "any"
                                      : plan_text)
              << (o.gen.only.empty() ? "" : " only=\"" + o.gen.only + "\"")
              << (skip.properties.empty() ? "" : " skip=" + fmt::format("{}", fmt::join(skip.properties, ",")))
              << " cases=" << cases << " seed=" << seed << " device=" << device
              << (g.shard_count > 1 ? fmt::format(" shard={}/{}", g.shard_index + 1, g.shard_count) : "")
              << " workers=" << g.jobs << std::endl;
  };
  const SearchResult s = search(o);

  report::Report r;
  r.command = "check";
  r.impl = impl_name;
  r.plan = o.gen.strategy ? "strategy" : plan_text.empty() ? "any" : plan_text;
  r.only = o.gen.only;
  r.skip_reason = skip.reason;
  r.min_cases = min_cases;
  r.max_findings = max_findings;
  r.device = device;
  r.seed = seed;
  r.cases_requested = cases;
  r.cases_run = s.ran;
  r.time_budget_s = budget;
  r.time_budget_hit = s.budget_hit;
  r.elapsed_s = s.elapsed_s;
  r.shard_index = g.shard_index, r.shard_count = g.shard_count;
  r.outcomes = s.outcomes;
  for (const auto& name : property_names()) {
    report::PropertyResult p;
    p.name = name;
    p.held = s.held.count(name) ? s.held.at(name) : 0;
    p.not_applicable = s.not_applicable.count(name) ? s.not_applicable.at(name) : 0;
    p.not_applicable_why = s.not_applicable_why.count(name) ? s.not_applicable_why.at(name) : "";
    p.skipped = skip.properties.count(name) > 0;
    p.skipped_failures = s.skipped_failed.count(name) ? s.skipped_failed.at(name) : 0;
    for (const auto& f : s.findings)
      if (f.property == name && f.failed() && !p.skipped) set_failed(p, f);
    r.properties.push_back(p);
  }
  if (!s.property.empty()) {
    std::string write_error;
    // A Python implementation's modules may come from PYTHONPATH: the repro command carries it, so it
    // replays from a fresh shell.
    std::string repro_env;
    if (const char* pp = std::getenv("PYTHONPATH"); pp && *pp && spec_kind(impl_name) == SpecKind::python)
      repro_env = "PYTHONPATH=" + shell_quote(pp) + " ";
    // One finding as the report holds it; its shrunk Case goes to `path` (the first to --repro-file,
    // each further one beside it, named by its property).
    // A further finding was shrunk with the properties found before it set aside: its repro command
    // sets them aside too, so the replay's headline is its own property.
    std::vector<std::string> earlier;
    auto finding = [&](const std::string& property, const Case& c, const std::vector<Finding>& fs, int index,
                       const FileArg& path, const std::vector<Case>& history, const std::string& history_note) {
      Skip aside = skip;
      if (!earlier.empty()) {
        for (const auto& e : earlier) aside.properties.insert(e);
        aside.reason = (skip.reason.empty() ? "" : skip.reason + "; ") +
                       fmt::format("found earlier in this run: {}", fmt::join(earlier, ", "));
      }
      const Finding* head = failed_finding(fs, property);
      std::string repro_line;
      FileArg history_file;
      if (!path.empty()) {
        try {
          write_atomically(path, to_json(c));
          if (!history.empty()) {  // the cases its worker ran before it, which the failure needs
            history_file = beside(path, "history");
            write_atomically(history_file, history_to_json(history));
          }
          repro_line = repro_env + "ckverify repro " + shell_quote(path.given) +
                       (history_file.empty() ? "" : " --history " + shell_quote(history_file.given)) + aside.args();
        } catch (const UsageError& e) {
          write_error += std::string(write_error.empty() ? "" : "; ") + e.what();
        }
      }
      report::Failure f = make_failure(c, fs, *head, repro_line, aside.properties);
      f.passing_before = index;
      f.history_note = history_note;
      f.history_file = history_file.given;
      earlier.push_back(property);
      return f;
    };
    auto note = [](int steps, bool cut) {
      return cut ? fmt::format("shrunk in {} step(s) until the time budget ran out", steps)
                 : fmt::format("shrunk in {} step(s)", steps);
    };
    r.failure = finding(s.property, s.failing_case, s.findings, s.failing_index, repro_path, s.history, s.history_note);
    r.shrink_note = note(s.shrink_steps, s.shrink_cut_short);
    for (const FoundFailure& f : s.further) {
      const FileArg path = repro_path.empty() ? FileArg{} : beside(repro_path, f.property);
      r.further.push_back(
          finding(f.property, f.failing_case, f.findings, f.failing_index, path, f.history, f.history_note));
      r.further.back().shrink_note = note(f.shrink_steps, f.shrink_cut_short);
      for (auto& p : r.properties)
        if (p.name == f.property)
          for (const auto& x : f.findings)
            if (x.property == f.property && x.failed()) set_failed(p, x);
    }
    r.exit_code = kExitFailed;
    std::cout << "\n";
    // A repro file that cannot be written is exit 2, as a report file is (emit): the verdict is on the
    // console above, the file the run was asked for is not.
    int code = kExitFailed;
    try {
      code = emit(r, out);
    } catch (const UsageError& e) {
      if (write_error.empty()) throw;
      write_error += std::string("; ") + e.what();
    }
    if (!write_error.empty()) throw UsageError(write_error + " (the case is printed above)");
    return code;
  }
  // A shard judges its share of --min-cases; merge judges the whole.
  const int shard_min = (min_cases + g.shard_count - 1) / g.shard_count;
  r.exit_code = s.ran == 0 || s.ran < shard_min ? kExitFailed : kExitOk;
  return emit(r, out);
}

}  // namespace ckv::cli
