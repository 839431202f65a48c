// verifier/run/run.cpp: train() and TrainingRun, one run of the Trainer (trainer.hpp) outside observe.
#include "verifier/run/run.hpp"

#include "verifier/run/trainer.hpp"

namespace ckv {
using namespace run_detail;

RunRecord train(const Case& c, CheckpointImpl* impl, const TrainOptions& options) {
  if (impl && impl->is_strategy()) check_strategy_case(c);
  MemoryReporting reporting;
  const Observations o = prepare(c);
  Trainer t(c, o, impl, Mode::normal, -1);
  t.record_sites(options.record_sites);
  RunRecord r;
  try {
    for (int s = 0; s < c.steps; ++s) r.steps.push_back(t.step(s));
    t.finish(r, nullptr);
  } catch (const std::exception& e) {
    if (is_out_of_memory(e))
      throw EnvironmentError("the run ran out of memory (" + first_line(e.what()) + "): give it more memory");
    t.finish(r, &e);
  }
  return r;
}

struct TrainingRun::Impl {
  Observations o;
  std::unique_ptr<Trainer> t;
  int dp = 1;  // replicas (on ranks): the trainer counts its own micro-batches, dp times fewer
};

TrainingRun::TrainingRun(const Case& c, CheckpointImpl* impl, const ParallelRun* par)
    : impl_(std::make_unique<Impl>()) {
  check_environment(c);
  if (impl && impl->is_strategy()) check_strategy_case(c);
  impl_->o = prepare(c);
  impl_->t = std::make_unique<Trainer>(impl_->o.c, impl_->o, impl, Mode::normal, -1, par);
  impl_->dp = par ? par->dp() : 1;
}
size_t TrainingRun::collectives_issued() const {
  return impl_->t->collectives().size();
}
std::vector<dist::CollectiveRecord> TrainingRun::collectives(size_t from) const {
  std::vector<dist::CollectiveRecord> all = impl_->t->collectives();
  all.erase(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(from, all.size())));
  return all;
}
TrainingRun::~TrainingRun() = default;
int TrainingRun::position() const {
  return impl_->t->position() * impl_->dp;
}
int TrainingRun::end() const {
  return impl_->o.c.steps * impl_->o.c.micro;
}
std::vector<StepRecord> TrainingRun::advance_to(int position) {
  return impl_->t->advance_to(impl_->t->local_position(std::min(position, end())));
}
void TrainingRun::record_sites(bool on) {
  impl_->t->record_sites(on);
}
RunRecord TrainingRun::record(const std::exception* error) {
  RunRecord r;
  impl_->t->finish(r, error);
  return r;
}
TrainingState TrainingRun::state(StateFault fault) const {
  return impl_->t->save_state(fault);
}
void TrainingRun::load(const TrainingState& s) {
  if (s.case_key != state_key(impl_->o.c)) throw StateError("state file: saved from another model or data");
  impl_->t->load_state(s);
}
std::string TrainingRun::digest() const {
  TrainingState s = impl_->t->save_state(StateFault::none);
  s.case_key.clear();
  const std::string bytes = encode_state(s);
  const uint64_t h = fnv1a(bytes.data(), bytes.size());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace ckv
