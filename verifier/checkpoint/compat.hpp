// verifier/checkpoint/compat.hpp: every LibTorch version difference ckverify depends on, in one place.
// Primary build: PyPI torch 2.x; floor build: Debian libtorch 1.13.1 (cmake/CkvTorch.cmake).
//   - autocast: 2.4 replaced the per-device functions (is_cpu_enabled, set_autocast_gpu_dtype, ...)
//     by device-typed ones (is_autocast_enabled(DeviceType), ...), and deprecated the old names;
//   - CPU autocast to fp16 exists only in newer releases (2.3+);
//   - generators are reached through at::globalContext().defaultGenerator(Device) on both, so no
//     CUDA-specific generator header is needed and the same code compiles with or without CUDA;
//   - c10::Allocator::allocate lost its const and gained copy_data in 2.3 (the CPU reporting allocator);
//   - the running backward call (graph task) has an id from 2.1 on (get_current_graph_task_id); 1.13
//     exposes only its address, which a later call may reuse (the checkpoint also tracks each call's
//     lifetime, so a reused key is never mistaken for the old call).
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/version.h>

#include <cstdint>

namespace ckv::compat {

#define CKV_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

inline constexpr bool kCpuFp16Autocast = CKV_TORCH_AT_LEAST(2, 3);

inline bool autocast_enabled(c10::DeviceType t) {
#if CKV_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(t);
#else
  return t == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}
inline void set_autocast_enabled(c10::DeviceType t, bool on) {
#if CKV_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(t, on);
#else
  if (t == c10::DeviceType::CUDA)
    at::autocast::set_enabled(on);
  else
    at::autocast::set_cpu_enabled(on);
#endif
}
inline at::ScalarType autocast_dtype(c10::DeviceType t) {
#if CKV_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(t);
#else
  return t == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}
inline void set_autocast_dtype(c10::DeviceType t, at::ScalarType d) {
#if CKV_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(t, d);
#else
  if (t == c10::DeviceType::CUDA)
    at::autocast::set_autocast_gpu_dtype(d);
  else
    at::autocast::set_autocast_cpu_dtype(d);
#endif
}

// The autocast state of the two device types ckverify runs on.
struct AutocastState {
  bool cpu_enabled = false, cuda_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  static AutocastState current() {
    return {autocast_enabled(c10::DeviceType::CPU), autocast_enabled(c10::DeviceType::CUDA),
            autocast_dtype(c10::DeviceType::CPU), autocast_dtype(c10::DeviceType::CUDA)};
  }
  void apply() const {
    set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
    set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
    set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
  }
  static void apply_default() { AutocastState{}.apply(); }
  // This state with autocast on device type `t` switched on (to `dtype`) or off.
  AutocastState with(c10::DeviceType t, bool enabled, at::ScalarType dtype) const {
    AutocastState s = *this;
    if (t == c10::DeviceType::CUDA) {
      s.cuda_enabled = enabled;
      if (enabled) s.cuda_dtype = dtype;
    } else {
      s.cpu_enabled = enabled;
      if (enabled) s.cpu_dtype = dtype;
    }
    return s;
  }
  bool operator==(const AutocastState& o) const {
    return cpu_enabled == o.cpu_enabled && cuda_enabled == o.cuda_enabled && cpu_dtype == o.cpu_dtype &&
           cuda_dtype == o.cuda_dtype;
  }
  bool operator!=(const AutocastState& o) const { return !(*this == o); }
};

// The totals c10::MemoryReportingInfoBase::reportMemoryUsage receives: int64_t in 1.x, size_t in 2.x.
#if CKV_TORCH_AT_LEAST(2, 0)
using MemoryTotal = size_t;
#else
using MemoryTotal = int64_t;
#endif

// c10::Allocator: 2.3 made allocate() non-const and added copy_data() (pure virtual; a derived
// allocator may forward it to default_copy_data).
#if CKV_TORCH_AT_LEAST(2, 3)
#define CKV_ALLOCATE_CONST
#define CKV_ALLOCATOR_HAS_COPY_DATA 1
#else
#define CKV_ALLOCATE_CONST const
#define CKV_ALLOCATOR_HAS_COPY_DATA 0
#endif

inline at::Generator default_generator(const c10::Device& d) {
  return at::globalContext().defaultGenerator(d);
}

// The backward call running on this thread, or -1 outside backward.
#if CKV_TORCH_AT_LEAST(2, 1)
inline int64_t current_backward_key() {
  return torch::autograd::get_current_graph_task_id();
}
#else
inline int64_t current_backward_key() {
  const void* task = torch::autograd::get_current_graph_task_exec_info();
  return task ? static_cast<int64_t>(reinterpret_cast<intptr_t>(task)) : -1;
}
#endif

}  // namespace ckv::compat

namespace ckv::compat {
// RAII: installs a whole AutocastState (both device types) for a scope, like `with torch.autocast(...)`
// or a checkpoint recompute, and restores the previous one on exit (exceptions included), clearing the
// cast cache when the outermost autocast scope ends, as Python's context manager does.
class ScopedAutocastState {
 public:
  explicit ScopedAutocastState(const AutocastState& s) : saved_(AutocastState::current()) {
    s.apply();
    at::autocast::increment_nesting();
  }
  ~ScopedAutocastState() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    saved_.apply();
  }
  ScopedAutocastState(const ScopedAutocastState&) = delete;
  ScopedAutocastState& operator=(const ScopedAutocastState&) = delete;

 private:
  AutocastState saved_;
};
}  // namespace ckv::compat
