// example_checkpoint.cpp: an activation checkpoint written from public LibTorch APIs, packaged as a
// ckverify plugin. Copy it as the starting point of your own.
//
// Built a second time with EXAMPLE_BUG_71124 defined (libexample_buggy.so): ONE deliberate bug, marked
// BUG below, for seeing what ckverify reports. It is pytorch/pytorch issue 71124, "Activation
// checkpointing breaks bfloat16 AMP" (fixed by PR 71169): the reentrant checkpoint's backward re-entered
// autocast when the forward had it on, but with the device's *default* autocast dtype (float16 on CUDA),
// so a forward run under bfloat16 autocast was recomputed under float16. Here the buggy build keeps the
// forward's enabled flags but takes each device's default dtype (bfloat16 on CPU, float16 on CUDA): on
// CPU it shows with prec=fp16; on CUDA with prec=bf16.
//
// The mechanism is the reentrant one (torch.utils.checkpoint(use_reentrant=True)), as a custom
// torch::autograd::Function:
//   forward : run the segment with grad disabled, so autograd keeps none of its activations; keep only
//             the inputs, the random generators' states and the autocast state it ran under.
//   backward: reinstall those generator states and that autocast state, run the segment again with
//             grad enabled (the "recompute"), backpropagate through the fresh graph (a nested
//             backward: the parameters' gradients go straight into their .grad), put everything back,
//             and hand the inputs' gradients to the outer backward.
// Departures from the Python reentrant checkpoint, each fixing one of its known limitations:
//   - a dummy input that requires grad makes the outputs require grad when the parameters do but no
//     tensor input does (a frozen block-stack input, LoRA-style training);
//   - backward asks the running graph task which parameters it accumulates, so a gradient penalty's
//     autograd::grad w.r.t. x (create_graph) does not leak into the parameters' .grad;
//   - under create_graph the recompute runs on the real inputs, so the input gradients it returns stay
//     differentiable w.r.t. them (double backward through the segment);
//   - the recompute uses autocast's cast cache as the forward did (see ReplayForward).
// Limitations left, inherent to nested backwards: a gradient hook on a parameter runs once per nested
// backward, so once per path for a parameter that also gets gradient from elsewhere (weights shared
// across segments, a gradient penalty); and autograd::grad w.r.t. a parameter gets nothing from the
// segment. Use a non-reentrant design (saved-tensor hooks) where those matter.
#include <ckverify/plugin.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autocast is thread-local state per device type; these are the two a LibTorch run can use here.
constexpr c10::DeviceType kAutocastDevices[] = {c10::DeviceType::CPU, c10::DeviceType::CUDA};

struct AutocastState {
  bool enabled[2] = {false, false};
  at::ScalarType dtype[2] = {at::kBFloat16, at::kHalf};
  bool cache = true;

  static AutocastState current() {
    AutocastState s;
    for (int i = 0; i < 2; ++i) {
      s.enabled[i] = at::autocast::is_autocast_enabled(kAutocastDevices[i]);
      s.dtype[i] = at::autocast::get_autocast_dtype(kAutocastDevices[i]);
    }
    s.cache = at::autocast::is_autocast_cache_enabled();
    return s;
  }
  void install() const {
    for (int i = 0; i < 2; ++i) {
      at::autocast::set_autocast_enabled(kAutocastDevices[i], enabled[i]);
      at::autocast::set_autocast_dtype(kAutocastDevices[i], dtype[i]);
    }
    at::autocast::set_autocast_cache_enabled(cache);
  }
};

// Autocast caches the low-precision cast of every leaf that requires grad (the weights, and the
// block-stack input x): all uses of a weight in a forward share one cast, whose gradient is summed in
// low precision. The first forward runs under no-grad, where a cached cast would have no graph and a
// weight shared with code outside the segment would lose its gradient through it: no cache there.
struct AutocastCacheOff {
  bool was = at::autocast::is_autocast_cache_enabled();
  AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(false); }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was); }
};

// Every generator a segment may draw from: the CPU one, the default one of each CUDA device, and those
// the call names besides (a model-parallel RNG tracker's streams, SegmentCall::generators).
std::vector<at::Generator> generators(const std::vector<at::Generator>& shown) {
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator()};
  if (at::hasCUDA()) {
    for (size_t i = 0; i < at::getNumGPUs(); ++i)
      gens.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i))));
  }
  gens.insert(gens.end(), shown.begin(), shown.end());
  return gens;
}
std::vector<at::Tensor> get_states(std::vector<at::Generator>& gens) {
  std::vector<at::Tensor> states;
  for (auto& g : gens) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());
  }
  return states;
}
void set_states(std::vector<at::Generator>& gens, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < gens.size(); ++i) {
    std::lock_guard<std::mutex> lock(gens[i].mutex());
    gens[i].set_state(states[i]);
  }
}

// What one checkpointed call keeps from its forward for its recomputes (one per call, never per
// segment: with several micro-batches in flight each call has its own random draws).
struct Segment : torch::CustomClassHolder {
  ckv::SegmentFunction fn;
  std::vector<c10::IValue> args;     // fn's arguments, tensors replaced by None (they are saved variables)
  std::vector<size_t> tensor_pos;    // where the tensors go back
  std::vector<at::Tensor> params;    // every parameter fn reads
  std::vector<at::Generator> shown;  // the generators the call names besides the defaults
  ckv::SegmentState state;           // shared by the forward and the recomputes (segment_scope.hpp)
  std::vector<at::Tensor> rng;       // generator states just before the forward ran fn
  AutocastState autocast;            // autocast state the forward ran fn under

  std::vector<c10::IValue> with_tensors(const variable_list& tensors) const {
    std::vector<c10::IValue> a = args;
    for (size_t i = 0; i < tensor_pos.size(); ++i) a[tensor_pos[i]] = tensors[i];
    return a;
  }
};

// For the duration of a recompute: the forward's generator states and autocast state, grad enabled;
// afterwards (also when fn throws) the generators, autocast and grad mode as they were, so backward
// leaves the random stream where it found it. The recompute uses the cast cache as the forward would
// have (shared casts of the weights, so their gradients are summed in the same precision) and, like
// leaving a torch.autocast region, drops it when no autocast region encloses the backward, so no cast
// of a weight outlives the optimizer step that changes the weight.
class ReplayForward {
 public:
  explicit ReplayForward(const Segment& seg)
      : gens_(generators(seg.shown)), rng_(get_states(gens_)), autocast_(AutocastState::current()) {
    set_states(gens_, seg.rng);
#ifndef EXAMPLE_BUG_71124
    seg.autocast.install();
#else
    // BUG (pytorch/pytorch#71124): re-enters autocast as the forward had it, but with the device's
    // default dtype instead of the forward's. The fix is seg.autocast.install() unchanged.
    AutocastState replayed = seg.autocast;
    replayed.dtype[0] = at::kBFloat16;  // CPU autocast's default dtype
    replayed.dtype[1] = at::kHalf;      // CUDA autocast's default dtype
    replayed.install();
#endif
    at::autocast::increment_nesting();
  }
  ~ReplayForward() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_states(gens_, rng_);
    autocast_.install();
  }
  ReplayForward(const ReplayForward&) = delete;
  ReplayForward& operator=(const ReplayForward&) = delete;

 private:
  std::vector<at::Generator> gens_;
  std::vector<at::Tensor> rng_;
  AutocastState autocast_;
  at::AutoGradMode grad_{true};
};

// Whether the running backward accumulates into this parameter's .grad: a plain backward() accumulates
// into every leaf; autograd::grad (a gradient penalty's dloss/dx) and backward(inputs=...) only into
// those they were asked for, which the graph task's exec_info marks as needed.
bool outer_pass_accumulates(const at::Tensor& param) {
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info == nullptr || exec_info->empty()) return true;
  const auto acc = torch::autograd::impl::try_get_grad_accumulator(param);
  const auto it = acc ? exec_info->find(acc.get()) : exec_info->end();
  return it != exec_info->end() && it->second.needed_;
}

// Inputs: the segment's tensor arguments, then (when some parameter requires grad) the dummy.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Segment> seg) {
    // Function::apply runs forward with grad disabled: fn builds no graph and keeps no activations.
    const size_t num_args = seg->tensor_pos.size();
    auto gens = generators(seg->shown);
    seg->rng = get_states(gens);
    seg->autocast = AutocastState::current();
    variable_list args(inputs.begin(), inputs.begin() + num_args);
    variable_list outputs;
    {
      AutocastCacheOff no_cache;
      ckv::SegmentScope scope(seg->state, /*recomputing=*/false);
      outputs = seg->fn(seg->with_tensors(args));
    }
    // Saved variables carry a version check: an input or parameter modified in place before backward
    // makes get_saved_variables() throw instead of recomputing from the wrong values.
    variable_list to_save = args;
    to_save.insert(to_save.end(), seg->params.begin(), seg->params.end());
    ctx->save_for_backward(to_save);
    ctx->saved_data["segment"] = c10::IValue::make_capsule(seg);
    ctx->saved_data["num_inputs"] = static_cast<int64_t>(inputs.size() + 1);
    ctx->set_materialize_grads(false);  // an unused output gets no gradient: skip it, don't backprop zeros
    variable_list integral;
    for (const auto& out : outputs)
      if (out.defined() && !at::isFloatingType(out.scalar_type()) && !at::isComplexType(out.scalar_type()))
        integral.push_back(out);
    ctx->mark_non_differentiable(integral);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto seg = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data.at("segment").toCapsule());
    const variable_list saved = ctx->get_saved_variables();  // throws if modified in place
    const size_t num_args = seg->tensor_pos.size();
    // The engine runs backward with grad enabled exactly when the outer call asked for create_graph.
    const bool create_graph = at::GradMode::is_enabled();

    variable_list params;
    for (size_t j = num_args; j < saved.size(); ++j)
      if (saved[j].requires_grad() && outer_pass_accumulates(saved[j])) params.push_back(saved[j]);
    // Where the recompute starts. Normally from fresh leaves cut from the inputs' history, as in
    // Python's reentrant checkpoint: the nested backward must not run into the graph before the
    // segment (it would free it, and count twice any parameter the segment shares with it). The one
    // exception is a create_graph pass that only wants input gradients (a gradient penalty's
    // autograd::grad): it starts from the real inputs, so the gradients it returns stay differentiable
    // w.r.t. them; autograd::grad only captures at the inputs and never runs past them.
    const bool from_real_inputs = create_graph && params.empty();
    // The recompute also sees each input as the forward saw it: a leaf as a leaf (autocast caches its
    // cast, as in the forward, and sums its gradient through that one cast), anything else as a
    // non-leaf view (autocast does not cache it).
    variable_list args(saved.begin(), saved.begin() + num_args);
    std::vector<size_t> wanted;
    variable_list inputs;  // what the gradients are taken w.r.t., one per wanted input
    variable_list outputs;
    {
      ReplayForward replay(*seg);
      ckv::SegmentScope scope(seg->state, /*recomputing=*/true);
      for (size_t i = 0; i < num_args; ++i) {
        if (!args[i].requires_grad() || !ctx->needs_input_grad(i)) {
          args[i] = args[i].detach();
          continue;
        }
        const bool leaf = args[i].is_leaf();
        if (!from_real_inputs) args[i] = args[i].detach().requires_grad_(true);
        const at::Tensor start = args[i];
        if (!leaf) args[i] = args[i].view_as(args[i]);
        // Cut: the fresh leaf, whose .grad the nested backward fills. Real: what fn reads, captured
        // there by autograd::grad (at the view, not the real input, which may carry hooks of its own).
        inputs.push_back(from_real_inputs ? args[i] : start);
        wanted.push_back(i);
      }
      outputs = seg->fn(seg->with_tensors(args));
    }  // generators, autocast and grad mode back as the outer backward had them

    variable_list roots, root_grads;
    for (size_t k = 0; k < outputs.size() && k < grad_outputs.size(); ++k) {
      if (grad_outputs[k].defined() && outputs[k].defined() && outputs[k].requires_grad()) {
        roots.push_back(outputs[k]);
        root_grads.push_back(grad_outputs[k]);
      }
    }

    // One gradient per forward input: the tensor arguments, the dummy if any (always undefined), the
    // Segment (not a tensor: undefined). The parameters get theirs from the nested backward.
    variable_list grads(ctx->saved_data.at("num_inputs").toInt());
    if (roots.empty()) return grads;
    if (from_real_inputs) {
      if (!inputs.empty()) {
        variable_list g =
            torch::autograd::grad(roots, inputs, root_grads, /*retain_graph=*/true, true, /*allow_unused=*/true);
        for (size_t n = 0; n < wanted.size(); ++n) grads[wanted[n]] = g[n];
      }
    } else {
      // One nested pass for both. (Never with empty `inputs`: that would mean "every leaf".)
      variable_list targets = inputs;
      targets.insert(targets.end(), params.begin(), params.end());
      if (!targets.empty())
        torch::autograd::backward(roots, root_grads, /*retain_graph=*/create_graph, create_graph, targets);
      for (size_t n = 0; n < wanted.size(); ++n) grads[wanted[n]] = inputs[n].grad();
    }
    return grads;
  }
};

class ExampleCheckpoint : public ckv::CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const ckv::SegmentCall& call) override {
    // Nothing will ever call backward: no reason to checkpoint.
    if (!at::GradMode::is_enabled()) return call.fn(call.args);

    auto seg = c10::make_intrusive<Segment>();
    seg->fn = call.fn;
    seg->args = call.args;
    seg->params = call.params;
    seg->shown = call.generators;
    variable_list inputs;
    for (size_t i = 0; i < call.args.size(); ++i) {
      if (!call.args[i].isTensor()) continue;
      inputs.push_back(call.args[i].toTensor());
      seg->tensor_pos.push_back(i);
      seg->args[i] = c10::IValue();  // the tensors are saved variables (version-checked), not kept here
    }
    // The parameters are not inputs of the Function: the outer backward would then hand each its
    // (undefined) gradient, running its hooks once more. A dummy leaf that requires grad stands in
    // for them, so the outputs require grad whenever some parameter does.
    const bool trains =
        std::any_of(call.params.begin(), call.params.end(), [](const at::Tensor& p) { return p.requires_grad(); });
    if (trains) inputs.push_back(torch::empty({0}, torch::requires_grad()));
    return CheckpointFunction::apply(at::TensorList(inputs), seg);
  }
};

}  // namespace

CKVERIFY_PLUGIN([](const ckv::PluginOptions& options) -> ckv::CheckpointImpl* {
  if (!options.empty()) throw std::invalid_argument("this example takes no options, got " + options.begin()->first);
  return new ExampleCheckpoint();
})
