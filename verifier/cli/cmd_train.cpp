// verifier/cli/cmd_train.cpp: see cmd_train.hpp.
#include "verifier/cli/cmd_train.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <optional>

#include "verifier/case/environment_error.hpp"
#include "verifier/cli/args.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/run.hpp"
#include "verifier/run/state.hpp"

namespace ckv::cli {

CLI::App* add_train(CLI::App& app, TrainArgs& a) {
  CLI::App* train = app.add_subcommand(
      "train",
      "Train one Case (its impl and plan) to a position, saving or resuming its training state; prints the "
      "losses and a digest of the whole state.");
  train->add_option("case", a.case_path, "Case JSON file")->required();
  train->add_option("--until", a.until, "Stop after this many micro-batches (default: the end: steps x micro)")
      ->each([&a](const std::string&) { a.until_given = true; });
  add_file(train, "--save", a.save, "Write the training state there at the end (format: verifier/run/state.hpp)");
  train->add_option("--resume", a.resume, "Start from this state file (saved from the same Case)");
  add_stall_timeout(train, a.stall_timeout);
  return train;
}

void finish_train(TrainArgs& a) {
  check_stall_timeout(a.stall_timeout);
  if (a.until_given && a.until < 0) throw UsageError("--until must be >= 0");
}

int run_train(const TrainArgs& a) {
  const std::string &path = a.case_path, &resume = a.resume;
  const FileArg& save = a.save;
  const int until = a.until;
  Case c = load_case_argument(path);
  check_impl_spec(c.impl);
  check_outputs({{"--save", save}}, {{"the case file", path}, {"--resume", resume}});
  // The state file is read before the implementation is loaded: its code may change the working directory.
  std::optional<TrainingState> state;
  if (!resume.empty()) state = load_state_file(resume, c);
  const std::unique_ptr<CheckpointImpl> impl = make_impl(c.impl);
  TrainingRun run(c, impl.get());
  if (state) {
    run.load(*state);
    state.reset();  // (it may be large)
  }
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
    if (is_out_of_memory(e))
      throw EnvironmentError("the run ran out of memory at micro-batch " + std::to_string(run.position()) + " (" +
                             sanitize(std::string(e.what()).substr(0, std::string(e.what()).find('\n')), 300) +
                             "): give it more memory");
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
    std::cout << "saved the state at micro-batch " << run.position() << " to " << sanitize(save.given) << "\n";
  }
  std::cout << fmt::format("position {}/{} digest {}", run.position(), run.end(), run.digest()) << std::endl;
  return kExitOk;
}

}  // namespace ckv::cli
