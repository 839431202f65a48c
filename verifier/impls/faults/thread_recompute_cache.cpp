// verifier/impls/faults/thread_recompute_cache.cpp: recomputes each segment on a helper thread of its
// own (as checkpoints that overlap the recompute with communication, or hand it to a worker pool, do)
// and keeps what that thread recomputed until the step ends. Gradients, RNG, autocast and side effects
// are right: the thread sets up the recompute's state itself. The memory the checkpoint exists to save
// is never given back, and it is allocated on a thread LibTorch's thread-local memory hook does not
// reach: memory-saved must see allocations on every thread (verifier/model/memory.hpp).
#include <exception>
#include <thread>

#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/stash_impl.hpp"

namespace ckv::faults {
namespace {
struct ThreadFrame : checkpoint_detail::RecomputeFrame {
  ThreadFrame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions options, Stash stash)
      : RecomputeFrame(std::move(fn), std::move(args), options), stash_(std::move(stash)) {}
  void recompute() override {
    std::exception_ptr error;
    std::thread helper([&] {
      try {
        RecomputeFrame::recompute();
        stash_->insert(stash_->end(), collected_.begin(), collected_.end());  // "for a second backward"
      } catch (...) {
        error = std::current_exception();
      }
    });
    helper.join();
    if (error) std::rethrow_exception(error);
  }
  Stash stash_;
};
}  // namespace
ImplEntry thread_recompute_cache() {
  return {{"thread-recompute-cache",
           "recomputes on a helper thread and keeps what it recomputed until the step ends: saves no memory",
           "memory-saved", "a plan that checkpoints a segment whose recompute outweighs the boundaries kept"},
          [] { return std::make_unique<StashImpl<ThreadFrame>>(); }};
}
}  // namespace ckv::faults
