// verifier/model/memory.hpp: tensor memory, measured where LibTorch allocates it. LibTorch keeps no peak
// statistic for CPU memory, so ckverify measures it two ways:
//   - on CPU, an allocator put in front of LibTorch's CPU allocator (c10::SetCPUAllocator, once per
//     process) reports every allocation and free, whichever thread makes it: a recompute on a thread the
//     implementation starts itself, a Python thread or an intra-op worker is measured like the rest;
//   - on other devices (CUDA's caching allocator), LibTorch's own memory-reporting hook
//     (c10::MemoryReportingInfoBase under c10::DebugInfoGuard, DebugInfoKind::PROFILER_STATE), which is
//     thread-local: it reaches the thread that installed it and the autograd threads of the backward
//     passes started there, not threads the implementation starts itself (a limit, stated).
//
// Bytes are charged to accounts: one per training run (the baseline and the run under test interleave
// step by step in one process). An allocation goes to the account that is current when it happens; a
// free goes back to the account that allocated it, whichever is current. The current account is
// process-wide (not per thread) so that allocations made on other threads (autograd's device threads,
// an implementation's own) are charged to the run whose step they belong to.
//
// Limits, stated: memory allocated before reporting began, or while no account was current, is
// invisible and its frees are ignored; memory an implementation allocates outside LibTorch's allocators
// (its own malloc, a NumPy array) is not seen.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace ckv {

// RAII: turns reporting on for a scope: the CPU allocator's, process-wide (installed on first use), and
// LibTorch's hook on this thread (and on the autograd threads of backward passes started from it). Nests.
class MemoryReporting {
 public:
  MemoryReporting();
  ~MemoryReporting();
  MemoryReporting(const MemoryReporting&) = delete;
  MemoryReporting& operator=(const MemoryReporting&) = delete;

 private:
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

// One account: the live and peak bytes of the tensors allocated while it was current, on one device
// type.
class MemoryAccount {
 public:
  explicit MemoryAccount(c10::DeviceType device);
  ~MemoryAccount();
  MemoryAccount(const MemoryAccount&) = delete;
  MemoryAccount& operator=(const MemoryAccount&) = delete;

  int64_t live() const;
  int64_t peak() const;  // the largest live value since the last reset_peak()
  void reset_peak();     // peak := live
  // Starts the next epoch (the run stage starts one per training step) and returns the bytes still live
  // that were allocated during the epoch that just ended: what one step carries into the next.
  int64_t next_epoch();
  // The bytes still live that were allocated during the previous epoch.
  int64_t live_from_previous_epoch() const;
  int id() const { return id_; }

 private:
  int id_;
};

// RAII: makes `account` current (nullptr: none) for a scope, and restores the previous one.
class ChargeTo {
 public:
  explicit ChargeTo(const MemoryAccount* account);
  ~ChargeTo();
  ChargeTo(const ChargeTo&) = delete;
  ChargeTo& operator=(const ChargeTo&) = delete;

 private:
  int previous_;
};

}  // namespace ckv
