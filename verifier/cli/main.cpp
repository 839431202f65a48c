// verifier/cli/main.cpp: the `ckverify` command, the CI gate: its subcommands wired together, each in a
// file of its own:
//   check      cmd_check      run the properties over generated Cases against an implementation; shrink
//                             any failure
//   repro      cmd_repro      replay one Case file deterministically and print the same diagnosis
//   faults     cmd_faults     run the gate against every fault injector: the killing property and
//                             cases-to-kill table
//   merge      cmd_merge      combine the --json reports of the shards of one check run
//   list, case cmd_list_case  the properties, implementations and Case fields; a Case line as a Case file
//   train      cmd_train      train one Case to a position, saving or resuming its training state
//   audit-amp  cmd_audit_amp  the AMP drift audit
//   bench      cmd_bench      per-plan memory, time and loss curves
//   worker     cmd_worker     the worker process of check, repro and faults (hidden)
//   rank       rank_case      one rank of a Case with tp > 1 (hidden)
// Each command's options go into its own struct (add_*); what the command line alone decides is checked
// (finish_*) before anything is read or loaded, and before a supervised command forks; then it runs
// (run_*). The options several commands share are parsed in args.hpp.
// Exit codes: 0 every property held; 1 a property failed (or nothing was verified); 2 bad usage, bad
// input, or a Case this machine cannot run; 3 internal error.
#include <CLI/CLI.hpp>

#include <csignal>
#include <functional>
#include <iostream>

#include "verifier/case/environment_error.hpp"
#include "verifier/cli/args.hpp"
#include "verifier/cli/cmd_audit_amp.hpp"
#include "verifier/cli/cmd_bench.hpp"
#include "verifier/cli/cmd_check.hpp"
#include "verifier/cli/cmd_faults.hpp"
#include "verifier/cli/cmd_list_case.hpp"
#include "verifier/cli/cmd_merge.hpp"
#include "verifier/cli/cmd_repro.hpp"
#include "verifier/cli/cmd_train.hpp"
#include "verifier/cli/cmd_worker.hpp"
#include "verifier/cli/rank_case.hpp"
#include "verifier/cli/supervise.hpp"
#include "verifier/cli/version.hpp"
#include "verifier/run/state.hpp"

namespace {
using namespace ckv;
using namespace ckv::cli;

// Every error a command raises, as its one line and exit code.
int guarded(const std::function<int()>& body) {
  try {
    return body();
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
}

// train, bench and audit-amp run the implementation in this process's forked child (supervise.hpp);
// check, repro and faults run it in workers (workers.hpp).
int supervised(const char* name, double stall_timeout, const std::function<int()>& body) {
  try {
    return supervise({name, stall_timeout}, [&] { return guarded(body); });
  } catch (const std::exception& e) {
    std::cerr << "ckverify: cannot run here: " << sanitize(e.what(), 300) << std::endl;
    return kExitUsage;
  }
}

}  // namespace

// main's body: also what a rank forked by a worker's rank fork server runs (workers.hpp).
static int ckverify_main(int argc, char** argv) {
  CLI::App app{
      "ckverify: correctness gate for activation checkpointing (LibTorch vs a non-checkpointed run and an Eigen fp64 "
      "reference).\nExit codes: 0 all properties held, 1 a property failed, 2 bad usage, bad input or a case this "
      "machine cannot run, 3 internal error."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ckverify ") + version() + " (LibTorch " + TORCH_VERSION + ")",
                       "Print ckverify's version (VERSION+COMMIT) and LibTorch's, and exit");
  CheckArgs check;
  ReproArgs repro;
  FaultsArgs faults;
  MergeArgs merge;
  WorkerArgs worker;
  RankArgs rank;
  CaseArgs case_args;
  TrainArgs train;
  AuditAmpArgs audit;
  BenchArgs bench;
  CLI::App* const check_cmd = add_check(app, check);
  CLI::App* const repro_cmd = add_repro(app, repro);
  CLI::App* const faults_cmd = add_faults(app, faults);
  CLI::App* const merge_cmd = add_merge(app, merge);
  CLI::App* const worker_cmd = add_worker(app, worker);
  CLI::App* const rank_cmd = add_rank(app, rank);
  CLI::App* const list_cmd = add_list(app);
  CLI::App* const case_cmd = add_case(app, case_args);
  CLI::App* const train_cmd = add_train(app, train);
  CLI::App* const audit_cmd = add_audit_amp(app, audit);
  CLI::App* const bench_cmd = add_bench(app, bench);
  bench.command = command_line(argc, argv);
  bench.args.assign(argv + 1, argv + argc);

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

  const int checked = guarded([&] {
    check_invocation(app);
    if (*check_cmd) finish_check(check);
    if (*repro_cmd) finish_repro(repro);
    if (*faults_cmd) finish_faults(faults);
    if (*train_cmd) finish_train(train);
    if (*audit_cmd) finish_audit_amp(audit);
    if (*bench_cmd) finish_bench(bench);
    return kExitOk;
  });
  if (checked != kExitOk) return checked;

  if (*worker_cmd) return guarded([&] { return run_worker(worker, ckverify_main); });
  if (*rank_cmd) return guarded([&] { return run_rank(rank); });
  if (*check_cmd) return guarded([&] { return run_check(check); });
  if (*repro_cmd) return guarded([&] { return run_repro(repro); });
  if (*faults_cmd) return guarded([&] { return run_faults(faults); });
  if (*merge_cmd) return guarded([&] { return run_merge(merge); });
  if (*list_cmd) return guarded(run_list);
  if (*case_cmd) return guarded([&] { return run_case(case_args); });
  if (*train_cmd) return supervised("train", train.stall_timeout, [&] { return run_train(train); });
  if (*audit_cmd) return supervised("audit-amp", audit.stall_timeout, [&] { return run_audit_amp(audit); });
  if (*bench_cmd) return supervised("bench", bench.stall_timeout, [&] { return run_bench(bench); });
  return kExitUsage;
}

int main(int argc, char** argv) {
  return ckverify_main(argc, argv);
}
