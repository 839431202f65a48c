// verifier/model/memory.hpp: tensor memory, measured where LibTorch allocates it. LibTorch keeps no peak
// statistic for CPU memory, so ckverify installs LibTorch's own memory-reporting hook
// (c10::MemoryReportingInfoBase under c10::DebugInfoGuard, DebugInfoKind::PROFILER_STATE): the CPU
// allocator and CUDA's caching allocator report every allocation and free to it, with the pointer, the
// size and the device. The same code therefore measures CPU and CUDA runs.
//
// Bytes are charged to accounts: one per training run (the baseline and the run under test interleave
// step by step in one process). An allocation goes to the account that is current when it happens; a
// free goes back to the account that allocated it, whichever is current. The current account is
// process-wide (not per thread) so that allocations made on autograd's device threads, which LibTorch
// hands the hook to, are charged to the run whose backward they belong to.
//
// Limits, stated: (1) allocations made inside intra-op worker threads (at::parallel_for bodies) are not
// reported by LibTorch, neither the allocation nor its free; kernels allocate their outputs before
// parallelising, so this misses only scratch buffers that die inside the kernel. (2) Memory allocated
// before the reporter was installed is invisible; its frees are ignored.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace ckv {

// RAII: installs the memory-reporting hook on this thread (and, through LibTorch's thread-local
// state, on the autograd threads of backward passes started from it). Nests.
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
