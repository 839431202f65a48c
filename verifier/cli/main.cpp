// verifier/cli/main.cpp: the `ckverify` command, the CI gate. Subcommands:
//   check  run the properties over generated Cases against an implementation; shrink any failure
//   repro  replay one Case file deterministically and print the same diagnosis
//   faults run the gate against every fault injector: the killing property and cases-to-kill table
//   list   the properties, the implementations (builtin and the faults) and the Case fields
//   case   print a Case line as a Case file (JSON)
// Exit codes: 0 every property held; 1 a property failed (or nothing was verified); 2 bad usage, bad
// input, or a Case this machine cannot run; 3 internal error.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "properties/tolerance.hpp"
#include "reports/plot.hpp"
#include "reports/report.hpp"
#include "verifier/cli/args.hpp"
#include "verifier/cli/bench_report.hpp"
#include "verifier/cli/output.hpp"
#include "verifier/cli/reporting.hpp"
#include "verifier/cli/search.hpp"
#include "verifier/cli/supervise.hpp"
#include "verifier/cli/workers.hpp"
#include "verifier/impls/loader.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/amp_audit.hpp"
#include "verifier/run/bench.hpp"

#include <malloc.h>
#include <sys/stat.h>

#include <unistd.h>
#include <csignal>
#include <cstdlib>

#include <filesystem>
#include <sstream>
#include <thread>

namespace {
using namespace ckv;
using namespace ckv::cli;
using nlohmann::json;

int cmd_check(std::string impl_name, const std::string& plan_text, int cases, uint64_t seed, double budget,
              const Outputs& out, const std::string& repro_path, const std::string& device, const GateOptions& g,
              const std::vector<std::string>& only, const std::string& strategy, const Skip& skip, int min_cases,
              int max_findings) {
  SearchOptions o;
  if (max_findings < 1 || max_findings > 100) throw UsageError("--max-findings must be in [1, 100]");
  o.max_findings = max_findings;
  o.skipped = skip.properties;
  if (!strategy.empty()) {
    if (impl_name != "builtin")
      throw UsageError("--strategy and --impl are exclusive: a strategy chooses its checkpoint");
    if (!plan_text.empty())
      throw UsageError("--strategy and --plan are exclusive: the strategy decides what to checkpoint");
    impl_name = strategy_spec(strategy);
    o.gen.strategy = true;
  }
  o.gen.only = parse_only(only);
  for (const auto& w : only)
    if (!strategy.empty() && (w == "tie=head" || w == "segio=multi"))
      throw UsageError("--only " + sanitize(w) +
                       ": a strategy is gated on Cases whose blocks are whole units "
                       "(segio=single, tie=none or blocks)");
  o.gen.device = device;
  if (o.gen.strategy) o.gen.plan = Plan{PlanKind::every_block, 0};
  if (!plan_text.empty()) o.gen.plan = parse_plan("--plan", plan_text);
  check_impl_spec(impl_name);  // unknown names fail here, as usage errors
  // A plugin is named by its absolute path in every Case, so a repro file replays from any directory.
  if (spec_kind(impl_name) == SpecKind::plugin) {
    const size_t colon = impl_name.find(':');
    std::error_code ec;
    impl_name = std::filesystem::absolute(impl_name.substr(0, colon), ec).lexically_normal().string() +
                (colon == std::string::npos ? "" : impl_name.substr(colon));
    check_impl_spec(impl_name);
  }
  o.gen.impl = impl_name;
  if (o.gen.strategy && !make_impl(impl_name)->is_strategy())
    throw UsageError("--strategy " + sanitize(strategy, 200) +
                     ": the plugin's implementation is not a strategy "
                     "(CheckpointImpl::is_strategy)");
  if (const std::string why = unobservable_here(impl_info(impl_name), device); !why.empty())
    throw EnvironmentError(why);
  std::vector<std::pair<std::string, std::string>> paths = out.paths();
  paths.emplace_back("--repro-file", repro_path);
  check_outputs(paths);
  if (cases < 1) throw UsageError("--cases must be >= 1");
  if (min_cases < 0 || min_cases > cases)
    throw UsageError("--min-cases must be in [0, --cases " + std::to_string(cases) + "]");
  check_time_budget(budget);
  check_device(device);
  o.cases = cases;
  o.seed = seed;
  o.budget_s = budget;
  o.progress = true;
  g.apply(o);
  if (g.shard_index >= cases)
    throw UsageError("--shard: shard " + std::to_string(g.shard_index + 1) + " of --cases " + std::to_string(cases) +
                     " has no case");

  std::cout << "ckverify check: " << (o.gen.strategy ? "strategy=" + strategy : "impl=" + impl_name) << " plan="
            << (o.gen.strategy      ? "strategy's"
                : plan_text.empty() ? "any"
                                    : plan_text)
            << (o.gen.only.empty() ? "" : " only=\"" + o.gen.only + "\"")
            << (skip.properties.empty() ? "" : " skip=" + fmt::format("{}", fmt::join(skip.properties, ",")))
            << " cases=" << cases << " seed=" << seed << " device=" << device
            << (g.shard_count > 1 ? fmt::format(" shard={}/{}", g.shard_index + 1, g.shard_count) : "")
            << " workers=" << g.jobs << std::endl;
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
                       const std::string& path) {
      Skip aside = skip;
      if (!earlier.empty()) {
        for (const auto& e : earlier) aside.properties.insert(e);
        aside.reason = (skip.reason.empty() ? "" : skip.reason + "; ") +
                       fmt::format("found earlier in this run: {}", fmt::join(earlier, ", "));
      }
      const Finding* head = failed_finding(fs, property);
      std::string repro_line;
      if (!path.empty()) {
        try {
          write_atomically(path, to_json(c));
          repro_line = repro_env + "ckverify repro " + shell_quote(path) + aside.args();
        } catch (const UsageError& e) {
          write_error += std::string(write_error.empty() ? "" : "; ") + e.what();
        }
      }
      report::Failure f = make_failure(c, fs, *head, repro_line, aside.properties);
      f.passing_before = index;
      earlier.push_back(property);
      return f;
    };
    auto note = [](int steps, bool cut) {
      return cut ? fmt::format("shrunk in {} step(s) until the time budget ran out", steps)
                 : fmt::format("shrunk in {} step(s)", steps);
    };
    r.failure = finding(s.property, s.failing_case, s.findings, s.failing_index, repro_path);
    r.shrink_note = note(s.shrink_steps, s.shrink_cut_short);
    for (const FoundFailure& f : s.further) {
      std::string path;
      if (!repro_path.empty()) {
        const std::filesystem::path p(repro_path);
        path = (p.parent_path() / (p.stem().string() + "." + f.property + p.extension().string())).string();
      }
      r.further.push_back(finding(f.property, f.failing_case, f.findings, f.failing_index, path));
      r.further.back().shrink_note = note(f.shrink_steps, f.shrink_cut_short);
      for (auto& p : r.properties)
        if (p.name == f.property)
          for (const auto& x : f.findings)
            if (x.property == f.property && x.failed()) set_failed(p, x);
    }
    r.exit_code = kExitFailed;
    std::cout << "\n";
    const int code = emit(r, out);
    if (!write_error.empty()) std::cerr << "ckverify: " << write_error << " (the case is printed above)" << std::endl;
    return code;
  }
  // A shard judges its share of --min-cases; merge judges the whole.
  const int shard_min = (min_cases + g.shard_count - 1) / g.shard_count;
  r.exit_code = s.ran == 0 || s.ran < shard_min ? kExitFailed : kExitOk;
  return emit(r, out);
}

int cmd_repro(const std::string& path, const Outputs& out, double case_timeout, const Skip& skip) {
  check_outputs(out.paths(), {{"the case file", path}});
  Case c = load_case_argument(path);
  check_impl_spec(c.impl);
  if (const std::string why = unobservable_here(impl_info(c.impl), c.device); !why.empty()) throw EnvironmentError(why);
  check_environment(c);
  std::cout << "ckverify repro: " << to_line(c) << std::endl;
  const auto start = std::chrono::steady_clock::now();
  // The implementation runs in a worker process, as in `check`: a crash or a hang is a finding here too.
  WorkerPool pool(WorkerOptions{1, 1, case_timeout, c.impl});
  const std::vector<Finding> fs = *pool.run({c}, Clock::time_point::max()).front();
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

// The proof of power (DESIGN.md, "Faults"): every fault run through the same search as `check`, pinned
// to the property that must kill it, with how many generated cases it took and the shrunk case.
int cmd_faults(int cases, uint64_t seed, double budget, const std::string& json_path, const std::string& device,
               const GateOptions& g, const std::string& plugin) {
  if (!plugin.empty() && spec_kind(plugin) != SpecKind::plugin)
    throw UsageError("--plugin " + sanitize(plugin, 200) + ": give the path of the faults plugin (a .so)");
  if (!plugin.empty()) check_impl_spec(plugin);
  check_outputs({{"--json", json_path}});
  if (cases < 1) throw UsageError("--cases must be >= 1");
  check_time_budget(budget);
  check_device(device);
  std::cout << "ckverify faults: up to " << cases << " cases per fault, seed=" << seed << " device=" << device
            << (plugin.empty() ? "" : " via the plugin " + sanitize(plugin, 200)) << "\n\n";
  std::printf("%-24s %-16s %8s  %s\n", "fault", "killed by", "cases", "shrunk case");
  json rows = json::array();
  int survivors = 0;
  for (const auto& e : known_impls()) {
    const ImplInfo& info = e.info;
    if (info.killed_by.empty()) continue;
    if (const std::string why = unobservable_here(info, device); !why.empty()) {
      std::printf("%-24s %-16s %8s  %s\n", info.name.c_str(), "NOT RUN", "-", why.c_str());
      rows.push_back({{"fault", info.name}, {"expected", info.killed_by}, {"run", false}, {"why", why}});
      continue;
    }
    if (!plugin.empty() && info.state_fault != StateFault::none) {  // not a checkpoint: the state saver is broken
      std::printf("%-24s %-16s %8s  %s\n", info.name.c_str(), "NOT RUN", "-",
                  "a resume fault lives in ckverify's state saver, not in a plugin");
      rows.push_back({{"fault", info.name},
                      {"expected", info.killed_by},
                      {"run", false},
                      {"why", "resume faults are not plugins"}});
      continue;
    }
    SearchOptions o;
    o.gen.impl = plugin.empty() ? info.name : plugin + ":fault=" + info.name;
    o.gen.device = device;
    g.apply(o);
    o.cases = cases;
    o.seed = seed;
    o.budget_s = budget;
    o.pinned = info.killed_by;
    const SearchResult r = search(o);
    const bool killed = !r.property.empty();
    survivors += !killed;
    const std::string kills = killed ? std::to_string(r.failing_index + 1) : "-";
    std::printf("%-24s %-16s %8s  %s\n", info.name.c_str(), killed ? r.property.c_str() : "SURVIVED", kills.c_str(),
                killed ? to_line(r.failing_case).c_str() : ("after " + std::to_string(r.ran) + " cases").c_str());
    std::fflush(stdout);
    rows.push_back({{"fault", info.name},
                    {"expected", info.killed_by},
                    {"exposed_by", info.exposed_by},
                    {"run", true},
                    {"killed", killed},
                    {"killed_by", r.property},
                    {"cases_to_kill", killed ? r.failing_index + 1 : 0},
                    {"cases_run", r.ran},
                    {"shrunk_case", killed ? to_line(r.failing_case) : ""},
                    {"shrink_cut_short", r.shrink_cut_short}});
  }
  std::cout << "\n"
            << (survivors ? "FAIL: " + std::to_string(survivors) + " fault(s) survived"
                          : std::string("PASS: every fault that ran was killed by the property that names it"))
            << std::endl;
  if (!json_path.empty())
    write_atomically(json_path, json{{"tool", "ckverify"},
                                     {"command", "faults"},
                                     {"seed", seed},
                                     {"torch", TORCH_VERSION},
                                     {"faults", rows},
                                     {"survivors", survivors}}
                                        .dump(2) +
                                    "\n");
  return survivors ? kExitFailed : kExitOk;
}

// `ckverify merge`: the shards' reports in, the unsharded verdict out (console, and the files asked for).
int cmd_merge(const std::vector<std::string>& inputs, const Outputs& out) {
  std::vector<std::pair<std::string, std::string>> named;
  for (const auto& in : inputs) named.emplace_back("a report to merge", in);
  check_outputs(out.paths(), named);
  std::vector<report::Report> shards;
  for (const auto& in : inputs) {
    try {
      shards.push_back(report::from_json(read_regular_file(in, 256 << 20)));
    } catch (const std::invalid_argument& e) {
      throw UsageError(sanitize(in, 200) + ": " + e.what());
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

int cmd_list() {
  std::cout << "Properties (report order; a failure names the first):\n";
  for (const auto& p : properties()) std::cout << "  " << p.name << "\n      " << p.holds_when << "\n";
  std::cout << "\nImplementations (--impl):\n";
  for (const auto& e : known_impls()) {
    const ImplInfo& i = e.info;
    std::cout << "  " << i.name;
    if (!i.killed_by.empty())
      std::cout << "  [fault; killed by " << i.killed_by << "; shows with " << i.exposed_by << "]";
    std::cout << "\n      " << i.what << "\n";
  }
  std::cout
      << "\nSpecs for other implementations (--impl) and strategies (--strategy):\n"
         "  PATH.so[:key=value,...]\n"
         "      a C++ plugin built against <ckverify/plugin.hpp>; a strategy when it overrides is_strategy()\n"
         "  py:MODULE:CALLABLE[:key=value,...]\n"
         "      a Python callable; values typed (true/false, none, numbers, JSON [..] {..} \"..\", else strings);\n"
         "      keys starting with @ are ckverify's:\n"
         "      @convention=function  CALLABLE(segment, *ARGS, *segment_args, **options) (default)\n"
         "      @convention=wrapper   CALLABLE(segment, **options) -> module, called as module(*segment_args)\n"
         "      @convention=strategy  CALLABLE(blocks, x, **options) -> output (what --strategy sets)\n"
         "      @args=[...]           ARGS: positional arguments between the function and the segment's\n"
         "      segment: a ckverify.Segment (nn.Module; parameters(), index, step, micro); blocks: a\n"
         "      ckverify.Blocks (nn.ModuleList of them). An adapter may name its own convention.\n"
         "      Shipped adapters (python/ckverify/adapters.py):\n"
         "        py:ckverify.adapters:torch_checkpoint            torch's checkpoint marking its recomputes\n"
         "        py:ckverify.adapters:selective:ops=[...]         torch's selective activation checkpointing\n"
         "        py:ckverify.adapters:checkpoint_sequential       torch's checkpoint_sequential (a strategy)\n"
         "        py:ckverify.adapters:deepspeed[:reentrant=false,cpu_streams=true,CONFIGURE_OPTION=...]\n"
         "                                                         DeepSpeed's configure() + checkpoint\n"
         "        py:ckverify.adapters:transformers[:gradient_checkpointing_kwargs={...},offload=true]\n"
         "                                                         transformers' gradient_checkpointing_enable\n"
         "      (deepspeed and transformers: ci/setup.sh --frameworks; fairscale's checkpoint_wrapper needs\n"
         "      no adapter: py:fairscale.nn.checkpoint:checkpoint_wrapper:@convention=wrapper)\n";
  std::cout << "\nCase fields (line form key=value; JSON uses the same keys):\n";
  for (const auto& f : case_field_infos())
    std::cout << "  " << f.key << "=" << f.values << "\n      " << f.help << "\n";
  return kExitOk;
}

int cmd_case(const std::vector<std::string>& words) {
  std::string line;
  for (const auto& w : words) line += (line.empty() ? "" : " ") + w;
  const Case c = case_from_line(line);
  std::cout << to_json(c);
  return kExitOk;
}

// Trains a Case by hand: from its start or a state file, to a position, optionally saving the state.
// Prints every completed step's loss and the digest of the whole training state at the end, so runs in
// different processes can be compared (the cross-process resume test does).
int cmd_train(const std::string& path, int until, const std::string& save, const std::string& resume) {
  Case c = load_case_argument(path);
  check_impl_spec(c.impl);
  check_outputs({{"--save", save}}, {{"the case file", path}, {"--resume", resume}});
  const std::unique_ptr<CheckpointImpl> impl = make_impl(c.impl);
  TrainingRun run(c, impl.get());
  if (!resume.empty()) run.load(load_state_file(resume, c));
  const int target = until < 0 ? run.end() : until;
  if (target > run.end())
    throw UsageError(
        fmt::format("--until {} is past the Case's end ({} micro-batches: steps x micro)", target, run.end()));
  if (target < run.position())
    throw UsageError(fmt::format("--until {} is before the loaded position {}", target, run.position()));
  if (c.sched == Schedule::ffbb && target % c.micro != 0)
    throw UsageError(fmt::format("--until {} falls inside a step: sched=ffbb saves only at step boundaries", target));
  std::cout << "ckverify train: " << to_line(c) << "\n";
  if (run.position() > 0) std::cout << "resumed at micro-batch " << run.position() << "\n";
  int step = run.position() / c.micro;
  std::vector<StepRecord> steps;
  // A run that stops with a checkpointed segment stopped in the implementation under test (what runs
  // besides LibTorch and ckverify's model): its finding, as `check` reports it (completes), exit 1.
  const auto segments = c.plan.segments(c.model.layers, c.model.attention, c.model.tie == Tie::head);
  const bool checkpoints =
      std::any_of(segments.begin(), segments.end(), [](const Segment& s) { return s.checkpointed; });
  auto stopped = [&](const std::string& why) {
    std::cout << "FAIL: the run stopped at micro-batch " << run.position() << " of " << run.end() << ": "
              << sanitize(why, 400) << std::endl;
    return kExitFailed;
  };
  try {
    steps = run.advance_to(target);
  } catch (const std::exception& e) {
    if (!checkpoints) throw;
    return stopped(e.what());
  } catch (...) {
    if (!checkpoints) throw;
    return stopped("the implementation threw something that is not a std::exception");
  }
  for (const StepRecord& r : steps) {
    double loss = 0.0;
    for (size_t m = static_cast<size_t>(r.first_micro); m < r.losses.size(); ++m) loss += r.losses[m];
    std::cout << fmt::format("step {} loss {:.9g}{}\n", step++, loss,
                             r.first_micro > 0 ? fmt::format(" (micro-batches {}.. only)", r.first_micro) : "");
  }
  if (!save.empty()) {
    write_atomically(save, encode_state(run.state(StateFault::none)));
    std::cout << "saved the state at micro-batch " << run.position() << " to " << sanitize(save) << "\n";
  }
  std::cout << fmt::format("position {}/{} digest {}", run.position(), run.end(), run.digest()) << std::endl;
  return kExitOk;
}

// The AMP drift audit (verifier/run/amp_audit.hpp) of one Case file, or of generated Cases (the worst
// figure of each precision, mode and group over them). Exit 1 when checkpoint drift exceeds its allowance
// (amp_drift_allowance: the noise floor, or kAmpDesignFactor times the design floor).
int cmd_audit_amp(const std::string& path, const std::string& impl_name, const std::string& plan_text, int cases,
                  bool cases_given, uint64_t seed, const std::string& json_path, const std::string& plot_path,
                  const std::string& device) {
  check_outputs({{"--json", json_path}, {"--plot", plot_path}}, {{"the case file", path}});
  auto lower = plot_path;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (!plot_path.empty() && (lower.size() < 4 || lower.compare(lower.size() - 4, 4, ".png") != 0))
    throw UsageError("--plot must name a .png file");
  if (!plot_path.empty() && !report::gnuplot_available())
    throw EnvironmentError("--plot needs gnuplot (apt-get install gnuplot-nox), which is not on PATH");
  if (cases < 1 || cases > 100000) throw UsageError("--cases must be in [1, 100000]");
  if (!path.empty() && cases_given) throw UsageError("--cases generates Cases: give it or a Case file, not both");
  check_device(device);
  std::vector<Case> todo;
  CaseGenOptions gen;
  gen.allow_autocast = false;  // the audit runs every precision itself
  // Every block trainable (a frozen stack has no parameter gradient to audit), and no side-effecting
  // modules: a replayed effect is side-effect-once's finding, not AMP drift.
  gen.only = "freeze=none fx=none";
  gen.impl = impl_name.empty() ? "builtin" : impl_name;
  gen.device = device;
  if (!plan_text.empty()) {
    const Plan p = parse_plan("--plan", plan_text);
    if (p.kind == PlanKind::none)
      throw UsageError(
          "--plan none: audit-amp compares runs with and without checkpointing; give a plan that "
          "checkpoints something");
    gen.plan = p;
  }
  if (!path.empty()) {
    todo.push_back(load_case_argument(path));
    if (!impl_name.empty()) todo.back().impl = impl_name;
    if (gen.plan) todo.back().plan = *gen.plan;
  } else {
    const rc::Gen<Case> g = gen_case(gen);
    for (int i = 0; i < cases; ++i) todo.push_back(generate(g, seed, i).value());
  }
  const std::string impl = todo.front().impl;
  check_impl_spec(impl);
  // Worst over the cases, per (precision, checkpointed, group).
  std::map<std::tuple<std::string, bool, int, std::string>, AmpRow> worst;
  std::vector<std::string> exceeded, skipped, failed;
  std::map<std::string, double> loss_error;
  std::set<std::string> design_notes;
  std::string plan_name, case_line;
  int threads_a = 1, threads_b = 2;
  for (const Case& c : todo) {
    validate(c);
    const auto im = make_impl(c.impl);
    const AmpAudit a = audit_amp(c, *im);
    plan_name = todo.size() == 1 ? a.plan : "plan", case_line = a.case_line, skipped = a.skipped;
    threads_a = a.threads_a, threads_b = a.threads_b;
    for (const AmpRow& r : a.rows) {
      AmpRow& w = worst.try_emplace({r.precision, r.checkpointed, r.position, r.group}, r).first->second;
      w.rel_l2 = std::max(w.rel_l2, r.rel_l2), w.max_rel = std::max(w.max_rel, r.max_rel);
      w.drift = std::max(w.drift, r.drift), w.floor = std::max(w.floor, r.floor);
      w.allowed = std::max(w.allowed, r.allowed), w.design = std::max(w.design, r.design);
    }
    for (const auto& e : a.exceeded) exceeded.push_back(todo.size() > 1 ? e + " (case " + to_line(c) + ")" : e);
    for (const auto& e : a.failed) failed.push_back(todo.size() > 1 ? e + " (case " + to_line(c) + ")" : e);
    for (const auto& [k, v] : a.loss_error) loss_error[k] = std::max(loss_error[k], v);
    for (const auto& n : a.design_notes) design_notes.insert(todo.size() > 1 ? n + " (case " + to_line(c) + ")" : n);
  }
  std::vector<AmpRow> rows;
  for (const auto& [k, r] : worst) rows.push_back(r);
  std::stable_sort(rows.begin(), rows.end(), [](const AmpRow& a, const AmpRow& b) { return a.rel_l2 > b.rel_l2; });

  std::cout << "ckverify audit-amp: impl=" << impl << " plan="
            << (gen.plan           ? gen.plan->to_string()
                : todo.size() == 1 ? plan_name
                                   : "generated")
            << " device=" << device << " "
            << (todo.size() == 1 ? "case: " + case_line
                                 : std::to_string(todo.size()) + " generated cases, seed " + std::to_string(seed) +
                                       " (worst of each row)")
            << "\n";
  for (const auto& sk : skipped) std::cout << "skipped " << sk << "\n";
  std::cout << fmt::format("noise floor: the non-checkpointed run at {} vs {} intra-op thread(s)\n\n", threads_a,
                           threads_b);
  std::cout << fmt::format(
      "design floor: the drift of ckverify's reference reentrant checkpoints (from the inputs, "
      "and from detached leaves as torch's use_reentrant=True); allowed: the larger of the noise "
      "floor and {} x the design floor\n",
      kAmpDesignFactor);
  for (const auto& n : design_notes) std::cout << sanitize(n, 400) << "\n";
  std::cout << "\n"
            << fmt::format("{:<6} {:<8} {:<8} {:>14} {:>14} {:>12} {:>12} {:>12} {:>12} {:>13}\n", "prec", "ckpt",
                           "group", "rel-L2 vs fp64", "max-rel", "ckpt drift", "noise floor", "design floor", "allowed",
                           "drift/allowed");
  for (const AmpRow& r : rows) {
    std::string ratio = "-", allowed = "-", design = "-", drift = "-";
    if (r.checkpointed) {
      ratio = r.drift == 0.0 ? "0" : r.allowed == 0.0 ? "inf" : fmt::format("{:.3g}", r.drift / r.allowed);
      allowed = fmt::format("{:.3e}", r.allowed), design = fmt::format("{:.3e}", r.design);
      drift = fmt::format("{:.3e}", r.drift);
    }
    std::cout << fmt::format("{:<6} {:<8} {:<8} {:>14.3e} {:>14.3e} {:>12} {:>12.3e} {:>12} {:>12} {:>13}\n",
                             r.precision, r.checkpointed ? plan_name : "none", r.group, r.rel_l2, r.max_rel, drift,
                             r.floor, design, allowed, ratio);
  }
  std::cout << "\nloss error vs fp64:";
  for (const auto& [k, v] : loss_error) std::cout << fmt::format("  {} {:.3e}", k, v);
  std::cout << "\n";
  if (!json_path.empty()) {
    json j{{"tool", "ckverify"},
           {"command", "audit-amp"},
           {"impl", impl},
           {"plan", plan_name},
           {"device", device},
           {"cases", todo.size()},
           {"seed", seed},
           {"noise_floor_threads", {threads_a, threads_b}},
           {"skipped", skipped},
           {"exceeded", exceeded},
           {"failed", failed},
           {"loss_error", loss_error},
           {"design_notes", std::vector<std::string>(design_notes.begin(), design_notes.end())}};
    if (todo.size() == 1) j["case"] = case_line;
    json jr = json::array();
    for (const AmpRow& r : rows)
      jr.push_back({{"precision", r.precision},
                    {"checkpointed", r.checkpointed},
                    {"group", r.group},
                    {"position", r.position},
                    {"rel_l2", r.rel_l2},
                    {"max_rel", r.max_rel},
                    {"drift_rel_l2", r.checkpointed ? json(r.drift) : json(nullptr)},
                    {"noise_floor", r.floor},
                    {"design_floor", r.checkpointed ? json(r.design) : json(nullptr)},
                    {"allowed_drift", r.checkpointed ? json(r.allowed) : json(nullptr)}});
    j["rows"] = jr;
    write_atomically(json_path, j.dump(2) + "\n");
  }
  if (!plot_path.empty()) {
    const report::LinePlot p = amp_error_plot(rows, plan_name, impl);
    try {
      report::write_png(p, plot_path);
    } catch (const report::PlotError& e) {
      throw EnvironmentError(std::string("--plot: ") + e.what());
    }
  }
  for (const auto& f : failed) std::cout << "FAILED " << sanitize(f, 400) << "\n";
  if (!failed.empty() && exceeded.empty()) {
    std::cout << "FAIL: the run under test failed" << std::endl;
    return kExitFailed;
  }
  if (!exceeded.empty()) {
    std::cout << "FAIL: checkpoint drift exceeds its allowance: " << exceeded.front()
              << (exceeded.size() > 1 ? fmt::format(" (and {} more)", exceeded.size() - 1) : "") << std::endl;
    return kExitFailed;
  }
  std::cout << "PASS: checkpoint drift within its allowance everywhere" << std::endl;
  return kExitOk;
}

struct BenchArgs {
  std::string case_path, preset, plans, device = "cpu", json_path, out_dir, budget;
  std::vector<std::string> impls;  // --impl, repeatable, each a comma list of specs
  int warmup = 1, repeats = 8, max_repeats = 60, threads = 0;
  double time_cap = 300, target = 0.02;
  bool growth = false, amp = false;
  std::string command;
  std::vector<std::string> strategies;  // --strategy SPEC, measured beside the plans
  int verify_cases = 30;                // the gate's verdict per plan and strategy (0: none)
  std::vector<std::string> only;        // Case fields the verification fixes
};

// The gate's verdict on one bench entry: `cases` generated Cases (small: the generator's, not the
// bench Case) with the plan or the strategy, in this process.
std::string bench_verdict(const std::string& impl, const std::optional<Plan>& plan, bool strategy, int cases,
                          const std::string& only, std::string* detail_out) {
  SearchOptions so;
  so.gen.impl = impl;
  so.gen.plan = strategy ? std::optional<Plan>(Plan{PlanKind::every_block, 0}) : plan;
  so.gen.strategy = strategy;
  so.gen.only = only;
  so.cases = cases;
  so.seed = 1;
  so.budget_s = 300;
  so.max_shrink_runs = 200;
  const SearchResult s = search(so);
  if (!s.property.empty()) {
    std::string detail;
    if (const Finding* f = failed_finding(s.findings, s.property)) detail = f->where + ": " + f->detail;
    if (detail_out)
      *detail_out = to_line(s.failing_case) + (detail.empty() ? "" : "\n    " + detail.substr(0, detail.find('\n')));
    return "FAILED " + s.property;
  }
  return fmt::format("held ({}{})", s.ran, s.budget_hit ? ", budget" : "");
}

// Per-plan cost of one Case (verifier/run/bench.hpp): memory, time, overhead, tokens/s, loss curves.
int cmd_bench(BenchArgs a) {
  if (!a.case_path.empty() && !a.preset.empty()) throw UsageError("give a Case file or --preset, not both");
  if (!a.preset.empty() && a.preset != "seed-lab")
    throw UsageError("--preset \"" + sanitize(a.preset) + "\": known presets: seed-lab");
  if (a.warmup < 0 || a.warmup > 100) throw UsageError("--warmup must be in [0, 100]");
  // warmup + max_repeats steps stay within a Case's 1000.
  if (a.repeats < 1 || a.repeats > 500) throw UsageError("--repeats must be in [1, 500]");
  if (a.max_repeats < 1 || a.max_repeats > 500) throw UsageError("--max-repeats must be in [1, 500]");
  a.max_repeats = std::max(a.max_repeats, a.repeats);
  if (!(a.time_cap >= 0 && a.time_cap <= 86400)) throw UsageError("--time-cap must be in [0, 86400] seconds");
  if (!(a.target > 0 && a.target <= 1)) throw UsageError("--target must be in (0, 1] (a relative half-width)");
  std::vector<std::string> specs;
  for (const auto& list : a.impls)
    for (const auto& spec : split_impl_list(list)) {
      if (std::find(specs.begin(), specs.end(), spec) != specs.end())
        throw UsageError("--impl " + sanitize(spec, 200) + " is given twice");
      specs.push_back(spec);
    }
  if (specs.empty()) specs.push_back("builtin");
  const std::string impl_text = fmt::format("{}", fmt::join(specs, ","));
  const int cores = machine_cores();
  if (a.threads < 0 || a.threads > 1024) throw UsageError("--threads must be in [1, 1024]");
  const int threads = a.threads > 0 ? a.threads : cores;
  const int64_t budget = a.budget.empty() ? 0 : parse_bytes(a.budget);
  check_device(a.device);
  // Outputs: --json, and the files under --out, all checked before any work.
  std::vector<std::pair<std::string, std::string>> outs = {{"--json", a.json_path}};
  if (!a.out_dir.empty()) {
    struct stat st {};
    if (::lstat(a.out_dir.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) throw UsageError("--out \"" + sanitize(a.out_dir) + "\" exists and is not a directory");
    } else {
      const std::filesystem::path parent = std::filesystem::path(a.out_dir).parent_path();
      if (!parent.empty() && !std::filesystem::is_directory(parent))
        throw UsageError("--out: the directory " + sanitize(parent.string()) + " does not exist");
    }
    if (!report::gnuplot_available())
      throw EnvironmentError("--out writes plots through gnuplot (apt-get install gnuplot-nox), which is not on PATH");
  }
  Case c;
  if (!a.preset.empty()) {
    c = seed_lab_case(a.device);
  } else if (!a.case_path.empty()) {
    c = load_case_argument(a.case_path);
  } else {
    throw UsageError("give a Case file or --preset seed-lab");
  }
  c.device = a.device;
  for (const auto& spec : specs) {
    check_impl_spec(spec);
    if (make_impl(spec)->is_strategy())
      throw UsageError("--impl " + sanitize(spec, 200) + " is a strategy: measure it with --strategy");
  }
  c.impl = specs.front();
  validate(c);
  if (a.verify_cases < 0 || a.verify_cases > 100000) throw UsageError("--verify-cases must be in [0, 100000]");
  const std::string only = parse_only(a.only);
  std::vector<std::pair<std::string, std::string>> strategies;  // label, impl spec
  for (const auto& s : a.strategies) {
    const std::string spec = strategy_spec(s);
    check_impl_spec(spec);
    if (!make_impl(spec)->is_strategy())
      throw UsageError("--strategy " + sanitize(s, 200) + ": the plugin's implementation is not a strategy");
    std::string label = s.rfind("py:", 0) == 0 ? s.substr(3) : std::filesystem::path(s).filename().string();
    for (const auto& [l, _] : strategies)
      if (l == label) throw UsageError("--strategy " + sanitize(s, 200) + " is given twice");
    strategies.emplace_back(label, spec);
  }
  std::vector<Plan> plans;
  if (!a.plans.empty()) {
    std::stringstream ss(a.plans);
    std::string item;
    bool none = false;
    while (std::getline(ss, item, ',')) {
      const Plan p = parse_plan("--plans", item);
      if (const std::string bad = p.invalid_for(c.model.layers); !bad.empty()) throw UsageError("--plans: " + bad);
      if (std::any_of(plans.begin(), plans.end(), [&](const Plan& q) { return q == p; }))
        throw UsageError("--plans: " + p.to_string() + " is listed twice");
      none |= p == Plan{};
      plans.push_back(p);
    }
    if (!none) plans.insert(plans.begin(), Plan{});  // every plan is compared with none
  } else {
    plans = a.preset.empty() ? default_bench_plans(c) : seed_lab_plans();
  }
  if (!a.out_dir.empty())
    for (const auto& f : bench_report_files(a.growth, a.amp)) outs.emplace_back("--out", a.out_dir + "/" + f);
  bool created = false;
  if (!a.out_dir.empty() && !std::filesystem::exists(a.out_dir)) {
    std::error_code ec;
    created = std::filesystem::create_directory(a.out_dir, ec);
    if (ec) throw UsageError("--out: cannot create " + sanitize(a.out_dir) + ": " + ec.message());
  }
  try {
    check_outputs(outs, {{"the case file", a.case_path}});
  } catch (...) {
    if (created) ::rmdir(a.out_dir.c_str());
    throw;
  }

  torch::set_num_threads(threads);
  // LibTorch's CPU allocator is malloc: let it keep what it frees (as CUDA's caching allocator does)
  // instead of returning large blocks to the kernel and faulting fresh pages in every step, which
  // otherwise dominates the step time of the plans that allocate most and makes timings noisy.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  BenchOptions o;
  o.warmup = a.warmup, o.repeats = a.repeats, o.max_repeats = a.max_repeats, o.memory_budget = budget;
  o.time_cap_s = a.time_cap, o.target = a.target, o.growth = a.growth;
  for (const auto& [label, spec] : strategies)
    o.strategies.push_back({label, [spec = spec] { return make_impl(spec); }});
  const bool tty = ::isatty(STDERR_FILENO);
  o.progress = [tty](const std::string& s) {
    if (tty) std::cerr << "\r\033[K" << s << std::flush;
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<BenchImpl> bench_impls;
  for (const auto& spec : specs) bench_impls.push_back({spec, [spec = spec] { return make_impl(spec); }});
  BenchResult r = run_bench(c, plans, bench_impls, o);
  if (a.verify_cases > 0) {
    // Correctness beside cost: the gate on every plan (with --impl) and every strategy.
    torch::set_num_threads(1);
    for (PlanBench& p : r.plans) {
      if (p.plan == "none") continue;
      o.progress("verifying " + p.plan + (p.impl.empty() ? "" : " (" + p.impl + ")"));
      const auto st =
          std::find_if(strategies.begin(), strategies.end(), [&](const auto& e) { return e.first == p.plan; });
      p.verified =
          p.impl.empty() && st != strategies.end()
              ? bench_verdict(st->second, std::nullopt, true, a.verify_cases, only, &p.verified_detail)
              : bench_verdict(p.impl, parse_plan("bench", p.plan), false, a.verify_cases, only, &p.verified_detail);
    }
    torch::set_num_threads(threads);
  }
  std::optional<AmpAudit> amp;
  if (a.amp) {
    o.progress("AMP audit");
    Case k = c;
    k.steps = 1;
    if (k.plan == Plan{}) k.plan = plans.size() > 1 ? plans[1] : Plan{PlanKind::every_block, 0};
    if (k.plan == Plan{}) k.plan = Plan{PlanKind::every_block, 0};
    const auto im = make_impl(specs.front());
    amp = audit_amp(k, *im);
  }
  if (tty) std::cerr << "\r\033[K" << std::flush;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format(
                   "ckverify bench: impl={} device={} threads={} warmup={} repeats={}..{} target=+-{:.1f}% ({:.0f} "
                   "s)\ncase: {}\n",
                   impl_text, a.device, threads, a.warmup, a.repeats, a.max_repeats, 100.0 * a.target, secs,
                   r.case_line)
            << bench_table(r);
  if (amp)
    std::cout << fmt::format("\nAMP audit (plan {}): {}\n", amp->plan,
                             amp->exceeded.empty() && amp->failed.empty() ? "checkpoint drift within its allowance"
                                                                          : "checkpoint drift exceeds its allowance");
  if (!a.json_path.empty()) write_atomically(a.json_path, bench_json(r, impl_text, a.device, threads).dump(2) + "\n");
  if (!a.out_dir.empty()) {
    write_bench_report(a.out_dir, r, amp ? &*amp : nullptr, impl_text, a.device, threads, a.command);
    std::cout << "report: " << a.out_dir << "/report.md\n";
  }
  std::vector<std::string> failed;
  auto row = [](const PlanBench& p) { return p.impl.empty() ? p.plan : p.plan + " (" + p.impl + ")"; };
  for (const PlanBench& p : r.plans)
    if (!p.completed) failed.push_back(row(p) + ": " + p.error);
  for (const PlanBench& p : r.plans)
    if (p.verified.rfind("FAILED", 0) == 0) failed.push_back(row(p) + ": the gate " + p.verified);
  if (!failed.empty()) {
    std::cout << "FAIL: plan " << failed.front() << std::endl;
    return kExitFailed;
  }
  if (!r.growth_failed.empty()) {
    std::cout << "FAIL: growth: " << r.growth_failed << std::endl;
    return kExitFailed;
  }
  if (!r.diverged.empty()) {
    std::cout << "FAIL: the loss curve of plan " << r.diverged.front() << " left none's" << std::endl;
    return kExitFailed;
  }
  if (amp && !(amp->exceeded.empty() && amp->failed.empty())) {
    std::cout << "FAIL: checkpoint drift exceeds its allowance" << std::endl;
    return kExitFailed;
  }
  std::cout << "PASS: every plan completed and trained exactly as none did" << std::endl;
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ckverify: correctness gate for activation checkpointing (LibTorch vs a non-checkpointed run and an Eigen fp64 "
      "reference).\nExit codes: 0 all properties held, 1 a property failed, 2 bad usage, bad input or a case this "
      "machine cannot run, 3 internal error."};
  app.require_subcommand(1);
  std::string impl = "builtin", plan, json_path, repro_path = "ckverify-repro.json", device = "cpu", case_path;
  int cases = 2000;
  uint64_t seed = 1;
  std::string seed_text = "1";
  double budget = 180;

  auto* check = app.add_subcommand("check", "Run the properties (" + property_list() +
                                                ") over generated Cases; shrink any failure to a minimal Case.");
  check
      ->add_option("--impl", impl,
                   "Implementation under test: builtin, a fault name (see `ckverify list`), a C++ plugin "
                   "PATH.so[:key=value,...] or a Python function py:MODULE:CALLABLE[:key=value,...]")
      ->capture_default_str();
  check->add_option("--plan", plan,
                    std::string("Checkpoint plan for every case (") + kPlanSpellings + "); default: generated");
  check->add_option("--cases", cases, "Number of generated cases")->capture_default_str();
  check->add_option("--seed", seed_text, "Seed in [0, 2^64); the same seed generates the same cases")
      ->capture_default_str();
  check
      ->add_option("--time-budget", budget,
                   "Stop after this many seconds, shrinking included (the report says how many cases ran)")
      ->capture_default_str();
  Outputs outs;
  check->add_option("--json", outs.json, "Write the report as JSON to this file");
  check->add_option("--junit", outs.junit, "Write the report as JUnit XML (one testcase per property) to this file");
  check->add_option("--markdown", outs.markdown, "Write the report as Markdown to this file");
  check->add_option("--repro-file", repro_path, "Where the shrunk failing Case is written")->capture_default_str();
  check->add_option("--device", device, "Device for the LibTorch runs: cpu, cuda or cuda:N")->capture_default_str();
  const int cores = machine_cores();
  int jobs = cores;
  double case_timeout = 120;
  std::string shard;
  std::vector<std::string> only;
  std::string strategy;
  check->add_option("--strategy", strategy,
                    "Gate checkpointing strategy code instead of a checkpoint function: py:MODULE:FUNC[:key=value,...] "
                    "called as FUNC(blocks, x, **options) with the Case's blocks as an nn.ModuleList (it decides which "
                    "blocks to checkpoint, with any checkpoint function), or a plugin PATH.so whose implementation "
                    "is a strategy; every property judges the effective plan it produced");
  std::vector<std::string> skip_names;
  std::string skip_reason;
  check
      ->add_option("--skip", skip_names,
                   "PROPERTY: set a property aside (repeatable or a comma list; needs --reason). It still runs but "
                   "never fails the run or counts as held; every report lists it as skipped, with the reason and "
                   "the cases on which it would have failed")
      ->allow_extra_args(false);
  int max_findings = 1;
  check
      ->add_option("--max-findings", max_findings,
                   "After a failure, set its property aside and go on, until this many properties have failed, "
                   "each with its own shrunk Case and repro (the first written to --repro-file, each further one "
                   "beside it as FILE.PROPERTY.json); the exit code is 1 if any failed")
      ->capture_default_str();
  int min_cases = 0;
  check->add_option("--min-cases", min_cases,
                    "Fewer cases than this judged before the time budget ends is a failed run (exit 1), not a pass on "
                    "whatever ran; with --shard K/N each shard needs its share (1/N) and merge judges the whole");
  check->add_option("--reason", skip_reason, "Why the --skip properties are set aside (recorded in every report)");
  check->add_option("--only", only,
                    "KEY=VALUE: every generated case takes this Case field as given (repeatable; e.g. --only fx=none "
                    "to gate an implementation that does not follow the recompute contract of segment_scope.hpp)");
  check
      ->add_option("-j,--jobs", jobs,
                   "Worker processes running the implementation (the verdict is the same for any number); "
                   "default: the machine's cores")
      ->capture_default_str();
  check
      ->add_option("--case-timeout", case_timeout,
                   "Seconds one case may take in a worker before it counts as a hang (a completes failure)")
      ->capture_default_str();
  check->add_option("--shard", shard,
                    "K/N: run only the cases i with i % N == K-1 (N machines, disjoint cases); `ckverify merge` "
                    "combines their --json reports");

  auto* repro = app.add_subcommand("repro", "Replay one Case file deterministically and print the diagnosis.");
  repro->add_option("case", case_path, "Case JSON file (as written by `check`)")->required();
  repro->add_option("--json", outs.json, "Write the report as JSON to this file");
  repro->add_option("--junit", outs.junit, "Write the report as JUnit XML to this file");
  repro->add_option("--markdown", outs.markdown, "Write the report as Markdown to this file");
  repro->add_option("--case-timeout", case_timeout, "Seconds the case may take before it counts as a hang")
      ->capture_default_str();
  repro->add_option("--skip", skip_names, "PROPERTY: set aside, as for check (needs --reason)")
      ->allow_extra_args(false);
  repro->add_option("--reason", skip_reason, "Why the --skip properties are set aside");

  auto* faults = app.add_subcommand(
      "faults", "Run the gate against every fault: the property that kills each, after how many cases, shrunk.");
  int fault_cases = 500;
  double fault_budget = 120;
  faults->add_option("--cases", fault_cases, "Cases per fault before it counts as having survived")
      ->capture_default_str();
  faults->add_option("--seed", seed_text, "Seed in [0, 2^64)")->capture_default_str();
  faults->add_option("--time-budget", fault_budget, "Per fault: stop after this many seconds")->capture_default_str();
  faults->add_option("--json", json_path, "Write the table as JSON to this file");
  faults->add_option("--device", device, "Device for the LibTorch runs: cpu, cuda or cuda:N")->capture_default_str();
  faults->add_option("-j,--jobs", jobs, "Worker processes (default: the machine's cores)")->capture_default_str();
  faults->add_option("--case-timeout", case_timeout, "Seconds one case may take before it counts as a hang")
      ->capture_default_str();
  std::string fault_plugin;
  faults->add_option("--plugin", fault_plugin,
                     "Load every fault from this faults plugin (libckverify_faults.so, fault=NAME) instead of "
                     "the built-in table: proves the plugin loader path");

  auto* merge = app.add_subcommand(
      "merge", "Combine the --json reports of the shards of one `check` run (--shard K/N) into one verdict.");
  std::vector<std::string> merge_inputs;
  merge->add_option("reports", merge_inputs, "The shards' JSON reports")->required();
  merge->add_option("--json", outs.json, "Write the merged report as JSON to this file");
  merge->add_option("--junit", outs.junit, "Write the merged report as JUnit XML to this file");
  merge->add_option("--markdown", outs.markdown, "Write the merged report as Markdown to this file");

  // The worker process (workers.hpp), started by check, repro and faults; not for direct use.
  auto* worker = app.add_subcommand("worker", "");
  worker->group("");
  std::string worker_impl = "builtin";
  int worker_threads = 1;
  worker->add_option("--impl", worker_impl);
  worker->add_option("--threads", worker_threads);

  auto* list = app.add_subcommand(
      "list", "List the properties, the implementations (builtin and the faults) and the Case fields.");
  auto* case_cmd =
      app.add_subcommand("case", "Print a Case given in line form (key=value ...) as a Case file (JSON) for repro.");
  std::vector<std::string> case_words;
  case_cmd->add_option("keys", case_words, "Case fields as key=value (see `ckverify list`); the rest default");

  auto* train = app.add_subcommand(
      "train",
      "Train one Case (its impl and plan) to a position, saving or resuming its training state; prints the "
      "losses and a digest of the whole state.");
  int until = -1;
  std::string save_path, resume_path;
  train->add_option("case", case_path, "Case JSON file")->required();
  train->add_option("--until", until, "Stop after this many micro-batches (default: the end: steps x micro)");
  train->add_option("--save", save_path, "Write the training state there at the end (format: verifier/run/state.hpp)");
  train->add_option("--resume", resume_path, "Start from this state file (saved from the same Case)");
  double stall_timeout = 300;
  const std::string stall_help =
      "Seconds without progress (a micro-batch started, a Case verified) after which the run counts as hung: "
      "the implementation is killed and blamed";
  train->add_option("--stall-timeout", stall_timeout, stall_help)->capture_default_str();

  auto* audit = app.add_subcommand(
      "audit-amp",
      "Audit AMP drift: per precision (fp32, bf16, fp16) with and without checkpointing, every parameter "
      "group's gradient error against fp64, and the drift checkpointing adds, against the larger of a measured "
      "noise floor and twice the drift of correct reentrant checkpoints (the design floor). Exit 1 when the drift "
      "exceeds it.");
  std::string audit_impl, audit_plot;
  int audit_cases = 50;
  audit->add_option("case", case_path, "Case JSON file (default: generated fp32 Cases)");
  audit->add_option("--impl", audit_impl, "Implementation under test (default: the Case's, or builtin)");
  audit->add_option("--plan", plan, "Checkpoint plan (default: the Case's; block when it has none)");
  audit->add_option("--cases", audit_cases, "Generated Cases when no Case file is given")->capture_default_str();
  audit->add_option("--seed", seed_text, "Seed for generated Cases, in [0, 2^64)")->capture_default_str();
  audit->add_option("--json", json_path, "Write the audit as JSON to this file");
  audit->add_option("--plot", audit_plot, "Write the per-group error plot (PNG, through gnuplot) to this file");
  audit->add_option("--device", device, "Device: cpu, cuda or cuda:N")->capture_default_str();
  audit->add_option("--stall-timeout", stall_timeout, stall_help)->capture_default_str();

  auto* bench = app.add_subcommand(
      "bench",
      "Per checkpoint plan: peak and kept tensor memory, step time (forward, backward, optimizer), recompute "
      "overhead against its bound, tokens/s, loss curves; optionally the growth law, the largest batch within a "
      "memory budget, and a Markdown report with plots.");
  BenchArgs ba;
  bench->add_option("case", ba.case_path, "Case JSON file (or --preset)");
  bench->add_option(
      "--preset", ba.preset,
      "seed-lab: seed 001's 20-layer lab and its 14 plans (D=256 on CPU, the seed's D=2048, B=2, S=2048 on CUDA)");
  bench->add_option("--plans", ba.plans,
                    std::string("Comma list of plans (") + kPlanSpellings + "); none is always included");
  bench
      ->add_option(
          "--impl", ba.impls,
          "Implementations doing the checkpointing, side by side (a comma list, or repeated; default builtin): "
          "every plan runs with each, and each is compared with the first")
      ->allow_extra_args(false);
  bench
      ->add_option("--strategy", ba.strategies,
                   "A checkpointing strategy to measure beside the plans (repeatable; as for check --strategy)")
      ->allow_extra_args(false);
  bench
      ->add_option("--verify-cases", ba.verify_cases,
                   "Generated Cases the gate runs on every plan and strategy for the verified column (0: none)")
      ->capture_default_str();
  bench->add_option("--only", ba.only, "KEY=VALUE: a Case field the verification fixes (repeatable, as for check)")
      ->allow_extra_args(false);
  bench->add_option("--device", ba.device, "Device: cpu, cuda or cuda:N")->capture_default_str();
  bench->add_option("--stall-timeout", stall_timeout, stall_help)->capture_default_str();
  bench->add_option("--warmup", ba.warmup, "Steps run before timing")->capture_default_str();
  bench->add_option("--repeats", ba.repeats, "Timed rounds at least (every row one step per round; medians over them)")
      ->capture_default_str();
  bench->add_option("--max-repeats", ba.max_repeats, "Timed rounds at most, while an interval is wider than --target")
      ->capture_default_str();
  bench->add_option("--time-cap", ba.time_cap, "Seconds of timed rounds after which no new round starts")
      ->capture_default_str();
  bench
      ->add_option("--target", ba.target,
                   "Relative half-width every 95% interval of a time ratio should reach (0.02: +-2%)")
      ->capture_default_str();
  bench->add_option("--threads", ba.threads, "Intra-op threads (default: the machine's cores)");
  bench->add_option("--memory-budget", ba.budget, "Find each plan's largest batch within this peak (e.g. 512M, 2G)");
  bench->add_flag("--growth", ba.growth,
                  "Also measure activation peak against depth (L = 4, 9, 16, 25, 36) for none and sqrt");
  bench->add_flag("--amp", ba.amp, "Also run the AMP drift audit on the Case (into the report)");
  bench->add_option("--json", ba.json_path, "Write the results as JSON to this file");
  bench->add_option("--out", ba.out_dir,
                    "Write report.md, plots (PNG, through gnuplot), CSV and JSON into this directory");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "ckverify: " << sanitize(e.what(), 300) << " (see ckverify --help)" << std::endl;
    return kExitUsage;
  }
  // The gate's tensors are tiny: one intra-op thread runs a case as fast as two (measured: 300 cases in
  // 13.75 s with one, 13.87 s with two, at half the CPU) and leaves the other cores to other work.
  torch::set_num_threads(1);
  // Over a file-size limit (ulimit -f) a write fails with EFBIG and the output is reported unwritten
  // (its temporary file removed), instead of the process dying of SIGXFSZ half-way through a file.
  std::signal(SIGXFSZ, SIG_IGN);
  // Temporary files (workers' scratch, plots) go under TMPDIR: one that is not a directory is this
  // machine's problem, said up front, not an internal error half-way through a run.
  if (const char* tmp = std::getenv("TMPDIR"); tmp && *tmp) {
    struct stat st {};
    if (::stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode)) {
      std::cerr << "ckverify: TMPDIR=" << sanitize(tmp, 200) << " is not a directory (set it to one, or unset it)"
                << std::endl;
      return kExitUsage;
    }
  }
  // A path option given as "" would silently write nothing.
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options())
      if (opt->count() > 0 && opt->get_type_name() == "TEXT")
        for (const std::string& v : opt->results())
          if (v.empty()) {
            std::cerr << "ckverify: " << opt->get_name() << " is empty" << std::endl;
            return kExitUsage;
          }
  // train, bench and audit-amp run the implementation in this process's forked child (supervise.hpp);
  // check, repro and faults run it in workers (workers.hpp).
  auto run_command = [&]() -> int {
    try {
      seed = parse_seed(seed_text);
      if (*worker) return worker_main(worker_impl, worker_threads);
      if (*check)
        return cmd_check(impl, plan, cases, seed, budget, outs, repro_path, device,
                         gate_options(jobs, case_timeout, shard), only, strategy, parse_skip(skip_names, skip_reason),
                         min_cases, max_findings);
      if (*repro)
        return cmd_repro(case_path, outs, gate_options(1, case_timeout, "").case_timeout_s,
                         parse_skip(skip_names, skip_reason));
      if (*faults)
        return cmd_faults(fault_cases, seed, fault_budget, json_path, device, gate_options(jobs, case_timeout, ""),
                          fault_plugin);
      if (*merge) return cmd_merge(merge_inputs, outs);
      if (*list) return cmd_list();
      if (*case_cmd) return cmd_case(case_words);
      if (*audit)
        return cmd_audit_amp(case_path, audit_impl, plan, audit_cases, audit->count("--cases") > 0, seed, json_path,
                             audit_plot, device);
      if (*bench) {
        ba.command = "ckverify";
        for (int i = 1; i < argc; ++i) ba.command += std::string(" ") + sanitize(argv[i], 200);
        return cmd_bench(ba);
      }
      if (*train) {
        if (train->count("--until") > 0 && until < 0) throw UsageError("--until must be >= 0");
        return cmd_train(case_path, until, save_path, resume_path);
      }
    } catch (const UsageError& e) {
      std::cerr << "ckverify: " << e.what() << std::endl;
      return kExitUsage;
    } catch (const CaseError& e) {
      std::cerr << "ckverify: " << e.what() << std::endl;
      return kExitUsage;
    } catch (const StateError& e) {
      std::cerr << "ckverify: " << sanitize(e.what(), 400) << std::endl;
      return kExitUsage;
    } catch (const EnvironmentError& e) {
      std::cerr << "ckverify: cannot run here: " << sanitize(e.what(), 300) << std::endl;
      return kExitUsage;
    } catch (const std::invalid_argument& e) {
      std::cerr << "ckverify: " << sanitize(e.what(), 300) << std::endl;
      return kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "ckverify: internal error: " << sanitize(e.what(), 400) << std::endl;
      return kExitInternal;
    }
    return kExitUsage;
  };
  if (*train || *bench || *audit) {
    const char* name = *train ? "train" : *bench ? "bench" : "audit-amp";
    if (!(stall_timeout >= 1.0) || !std::isfinite(stall_timeout)) {
      std::cerr << "ckverify: --stall-timeout must be a number of seconds >= 1" << std::endl;
      return kExitUsage;
    }
    try {
      return supervise({name, stall_timeout}, run_command);
    } catch (const std::exception& e) {
      std::cerr << "ckverify: cannot run here: " << sanitize(e.what(), 300) << std::endl;
      return kExitUsage;
    }
  }
  return run_command();
}
