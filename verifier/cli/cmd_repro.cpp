// verifier/cli/cmd_repro.cpp: see cmd_repro.hpp.
#include "verifier/cli/cmd_repro.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <iostream>

#include "verifier/case/environment_error.hpp"
#include "verifier/cli/workers.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/run.hpp"

namespace ckv::cli {

CLI::App* add_repro(CLI::App& app, ReproArgs& a) {
  CLI::App* repro = app.add_subcommand("repro", "Replay one Case file deterministically and print the diagnosis.");
  repro->add_option("case", a.case_path, "Case JSON file (as written by `check`)")->required();
  add_file(repro, "--json", a.outputs.json, "Write the report as JSON to this file");
  add_file(repro, "--junit", a.outputs.junit, "Write the report as JUnit XML to this file");
  add_file(repro, "--markdown", a.outputs.markdown, "Write the report as Markdown to this file");
  repro->add_option("--case-timeout", a.case_timeout, "Seconds the case may take before it counts as a hang")
      ->capture_default_str();
  repro->add_option("--skip", a.skip, "PROPERTY: set aside, as for check (needs --reason)")->allow_extra_args(false);
  repro->add_option("--reason", a.reason, "Why the --skip properties are set aside");
  repro->add_option("--history", a.history_path,
                    "Cases to run first in the same worker process, as `check` writes them beside the repro file "
                    "for a failure that needs them (FILE.history.json); only the Case file is judged");
  return repro;
}

void finish_repro(ReproArgs& a) {
  check_case_timeout(a.case_timeout);
  a.skipped = parse_skip(a.skip, a.reason);
}

int run_repro(const ReproArgs& a) {
  const std::string& path = a.case_path;
  const Outputs& out = a.outputs;
  const Skip& skip = a.skipped;
  std::vector<std::pair<std::string, std::string>> inputs = {{"the case file", path}};
  if (!a.history_path.empty()) inputs.emplace_back("--history", a.history_path);
  check_outputs(out.paths(), inputs);
  Case c = load_case_argument(path);
  const std::vector<Case> history = a.history_path.empty() ? std::vector<Case>{} : load_history(a.history_path);
  for (const Case& h : history)
    if (h.impl != c.impl)
      throw UsageError("--history " + sanitize(a.history_path, 200) + ": a case runs " + sanitize(h.impl, 200) +
                       ", the Case file " + sanitize(c.impl, 200) + " (the history is of one worker process)");
  check_impl_spec(c.impl);
  if (const std::string why = unobservable_here(impl_info(c.impl), c.device); !why.empty()) throw EnvironmentError(why);
  check_environment(c);
  std::cout << "ckverify repro: " << to_line(c) << std::endl;
  const auto start = std::chrono::steady_clock::now();
  // The implementation runs in a worker process, as in `check`: a crash or a hang is a finding here too.
  WorkerPool pool(WorkerOptions{1, 1, a.case_timeout, c.impl});
  std::vector<Case> sequence = history;
  sequence.push_back(c);
  if (!history.empty()) std::cout << "after " << history.size() << " case(s) from --history" << std::endl;
  const std::vector<Finding> fs = *pool.run(sequence, Clock::time_point::max()).back();
  report::Report r;
  r.command = "repro";
  r.impl = c.impl;
  r.plan = c.plan.to_string();
  r.device = c.device;
  r.seed = c.seed;
  r.cases_requested = r.cases_run = 1;
  r.skip_reason = skip.reason;
  r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& f : fs) r.properties.push_back(one_case_result(f, skip.properties.count(f.property) > 0));
  for (const auto& f : fs)
    if (f.failed() && !skip.properties.count(f.property)) {
      r.failure = make_failure(c, fs, f, "", skip.properties);
      r.exit_code = kExitFailed;
      break;
    }
  return emit(r, out);
}

}  // namespace ckv::cli
