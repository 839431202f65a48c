// verifier/cli/cmd_faults.cpp: see cmd_faults.hpp.
#include "verifier/cli/cmd_faults.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "verifier/cli/search.hpp"
#include "verifier/impls/loader.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv::cli {

constexpr int kRankFaultShrinkRuns = 2;

CLI::App* add_faults(CLI::App& app, FaultsArgs& a) {
  CLI::App* faults = app.add_subcommand(
      "faults", "Run the gate against every fault: the property that kills each, after how many cases, shrunk.");
  faults->add_option("--cases", a.cases, "Cases per fault before it counts as having survived")->capture_default_str();
  faults->add_option("--seed", a.seed_text, "Seed in [0, 2^64)")->capture_default_str();
  faults->add_option("--time-budget", a.budget, "Per fault: stop after this many seconds")->capture_default_str();
  add_file(faults, "--json", a.json, "Write the table as JSON to this file");
  faults->add_option("--device", a.device, "Device for the LibTorch runs: cpu, cuda or cuda:N")->capture_default_str();
  faults->add_option("-j,--jobs", a.jobs, "Worker processes (default: the machine's cores)")->capture_default_str();
  faults->add_option("--case-timeout", a.case_timeout, "Seconds one case may take before it counts as a hang")
      ->capture_default_str();
  faults->add_option("--plugin", a.plugin,
                     "Load every fault from this faults plugin (libckverify_faults.so, fault=NAME) instead of "
                     "the built-in table: proves the plugin loader path");
  faults->add_option("--fault", a.only, "Run only these faults (repeat, or a comma list; `ckverify list` names them)")
      ->delimiter(',');
  return faults;
}

void finish_faults(FaultsArgs& a) {
  a.seed = parse_seed(a.seed_text);
  a.gate = gate_options(a.jobs, a.case_timeout, "");
  check_count("--cases", a.cases, 1, kMaxSearchCases);
  check_time_budget(a.budget);
  for (const std::string& name : a.only) {
    const ImplInfo* info = find_impl(name);
    if (info == nullptr || info->killed_by.empty())
      throw UsageError("--fault " + sanitize(name, 100) + ": not a fault (`ckverify list` names them)");
  }
}

int run_faults(const FaultsArgs& a) {
  using nlohmann::json;
  const int cases = a.cases;
  const uint64_t seed = a.seed;
  const double budget = a.budget;
  const std::string& device = a.device;
  const std::string plugin = absolute_impl_spec(a.plugin);
  const FileArg& json_path = a.json;
  const GateOptions& g = a.gate;
  if (!plugin.empty() && spec_kind(plugin) != SpecKind::plugin)
    throw UsageError("--plugin " + sanitize(plugin, 200) + ": give the path of the faults plugin (a .so)");
  if (!plugin.empty()) check_impl_spec(plugin);
  check_outputs({{"--json", json_path}});
  check_device(device);
  std::cout << "ckverify faults: up to " << cases << " cases per fault, seed=" << seed << " device=" << device
            << (plugin.empty() ? "" : " via the plugin " + sanitize(plugin, 200)) << "\n\n";
  std::printf("%-24s %-16s %8s %8s  %s\n", "fault", "killed by", "cases", "seconds", "shrunk case");
  json rows = json::array();
  int survivors = 0, ran = 0;
  for (const auto& e : known_impls()) {
    const ImplInfo& info = e.info;
    if (info.killed_by.empty()) continue;
    if (!a.only.empty() && std::find(a.only.begin(), a.only.end(), info.name) == a.only.end()) continue;
    if (const std::string why = unobservable_here(info, device); !why.empty()) {
      std::printf("%-24s %-16s %8s %8s  %s\n", info.name.c_str(), "NOT RUN", "-", "-", why.c_str());
      rows.push_back({{"fault", info.name}, {"expected", info.killed_by}, {"run", false}, {"why", why}});
      continue;
    }
    if (!plugin.empty() && (info.state_fault != StateFault::none || info.parallel_fault != ParallelFault::none)) {
      // Not a checkpoint: the state saver, or the sharded model, is broken.
      const bool resume = info.state_fault != StateFault::none;
      std::printf("%-24s %-16s %8s %8s  %s\n", info.name.c_str(), "NOT RUN", "-", "-",
                  resume ? "a resume fault lives in ckverify's state saver, not in a plugin"
                         : "a tensor-parallel framework fault lives in ckverify's sharded model, not in a plugin");
      rows.push_back({{"fault", info.name},
                      {"expected", info.killed_by},
                      {"run", false},
                      {"why", resume ? "resume faults are not plugins" : "framework faults are not plugins"}});
      continue;
    }
    SearchOptions o;
    o.gen.impl = plugin.empty() ? info.name : plugin + ":fault=" + info.name;
    o.gen.device = device;
    o.gen.only = info.case_fields;  // the Cases that can show it at all (tp=2)
    g.apply(o);
    // A Case that runs as ranks costs about a second (processes, groups): its shrinking is bounded, and
    // the table then shows the smallest Case found within the bound.
    if (!info.case_fields.empty()) o.max_shrink_runs = kRankFaultShrinkRuns;
    o.cases = cases;
    o.seed = seed;
    o.budget_s = budget;
    o.pinned = info.killed_by;
    o.confirm_fresh = false;  // a kill is a kill, with or without the earlier cases
    const SearchResult r = search(o);
    const bool killed = !r.property.empty();
    survivors += !killed;
    ++ran;
    const std::string kills = killed ? std::to_string(r.failing_index + 1) : "-";
    std::printf("%-24s %-16s %8s %8.1f  %s\n", info.name.c_str(), killed ? r.property.c_str() : "SURVIVED",
                kills.c_str(), r.elapsed_s,
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
                    {"seconds", r.elapsed_s},
                    {"shrink_runs", r.shrink_runs},
                    {"shrunk_case", killed ? to_line(r.failing_case) : ""},
                    {"shrink_cut_short", r.shrink_cut_short}});
  }
  // A run in which no fault could run (every one NOT RUN here) verified nothing: as check, exit 1.
  std::cout << "\n"
            << (survivors  ? "FAIL: " + std::to_string(survivors) + " fault(s) survived"
                : ran == 0 ? std::string("FAIL: no fault ran here (each is NOT RUN above): nothing was verified")
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
  return survivors || ran == 0 ? kExitFailed : kExitOk;
}

}  // namespace ckv::cli
