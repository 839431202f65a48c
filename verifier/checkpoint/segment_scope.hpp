// verifier/checkpoint/segment_scope.hpp: recompute awareness, for modules whose forward has effects
// besides its outputs (a counter, a log, BatchNorm's running statistics, a cache read later). A
// checkpoint runs a segment's forward twice; such a module must apply its effect once and, in the
// recompute, behave as it did in the first forward. The contract:
//   - a checkpoint implementation wraps the first forward of a segment in a SegmentScope with
//     recomputing=false and each recompute in one with recomputing=true, sharing one SegmentState per
//     checkpointed call (ckverify's builtin does; so does every correct implementation ckverify ships);
//   - a module asks is_recomputing() and skips its effect when it is true;
//   - a module whose behaviour depends on state it changes (a position counter, a cache) stashes what it
//     read in the first forward (current_segment()->stash) and reads it back in the recompute.
// Outside any checkpoint, is_recomputing() is false and current_segment() is null: the module runs as
// it would without checkpointing. Modules whose effect leaves the process (a network write, a file that
// others read as it grows) cannot be made safe this way and must never be checkpointed.
#pragma once

#include <ATen/core/ivalue.h>

#include <map>
#include <string>

namespace ckv {

// What one checkpointed call keeps for the modules inside it, from its first forward to its recomputes.
struct SegmentState {
  std::map<std::string, c10::IValue> stash;
};

class SegmentScope {
 public:
  SegmentScope(SegmentState& state, bool recomputing);
  ~SegmentScope();
  SegmentScope(const SegmentScope&) = delete;
  SegmentScope& operator=(const SegmentScope&) = delete;

 private:
  SegmentState* previous_state_;
  bool previous_recomputing_;
};

// True while a checkpoint recomputes the segment running on this thread.
bool is_recomputing();
// The state of the checkpointed call running on this thread (forward or recompute), or null.
SegmentState* current_segment();

}  // namespace ckv
