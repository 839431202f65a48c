// verifier/checkpoint.cpp: see checkpoint.hpp. One custom autograd Function; its non-tensor state
// (fn, saved RNG and autocast state, version counters) travels in the node's saved_data as a capsule.
#include "verifier/checkpoint.hpp"

#include <torch/cuda.h>

#include <stdexcept>
#include <string>

#include "verifier/compat.hpp"

namespace ckv {
namespace {

// The state of every generator a segment can draw from: the CPU one and each CUDA device's.
struct RngSnapshot {
  torch::Tensor cpu;
  std::vector<torch::Tensor> cuda;  // index = device index

  static RngSnapshot capture() {
    RngSnapshot s;
    {
      at::Generator g = compat::default_generator(torch::Device(torch::kCPU));
      std::lock_guard<std::mutex> lock(g.mutex());
      s.cpu = g.get_state();
    }
    // Every device, not only those of the inputs: fn may move work to a device of its own choosing.
    const int64_t n = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
    for (int64_t i = 0; i < n; ++i) {
      at::Generator g = compat::default_generator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(g.mutex());
      s.cuda.push_back(g.get_state());
    }
    return s;
  }
  void restore(bool include_cuda = true) const {
    {
      at::Generator g = compat::default_generator(torch::Device(torch::kCPU));
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(cpu);
    }
    if (!include_cuda) return;
    for (size_t i = 0; i < cuda.size(); ++i) {
      at::Generator g = compat::default_generator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(cuda[i]);
    }
  }
};

struct CheckpointState : torch::CustomClassHolder {
  MultiSegmentFn fn;
  CheckpointOptions options;
  detail::Breakage breakage;
  RngSnapshot forward_rng;
  compat::AutocastState forward_autocast;
  std::vector<torch::Tensor> inputs;
  std::vector<int64_t> input_versions, param_versions;
};

// Restores RNG (when asked), autocast and grad mode on scope exit, exceptions included.
class GlobalStateGuard {
 public:
  explicit GlobalStateGuard(bool rng)
      : autocast_(compat::AutocastState::current()), grad_(torch::GradMode::is_enabled()) {
    if (rng) rng_ = RngSnapshot::capture(), has_rng_ = true;
  }
  ~GlobalStateGuard() {
    if (armed_) restore();
  }
  GlobalStateGuard(const GlobalStateGuard&) = delete;
  GlobalStateGuard& operator=(const GlobalStateGuard&) = delete;
  void restore() const {
    if (has_rng_) rng_.restore();
    autocast_.apply();
    torch::GradMode::set_enabled(grad_);
  }
  void disarm() { armed_ = false; }

 private:
  RngSnapshot rng_;
  bool has_rng_ = false;
  compat::AutocastState autocast_;
  bool grad_;
  bool armed_ = true;
};

// The recompute differentiates w.r.t. detached copies of the inputs. A detached copy is a leaf, and
// autocast caches its lower-precision cast when the tensor is an fp32 leaf that requires grad: all
// consumers of the input then share one cast, and their gradients meet in bf16/fp16 before being
// cast back, whereas the first forward (where the input was not a leaf) cast per consumer and summed
// in fp32. That shifted gradients by one bf16 ulp. So an input that was not a leaf in the forward is
// handed to fn as a view of its detached copy: not a leaf, not cacheable, exactly like the original.
std::vector<torch::Tensor> detach_like_forward(const std::vector<torch::Tensor>& inputs) {
  std::vector<torch::Tensor> out;
  for (const auto& t : inputs) {
    torch::Tensor d = t.detach();
    if (t.is_floating_point()) d.requires_grad_(t.requires_grad());
    out.push_back(d);
  }
  return out;
}
std::vector<torch::Tensor> recompute_inputs(const std::vector<torch::Tensor>& detached,
                                            const std::vector<torch::Tensor>& originals, bool leaf_fault) {
  if (leaf_fault) return detached;
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < detached.size(); ++i)
    out.push_back(detached[i].requires_grad() && !originals[i].is_leaf() ? detached[i].view_as(detached[i])
                                                                         : detached[i]);
  return out;
}

std::string version_error(const char* what, size_t i, int64_t before, int64_t now) {
  return "checkpoint: " + std::string(what) + " " + std::to_string(i) +
         " was modified in place between the checkpointed forward and its backward (version " + std::to_string(before) +
         " -> " + std::to_string(now) +
         "); recomputing from the new value would give wrong gradients. Clone it before modifying it.";
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                               const c10::intrusive_ptr<CheckpointState>& state) {
    state->inputs.assign(inputs.begin(), inputs.end());
    for (const auto& t : inputs) state->input_versions.push_back(t._version());
    for (const auto& t : params) state->param_versions.push_back(t._version());
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    // Keep the parameters alive and version-checked by autograd too.
    ctx->save_for_backward(std::vector<torch::Tensor>(params.begin(), params.end()));
    // Grad mode is off here (Function::apply); the activations of fn are not kept.
    return state->fn(state->inputs);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const auto& b = state->breakage;
    const auto& inputs = state->inputs;
    if (!b.skip_version_check)
      for (size_t i = 0; i < inputs.size(); ++i)
        if (inputs[i]._version() != state->input_versions[i])
          throw std::runtime_error(version_error("input", i, state->input_versions[i], inputs[i]._version()));
    const std::vector<torch::Tensor> params = ctx->get_saved_variables();
    for (size_t i = 0; i < params.size(); ++i)
      if (!b.skip_version_check && params[i]._version() != state->param_versions[i])
        throw std::runtime_error(version_error("parameter", i, state->param_versions[i], params[i]._version()));

    const bool rng = state->options.preserve_rng;
    GlobalStateGuard guard(rng);
    if (rng) state->forward_rng.restore(/*include_cuda=*/!b.cpu_rng_only);
    torch::Tensor out;
    std::vector<torch::Tensor> detached;
    auto run_fn = [&] {
      detached = detach_like_forward(inputs);
      out = state->fn(recompute_inputs(detached, inputs, b.leaf_inputs));
    };
    if (b.no_restore_on_throw) {
      // Broken on purpose: global state is set by hand and put back only if fn returns normally.
      guard.disarm();
      if (!b.skip_autocast_replay) state->forward_autocast.apply();
      torch::GradMode::set_enabled(true);
      run_fn();
      guard.restore();
    } else {
      for (int pass = 0; pass < (b.recompute_twice ? 2 : 1); ++pass) {
        if (rng && pass > 0) state->forward_rng.restore(!b.cpu_rng_only);
        std::unique_ptr<compat::ScopedAutocastState> ac;
        if (!b.skip_autocast_replay) ac = std::make_unique<compat::ScopedAutocastState>(state->forward_autocast);
        torch::AutoGradMode grad_on(true);
        run_fn();
      }
    }

    std::vector<torch::Tensor> targets;
    std::vector<size_t> target_slot;  // slot in the returned gradient list
    for (size_t i = 0; i < detached.size(); ++i)
      if (detached[i].requires_grad()) targets.push_back(detached[i]), target_slot.push_back(i);
    if (!b.inputs_only_grad)
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].requires_grad()) targets.push_back(params[i]), target_slot.push_back(inputs.size() + i);

    // One gradient per input, one per parameter, and one (undefined) for the state argument.
    torch::autograd::variable_list grads(inputs.size() + params.size() + 1);
    if (!targets.empty() && out.requires_grad()) {
      torch::AutoGradMode grad_on(true);
      const auto g = torch::autograd::grad({out}, targets, {grad_outputs.at(0)}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t k = 0; k < g.size(); ++k) grads[target_slot[k]] = g[k];
    }
    return grads;
  }
};

}  // namespace

namespace detail {
torch::Tensor checkpoint_variant(const MultiSegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                                 const std::vector<torch::Tensor>& params, CheckpointOptions options,
                                 const Breakage& breakage) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  state->breakage = breakage;
  state->forward_autocast = compat::AutocastState::current();
  if (options.preserve_rng) state->forward_rng = RngSnapshot::capture();
  return CheckpointFunction::apply(at::TensorList(inputs), at::TensorList(params), state);
}
}  // namespace detail

torch::Tensor checkpoint(const MultiSegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params, CheckpointOptions options) {
  return detail::checkpoint_variant(fn, inputs, params, options, {});
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& params, CheckpointOptions options) {
  return checkpoint([fn](const std::vector<torch::Tensor>& in) { return fn(in.at(0)); }, {x}, params, options);
}

torch::Tensor checkpoint(torch::nn::Module& module, const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                         const torch::Tensor& x, CheckpointOptions options) {
  return checkpoint(fn, x, module.parameters(), options);
}

}  // namespace ckv
