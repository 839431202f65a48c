// verifier/impls/faults/resume_savers.cpp: the resume faults. The checkpoint is the builtin; what is
// broken is the training-state saver of the resume experiment (verifier/run/state.hpp, StateFault),
// each forgetting one piece of state that real training stacks have forgotten. The five share one file
// because each is one line of catalogue: the broken saving lives in Trainer::save_state.
#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {
namespace {
ImplEntry saver(const char* name, const char* what, const char* exposed, StateFault f) {
  ImplEntry e{{name, what, "resume", exposed}, [] { return make_builtin(); }};
  e.info.state_fault = f;
  return e;
}
}  // namespace
ImplEntry resume_no_rng() {
  return saver("resume-no-rng", "the state file lacks the generator states: the resumed run redraws from the seed",
               "resume>0 with dropout or fx=noise after the save", StateFault::no_rng);
}
ImplEntry resume_rng_before() {
  return saver("resume-rng-before",
               "saves the generators as they were before the last step instead of at the save: draws repeat",
               "resume>0 with dropout or fx=noise after the save", StateFault::rng_before);
}
ImplEntry resume_no_optimizer() {
  return saver("resume-no-optimizer", "the state file lacks Adam's moments and step counts: Adam restarts",
               "resume>0 with opt=adam", StateFault::no_optimizer);
}
ImplEntry resume_no_running_stats() {
  return saver("resume-no-running-stats", "the state file lacks BatchNorm's running statistics: they restart",
               "resume>0 with fx=bn", StateFault::no_running_stats);
}
ImplEntry resume_no_accumulation() {
  return saver("resume-no-accumulation",
               "saves the step's start as the position inside a step: its first micro-batches run again, under "
               "other draws, and count twice in the counters",
               "resume inside a step (resume % micro != 0) with dropout or fx=counter, log, noise",
               StateFault::no_accumulation);
}
ImplEntry resume_no_tracker() {
  ImplEntry e = saver("resume-no-tracker",
                      "the state file lacks the model-parallel RNG tracker's streams: the resumed ranks redraw the "
                      "masks inside the tensor-parallel regions from the seed",
                      "tp>1, resume>0 with dropout inside a region after the save", StateFault::no_streams);
  e.info.case_fields = "tp=2 steps=2 resume=1";
  return e;
}
}  // namespace ckv::faults
