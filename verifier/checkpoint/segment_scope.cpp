// verifier/checkpoint/segment_scope.cpp: see segment_scope.hpp. Thread-local, like grad mode: a
// recompute runs on the thread that executes the backward node (a device thread for CUDA).
#include "verifier/checkpoint/segment_scope.hpp"

namespace ckv {
namespace {
thread_local SegmentState* g_state = nullptr;
thread_local bool g_recomputing = false;
}  // namespace

SegmentScope::SegmentScope(SegmentState& state, bool recomputing)
    : previous_state_(g_state), previous_recomputing_(g_recomputing) {
  g_state = &state;
  g_recomputing = recomputing;
}

SegmentScope::~SegmentScope() {
  g_state = previous_state_;
  g_recomputing = previous_recomputing_;
}

bool is_recomputing() {
  return g_recomputing;
}

SegmentState* current_segment() {
  return g_state;
}

}  // namespace ckv
