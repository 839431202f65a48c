// verifier/run/progress.hpp: a process-wide heartbeat. The run stage calls progress() at every
// micro-batch it starts, so that a supervisor (cli/supervise.hpp) can tell a run that is slow from one
// that is hung. With no observer set, progress() does nothing.
#pragma once

namespace ckv {

using ProgressObserver = void (*)();
inline ProgressObserver progress_observer = nullptr;
inline void set_progress_observer(ProgressObserver observer) {
  progress_observer = observer;
}
inline void progress() {
  if (progress_observer) progress_observer();
}

}  // namespace ckv
