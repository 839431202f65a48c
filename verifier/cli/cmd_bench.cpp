// verifier/cli/cmd_bench.cpp: see cmd_bench.hpp.
#include "verifier/cli/cmd_bench.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>

#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

#include "reports/plot.hpp"
#include "verifier/case/environment_error.hpp"
#include "verifier/cli/args.hpp"
#include "verifier/cli/bench_report.hpp"
#include "verifier/cli/reporting.hpp"
#include "verifier/cli/search.hpp"
#include "verifier/cli/supervise.hpp"
#include "verifier/cli/workers.hpp"
#include "verifier/dist/group.hpp"
#include "verifier/dist/ranks.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/amp_audit.hpp"
#include "verifier/run/bench.hpp"
#include "verifier/run/parallel.hpp"
#include "verifier/run/progress.hpp"

namespace ckv::cli {
namespace {

// A rank's exit code when its row failed because a peer rank was gone (a collective's connection closed
// or timed out): a consequence, never the cause the parent reports while another rank has one.
constexpr int kExitPeerGone = 4;

// The gate's verdict on one bench entry: `cases` generated Cases (small: the generator's, not the
// bench Case) with the plan or the strategy, in this process.
std::string bench_verdict(const std::string& impl, const std::optional<Plan>& plan, bool strategy, int cases,
                          const std::string& only, const std::string& device, std::string* detail_out) {
  SearchOptions so;
  so.gen.impl = impl;
  so.gen.device = device;  // verified where it is measured
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

// Starts n - 1 threads and joins them; a machine (or a limit: ulimit -u, a container's pids.max) that
// cannot is the environment's, one line, before anything is measured.
void ensure_threads_start(int n) {
  std::promise<void> go;
  const std::shared_future<void> all_started = go.get_future().share();
  std::vector<std::thread> started;  // alive together, as the runtime's would be
  std::string failed;
  try {
    for (int k = 1; k < n; ++k) started.emplace_back([all_started] { all_started.wait(); });
  } catch (const std::system_error& e) {
    failed = e.what();
  }
  go.set_value();
  for (auto& t : started) t.join();
  if (!failed.empty())
    throw EnvironmentError(fmt::format("--threads {}: only {} thread(s) could be started here ({}); lower --threads", n,
                                       started.size() + 1, failed));
}

// A Case with tp or dp > 1: the same command again as its ranks (dist/ranks.hpp; each rank, told by the
// hidden --as-rank, runs its shard: run_bench below), in a directory of the run's own. Rank 0 prints and writes
// what a one-process bench would; its output is relayed here. A rank that crashes, hangs past its own
// --stall-timeout, or fails is named, and takes the others with it.
int bench_as_ranks(const BenchArgs& a, const Case& c) {
  const dist::LaunchDir dir("ckverify-bench-ranks");
  if (!dir.made()) throw EnvironmentError("cannot create a temporary directory in " + dir.path());
  const std::string& templ = dir.path();
  dist::RankLaunch launch;
  launch.exe = self_exe();
  launch.args = a.args;
  launch.args.push_back("--as-rank");
  launch.world = c.ranks();
  launch.dir = templ;
  launch.deadline = std::chrono::hours(24);  // each rank's own --stall-timeout ends a hang
  // The supervisor sees this process wait, not hang: a heartbeat while the ranks run.
  std::vector<dist::RankOutcome> outcomes;
  std::exception_ptr failed;
  std::atomic<bool> done{false};
  std::thread ranks([&] {
    try {
      outcomes = dist::run_ranks(launch);
    } catch (...) {
      failed = std::current_exception();
    }
    done = true;
  });
  while (!done) {
    progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ranks.join();
  if (failed) std::rethrow_exception(failed);
  auto relay = [&](int rank) {  // without Gloo's own notes on each group it connects ("[Gloo] Rank 0 is ...")
    std::ifstream out(templ + "/rank" + std::to_string(rank) + ".out", std::ios::binary);
    for (std::string line; std::getline(out, line);)
      if (line.rfind("[Gloo] ", 0) != 0) std::cout << line << "\n";
    std::cout << std::flush;
  };
  // The cause: the first rank to end that failed on its own account, not one that failed because a peer
  // was gone (kExitPeerGone), nor one stopped after another's failure.
  const dist::RankOutcome* f = nullptr;
  for (const dist::RankOutcome& o : outcomes)
    if (o.status != dist::RankOutcome::Status::ok && o.status != dist::RankOutcome::Status::stopped_after_failure &&
        !(o.status == dist::RankOutcome::Status::failed && o.code == kExitPeerGone) &&
        (f == nullptr || o.ended < f->ended))
      f = &o;
  if (f == nullptr) f = dist::first_failure(outcomes);
  if (f == nullptr) {
    relay(0);
    return kExitOk;
  }
  if (const int sig = f->outside_signal()) {
    std::cerr << "ckverify bench: cannot run here: rank " << f->rank << " was stopped by signal " << sig << " ("
              << ::strsignal(sig)
              << ") from outside ckverify (a user, a service manager or the kernel's out-of-memory killer); nothing "
                 "was measured"
              << std::endl;
    return kExitUsage;
  }
  if (f->status == dist::RankOutcome::Status::failed && f->code == kExitFailed) {
    // Rank 0's verdict (a plan failed or diverged), or a rank's own supervisor's FAIL line (what the
    // implementation did to the run: a crash, a stall).
    relay(f->rank);
    return kExitFailed;
  }
  if (f->status == dist::RankOutcome::Status::failed && (f->code == kExitUsage || f->code == kExitInternal)) {
    std::string tail = sanitize(f->stderr_tail, 600);
    if (tail.empty() || tail.back() != '\n') tail += '\n';
    std::cerr << tail << std::flush;
    return f->code;
  }
  std::cout << "FAIL: bench (tp=" << c.tp << " dp=" << c.dp << ", impl " << sanitize(c.impl, 200)
            << "): " << sanitize(f->describe(), 600) << std::endl;
  return kExitFailed;
}

bool peer_gone(const std::exception& e) {
  const std::string what = e.what();
  return what.find("gloo") != std::string::npos || what.find("Gloo") != std::string::npos;  // Gloo's own errors
}

}  // namespace

CLI::App* add_bench(CLI::App& app, BenchArgs& a) {
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Per checkpoint plan: peak and kept tensor memory, step time (forward, backward, optimizer), recompute "
      "overhead next to what recomputing alone is expected to cost, tokens/s, loss curves; optionally the growth law, "
      "the largest batch within a "
      "memory budget, and a Markdown report with plots. A Case with tp or dp > 1 runs as its ranks and adds each "
      "pass's collectives per plan, every checkpointed plan also with tpkeep=reduced.");
  add_file(bench, "case", a.case_file, "Case JSON file (or --preset)");
  bench->add_option(
      "--preset", a.preset,
      "seed-lab: seed 001's 20-layer lab and its 14 plans (D=256 on CPU, the seed's D=2048, B=2, S=2048 on CUDA)");
  bench->add_option("--plans", a.plans,
                    std::string("Comma list of plans (") + kPlanSpellings + "); none is always included");
  bench
      ->add_option(
          "--impl", a.impls,
          "Implementations doing the checkpointing, side by side (a comma list, or repeated; default builtin): "
          "every plan runs with each, and each is compared with the first")
      ->allow_extra_args(false);
  bench
      ->add_option("--strategy", a.strategies,
                   "A checkpointing strategy to measure beside the plans (repeatable; as for check --strategy)")
      ->allow_extra_args(false);
  bench
      ->add_option("--verify-cases", a.verify_cases,
                   "Generated Cases the gate runs on every plan and strategy for the verified column (0: none)")
      ->capture_default_str();
  bench->add_option("--only", a.only, "KEY=VALUE: a Case field the verification fixes (repeatable, as for check)")
      ->allow_extra_args(false);
  bench->add_option("--device", a.device, "Device: cpu, cuda or cuda:N")->capture_default_str();
  add_stall_timeout(bench, a.stall_timeout);
  bench->add_option("--warmup", a.warmup, "Steps run before timing")->capture_default_str();
  bench->add_option("--repeats", a.repeats, "Timed rounds at least (every row one step per round; medians over them)")
      ->capture_default_str();
  bench->add_option("--max-repeats", a.max_repeats, "Timed rounds at most, while an interval is wider than --target")
      ->capture_default_str()
      ->each([&a](const std::string&) { a.max_repeats_given = true; });
  bench->add_option("--time-cap", a.time_cap, "Seconds of timed rounds after which no new round starts")
      ->capture_default_str();
  bench
      ->add_option("--target", a.target,
                   "Relative half-width every 95% interval of a time ratio should reach (0.02: +-2%)")
      ->capture_default_str();
  bench->add_option("--threads", a.threads, "Intra-op threads, 1 to 1024 (default: the machine's cores)")
      ->check(CLI::Range(1, 1024));  // only a given value: 0 stays the default's mark
  bench->add_option("--memory-budget", a.budget, "Find each plan's largest batch within this peak (e.g. 512M, 2G)");
  bench->add_flag("--growth", a.growth,
                  "Also measure activation peak against depth (L = 4, 9, 16, 25, 36) for none and sqrt");
  bench->add_flag("--amp", a.amp, "Also run the AMP drift audit on the Case (into the report)");
  bench->add_flag("--as-rank", a.as_rank)->group("");  // set by bench_as_ranks on the ranks it starts
  add_file(bench, "--json", a.json, "Write the results as JSON to this file");
  add_file(bench, "--out", a.out_dir,
           "Write report.md, plots (PNG, through gnuplot), CSV and JSON into this directory");
  return bench;
}

void finish_bench(BenchArgs& a) {
  check_stall_timeout(a.stall_timeout);
  check_count("--warmup", a.warmup, 0, 100);
  // warmup + max_repeats steps stay within a Case's 1000.
  check_count("--repeats", a.repeats, 1, 500);
  check_count("--max-repeats", a.max_repeats, 1, 500);
  if (a.max_repeats_given && a.max_repeats < a.repeats)
    throw UsageError("--max-repeats " + std::to_string(a.max_repeats) + " is below --repeats " +
                     std::to_string(a.repeats) + ": the rounds at most cannot be fewer than the rounds at least");
  a.max_repeats = std::max(a.max_repeats, a.repeats);
  if (!(a.time_cap >= 0 && a.time_cap <= 86400)) throw UsageError("--time-cap must be in [0, 86400] seconds");
  if (!(a.target > 0 && a.target <= 1)) throw UsageError("--target must be in (0, 1] (a relative half-width)");
  if (a.threads < 0 || a.threads > 1024) throw UsageError("--threads must be in [1, 1024]");
  check_count("--verify-cases", a.verify_cases, 0, kMaxRunEveryCase);
  a.memory_budget = a.budget.empty() ? 0 : parse_bytes(a.budget);
}

int run_bench(const BenchArgs& a) {
  if (!a.case_file.empty() && !a.preset.empty()) throw UsageError("give a Case file or --preset, not both");
  if (!a.preset.empty() && a.preset != "seed-lab")
    throw UsageError("--preset \"" + sanitize(a.preset) + "\": known presets: seed-lab");
  std::vector<std::string> specs;
  for (const auto& list : a.impls)
    for (const auto& given : split_impl_list(list)) {
      const std::string spec = absolute_impl_spec(given);  // before anything is loaded (a chdir)
      if (std::find(specs.begin(), specs.end(), spec) != specs.end())
        throw UsageError("--impl " + sanitize(spec, 200) + " is given twice");
      specs.push_back(spec);
    }
  if (specs.empty()) specs.push_back("builtin");
  const std::string impl_text = fmt::format("{}", fmt::join(specs, ","));
  const int cores = machine_cores();
  const int64_t budget = a.memory_budget;
  check_device(a.device);
  // Outputs: --json, and the files under --out, all checked before any work.
  std::vector<std::pair<std::string, FileArg>> outs = {{"--json", a.json}};
  if (!a.out_dir.empty()) {
    struct stat st {};
    if (::lstat(a.out_dir.path.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        throw UsageError("--out \"" + sanitize(a.out_dir.given) + "\" exists and is not a directory");
    } else {
      const std::filesystem::path parent = std::filesystem::path(a.out_dir.given).parent_path();
      if (!std::filesystem::is_directory(std::filesystem::path(a.out_dir.path).parent_path()))
        throw UsageError("--out: the directory " + sanitize(parent.empty() ? "." : parent.string()) +
                         " does not exist");
    }
    if (!report::gnuplot_available())
      throw EnvironmentError("--out writes plots through gnuplot (apt-get install gnuplot-nox), which is not on PATH");
  }
  Case c;
  if (!a.preset.empty()) {
    c = seed_lab_case(a.device);
  } else if (!a.case_file.empty()) {
    c = load_case_argument(a.case_file.given);  // (nothing is loaded yet that could have changed directory)
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
  const std::string only = parse_only(a.only);
  std::vector<std::pair<std::string, std::string>> strategies;  // label, impl spec
  for (const auto& s : a.strategies) {
    const std::string spec = absolute_impl_spec(strategy_spec(s));
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
    for (const auto& f : bench_report_files(a.growth, a.amp)) outs.emplace_back("--out", inside(a.out_dir, f));
  bool created = false;
  if (!a.out_dir.empty() && !std::filesystem::exists(a.out_dir.path)) {
    std::error_code ec;
    created = std::filesystem::create_directory(a.out_dir.path, ec);
    if (ec) throw UsageError("--out: cannot create " + sanitize(a.out_dir.given) + ": " + ec.message());
  }
  try {
    check_outputs(outs, {{"the case file", a.case_file.path}});
  } catch (...) {
    if (created) ::rmdir(a.out_dir.path.c_str());
    throw;
  }
  // Made again when the report is written: a run stopped before then (a signal, a failure) leaves no
  // empty directory behind.
  if (created) ::rmdir(a.out_dir.path.c_str());

  // A Case with tp or dp > 1 runs as its ranks (the same command with --as-rank), each with its share of
  // the cores.
  const bool as_ranks = c.ranks() > 1;
  const int threads = a.threads > 0 ? a.threads : std::max(1, cores / c.ranks());
  std::shared_ptr<dist::Group> world;
  std::unique_ptr<ParallelRun> par;
  if (as_ranks) {
    if (a.growth || budget > 0 || a.amp)
      throw UsageError("tp=" + std::to_string(c.tp) + " dp=" + std::to_string(c.dp) +
                       ": --growth, --memory-budget and --amp are not measured on a Case that runs as ranks");
    if (!a.as_rank) return bench_as_ranks(a, c);
    dist::RankEnv env;
    try {
      env = dist::RankEnv::from_environment();
    } catch (const std::exception& e) {
      throw UsageError(std::string("--as-rank is for the ranks ckverify starts itself (") + e.what() + ")");
    }
    // A rank waits in a collective while a peer runs its step of a row: the timeout is a step's, long.
    world = dist::Group::join({env.store, env.rank, env.world, std::chrono::seconds(120)});
    par = std::make_unique<ParallelRun>(world, c);
  }
  // LibTorch's OpenMP runtime ends the process when it cannot start its threads: find out first.
  ensure_threads_start(threads);
  torch::set_num_threads(threads);
  // LibTorch's CPU allocator is malloc: let it keep what it frees (as CUDA's caching allocator does)
  // instead of returning large blocks to the kernel and faulting fresh pages in every step, which
  // otherwise dominates the step time of the plans that allocate most and makes timings noisy.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  BenchOptions o;
  o.warmup = a.warmup, o.repeats = a.repeats, o.max_repeats = a.max_repeats, o.memory_budget = budget;
  o.time_cap_s = a.time_cap, o.target = a.target, o.growth = a.growth;
  o.par = par.get();
  for (const auto& [label, spec] : strategies)
    o.strategies.push_back({label, [spec = spec] { return make_impl(spec); }});
  const bool tty = stderr_is_terminal();  // this runs supervised, its stderr a pipe
  o.progress = [tty](const std::string& s) {
    if (tty) std::cerr << "\r\033[K" << s << std::flush;
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<BenchImpl> bench_impls;
  for (const auto& spec : specs) bench_impls.push_back({spec, [spec = spec] { return make_impl(spec); }});
  BenchResult r;
  try {
    r = ckv::run_bench(c, plans, bench_impls, o);
  } catch (const EnvironmentError&) {
    throw;
  } catch (const std::exception& e) {
    if (!par) throw;
    // On ranks a row that fails on one rank cannot go on there (its peers wait in its collectives): this
    // rank ends the bench now, and the launcher stops the others.
    if (peer_gone(e)) return kExitPeerGone;
    std::cout << "FAIL: rank " << par->rank() << ": " << sanitize(e.what(), 600) << std::endl;
    return kExitFailed;
  }
  if (par && par->rank() != 0) return kExitOk;  // rank 0 speaks for the ranks
  if (a.verify_cases > 0 && !as_ranks) {
    // Correctness beside cost: the gate on every plan (with --impl) and every strategy.
    torch::set_num_threads(1);
    for (PlanBench& p : r.plans) {
      if (p.plan == "none") continue;
      o.progress("verifying " + p.plan + (p.impl.empty() ? "" : " (" + p.impl + ")"));
      const auto st =
          std::find_if(strategies.begin(), strategies.end(), [&](const auto& e) { return e.first == p.plan; });
      p.verified =
          p.impl.empty() && st != strategies.end()
              ? bench_verdict(st->second, std::nullopt, true, a.verify_cases, only, a.device, &p.verified_detail)
              : bench_verdict(p.impl, parse_plan("bench", p.plan), false, a.verify_cases, only, a.device,
                              &p.verified_detail);
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
                   "s)\ncase: {} (steps: the warmup and timed rounds, whatever the Case file says)\n",
                   impl_text, a.device, threads, a.warmup, a.repeats, a.max_repeats, 100.0 * a.target, secs,
                   r.case_line)
            << bench_table(r);
  if (as_ranks && a.verify_cases > 0)
    std::cout << fmt::format(
        "verified: not run here (a Case that runs as ranks): gate the plans with `ckverify check "
        "--only tp={} --only dp={} --plan PLAN`\n",
        c.tp, c.dp);
  if (amp)
    std::cout << fmt::format("\nAMP audit (plan {}): {}\n", amp->plan,
                             amp->exceeded.empty() && amp->failed.empty() ? "checkpoint drift within its allowance"
                                                                          : "checkpoint drift exceeds its allowance");
  if (!a.json.empty()) write_atomically(a.json, bench_json(r, impl_text, a.device, threads).dump(2) + "\n");
  if (!a.out_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(a.out_dir.path) && !std::filesystem::create_directory(a.out_dir.path, ec))
      throw EnvironmentError("--out: cannot create " + sanitize(a.out_dir.given) + ": " +
                             (ec ? ec.message() : std::string("it exists and is not a directory")));
    write_bench_report(a.out_dir, r, amp ? &*amp : nullptr, impl_text, a.device, threads, a.command);
    std::cout << "report: " << a.out_dir.given << "/report.md\n";
  }
  std::vector<std::string> failed;
  auto row = [](const PlanBench& p) { return p.impl.empty() ? p.plan : p.plan + " (" + p.impl + ")"; };
  for (const PlanBench& p : r.plans)
    if (!p.completed) failed.push_back(row(p) + ": " + p.error);
  for (const PlanBench& p : r.plans)
    if (p.verified.rfind("FAILED", 0) == 0) failed.push_back(row(p) + ": the gate " + p.verified);
  if (!failed.empty()) {
    std::cout << "FAIL: plan " << failed.front()
              << (failed.size() > 1 ? fmt::format(" (and {} more failed row(s), above)", failed.size() - 1) : "")
              << std::endl;
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
  std::cout << "PASS: every plan completed and trained exactly as none did"
            << (a.verify_cases == 0 ? " (not gated: --verify-cases 0)"
                : as_ranks          ? " (not gated here: a Case that runs as ranks)"
                                    : "")
            << std::endl;
  return kExitOk;
}

}  // namespace ckv::cli
