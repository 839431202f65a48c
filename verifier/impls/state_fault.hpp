// verifier/impls/state_fault.hpp: the resume faults' broken training-state savers, named here so that
// the implementation table (registry.hpp) can list them without reaching up into the run stage, whose
// saver (run/state.hpp, TrainingRun::state) applies them.
#pragma once

namespace ckv {

// A deliberately broken saver (the resume faults): what it forgets.
enum class StateFault {
  none,
  no_rng,            // generator states not saved
  rng_before,        // generator states as they were before the last step, not at the save
  no_optimizer,      // optimizer state not saved
  no_running_stats,  // BatchNorm running statistics not saved
  no_accumulation,   // the position inside the step lost: saved as the step's start, so it runs again
  no_streams,        // the model-parallel RNG tracker's streams not saved (tp > 1): they restart from the seed
};

}  // namespace ckv
