// verifier/model/memory.cpp: see memory.hpp.
#include "verifier/model/memory.hpp"

#include <torch/csrc/profiler/orchestration/observer.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/macros/Macros.h>
#include <c10/util/Logging.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "verifier/checkpoint/compat.hpp"

namespace ckv {
namespace {

struct AccountState {
  bool open = false;
  c10::DeviceType device = c10::DeviceType::CPU;
  int64_t live = 0, peak = 0;
  int epoch = 0;  // advanced by MemoryAccount::next_epoch (each training step)
};
struct Block {
  int account;
  int64_t bytes;
  int epoch;  // the account's epoch when it was allocated
};

// The ledger every reporter writes into. Account 0 is "none": allocations made while no account is
// current are not counted, and their frees are ignored like those of any unknown block.
struct Ledger {
  std::mutex m;
  std::vector<AccountState> accounts{AccountState{}};
  std::unordered_map<const void*, Block> blocks;
  std::atomic<int> current{0};

  std::atomic<int64_t> tracked{0};  // blocks.size(), read without the lock
  std::atomic<int> reporting{0};    // live MemoryReporting scopes (the CPU allocator reports only inside one)

  void report(const void* ptr, int64_t bytes, c10::Device device) {
    if (bytes > 0 ? current.load() == 0 : tracked.load() == 0) return;  // the common case, lock-free
    std::lock_guard<std::mutex> lock(m);
    if (bytes > 0) {
      const int a = current.load();
      AccountState& s = accounts[static_cast<size_t>(a)];
      if (a == 0 || !s.open || s.device != device.type()) return;  // not counted
      if (blocks.emplace(ptr, Block{a, bytes, s.epoch}).second) tracked.fetch_add(1);
      s.live += bytes, s.peak = std::max(s.peak, s.live);
      return;
    }
    auto it = blocks.find(ptr);
    if (it == blocks.end()) return;  // allocated before reporting began, or while no account was current
    const Block b = it->second;
    blocks.erase(it);
    tracked.fetch_sub(1);
    accounts[static_cast<size_t>(b.account)].live -= b.bytes;
  }
};

Ledger& ledger() {
  static Ledger* l = new Ledger;  // never destroyed: frees can be reported during static destruction
  return *l;
}

// LibTorch's profiler hook is thread-local: it reaches the thread that installed it and the autograd
// threads of the backward passes started there, but not a thread the implementation starts itself
// (a recompute run on a std::thread, a Python thread, an intra-op worker). So on CPU, where every
// tensor is allocated through one process-wide allocator, ckverify puts this allocator in front of
// LibTorch's own: it hands every allocation and free to the ledger, whichever thread makes it. It
// keeps the inner allocator's data pointer and context (so raw_allocate and is_simple_data_ptr keep
// working) and swaps only the deleter for one that reports the free, then calls the inner deleter.
class ReportingCpuAllocator final : public c10::Allocator {
 public:
  static void install() {
    c10::Allocator* inner = c10::GetCPUAllocator();
    if (inner == nullptr || inner->raw_deleter() == nullptr) return;  // nothing we can wrap
    self_ = new ReportingCpuAllocator(inner);                         // never destroyed
    c10::SetCPUAllocator(self_, /*priority=*/1);                      // above LibTorch's default (0)
  }
  // Whether it is LibTorch's CPU allocator now (then it, not the Reporter, reports CPU).
  static bool active() { return self_ != nullptr && c10::GetCPUAllocator() == self_; }
  c10::DataPtr allocate(size_t n) CKV_ALLOCATE_CONST override {
    c10::DataPtr d = inner_->allocate(n);
    void* p = d.get();
    if (p != nullptr && d.get_context() == p && d.compare_exchange_deleter(inner_deleter_, &reporting_delete) &&
        ledger().reporting.load() > 0)
      ledger().report(p, static_cast<int64_t>(n), d.device());
    return d;
  }
  c10::DeleterFnPtr raw_deleter() const override { return &reporting_delete; }
#if CKV_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  explicit ReportingCpuAllocator(c10::Allocator* inner) : inner_(inner) {
    inner_deleter_ = inner->raw_deleter();
  }
  static void reporting_delete(void* p) {
    ledger().report(p, -1, c10::Device(c10::DeviceType::CPU));
    inner_deleter_(p);
  }
  c10::Allocator* inner_;
  static inline c10::DeleterFnPtr inner_deleter_ = nullptr;  // set once, before the first allocation
  static inline ReportingCpuAllocator* self_ = nullptr;
};

// LibTorch reads the PROFILER_STATE slot two ways: the allocators dynamic_cast it to
// MemoryReportingInfoBase (our hook), and profiler checks (profilerEnabled(), getProfilerConfig(), e.g.
// in every Python autograd.Function call) static_cast it to ProfilerStateBase. So the hook is a
// ProfilerStateBase whose profiler is disabled: the profiler checks read "off", the allocators report.
class Reporter : public torch::profiler::impl::ProfilerStateBase {
 public:
  Reporter()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)) {}
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
  void reportMemoryUsage(void* ptr, int64_t alloc_size, compat::MemoryTotal, compat::MemoryTotal,
                         c10::Device device) override {
    if (device.is_cpu() && ReportingCpuAllocator::active()) return;  // it has reported this one
    ledger().report(ptr, alloc_size, device);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

}  // namespace

// While reporting is on, LibTorch's CPU allocator logs a warning ("Memory block of unknown size was
// allocated before the profiling started") when a tensor allocated before it is freed: expected here,
// and noise on a user's terminal. Without glog (the PyPI wheel) c10's own log level silences it for
// the scope; with glog (Debian's 1.13) the line can appear once per process.
struct MemoryReporting::Guard {
  c10::DebugInfoGuard g{c10::DebugInfoKind::PROFILER_STATE, std::make_shared<Reporter>()};
#ifndef C10_USE_GLOG
  int saved_level = FLAGS_caffe2_log_level;
  Guard() {
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);
  }  // 2: errors only
  ~Guard() {
    FLAGS_caffe2_log_level = saved_level;
  }
#endif
};
MemoryReporting::MemoryReporting() {
  static const bool installed = (ReportingCpuAllocator::install(), true);
  (void)installed;
  guard_ = std::make_unique<Guard>();
  ledger().reporting.fetch_add(1);
}
MemoryReporting::~MemoryReporting() {
  ledger().reporting.fetch_sub(1);
}

MemoryAccount::MemoryAccount(c10::DeviceType device) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.m);
  AccountState s;
  s.open = true;
  s.device = device;
  l.accounts.push_back(s);
  id_ = static_cast<int>(l.accounts.size() - 1);
}
MemoryAccount::~MemoryAccount() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.m);
  l.accounts[static_cast<size_t>(id_)].open = false;
  // Blocks still charged to it are forgotten when freed (the account's slot is never reused).
}
int64_t MemoryAccount::live() const {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.m);
  return l.accounts[static_cast<size_t>(id_)].live;
}
int64_t MemoryAccount::peak() const {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.m);
  return l.accounts[static_cast<size_t>(id_)].peak;
}
// The live bytes of account `id` allocated during `epoch` (caller holds the lock).
static int64_t live_in_epoch(const Ledger& l, int id, int epoch) {
  int64_t live = 0;
  for (const auto& [ptr, b] : l.blocks)
    if (b.account == id && b.epoch == epoch) live += b.bytes;
  return live;
}
int64_t MemoryAccount::live_from_previous_epoch() const {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.m);
  return live_in_epoch(l, id_, l.accounts[static_cast<size_t>(id_)].epoch - 1);
}
int64_t MemoryAccount::next_epoch() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.m);
  AccountState& s = l.accounts[static_cast<size_t>(id_)];
  const int64_t carried = live_in_epoch(l, id_, s.epoch);
  ++s.epoch;
  return carried;
}
void MemoryAccount::reset_peak() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.m);
  AccountState& s = l.accounts[static_cast<size_t>(id_)];
  s.peak = s.live;
}

ChargeTo::ChargeTo(const MemoryAccount* account) : previous_(ledger().current.exchange(account ? account->id() : 0)) {}
ChargeTo::~ChargeTo() {
  ledger().current.store(previous_);
}

}  // namespace ckv
