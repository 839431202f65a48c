// verifier/impls/faults/reentrant.cpp: the reentrant skeleton (reentrant.hpp) and the fault that is
// the skeleton as it is.
#include "verifier/impls/faults/reentrant.hpp"

#include "verifier/checkpoint/frame.hpp"
#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {
namespace {

struct State : torch::CustomClassHolder {
  SegmentFunction fn;
  std::vector<c10::IValue> args;
  std::vector<size_t> tensor_slots;  // which args are the Function's tensor inputs, in order
  ReentrantVariant v;
  std::vector<at::Generator> generators;  // SegmentCall::generators: replayed with the devices' defaults
  RngState rng;
  compat::AutocastState autocast;
  SegmentState segment;                // what modules inside fn keep from the forward for the recompute
  std::vector<torch::Tensor> by_hand;  // params_by_hand: the parameters whose .grad backward adds to
};

class ReentrantFunction : public torch::autograd::Function<ReentrantFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                at::TensorList params, const c10::intrusive_ptr<State>& st) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    ctx->saved_data["inputs"] = static_cast<int64_t>(inputs.size());
    ctx->save_for_backward(std::vector<torch::Tensor>(params.begin(), params.end()));
    const bool cache = at::autocast::is_autocast_cache_enabled();
    if (st->v.guard_cast_cache) at::autocast::set_autocast_cache_enabled(false);
    struct Restore {
      bool cache;
      ~Restore() { at::autocast::set_autocast_cache_enabled(cache); }
    } restore{cache};
    SegmentScope scope(st->segment, /*recomputing=*/false);
    return st->fn(st->args);  // grad mode is off here (Function::apply)
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto st = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    const size_t n_inputs = static_cast<size_t>(ctx->saved_data["inputs"].toInt());
    const std::vector<torch::Tensor> params = ctx->get_saved_variables();
    const bool create_graph = torch::GradMode::is_enabled();
    // What this backward call needs (autograd::grad(loss, x) needs no parameter gradient).
    std::vector<bool> need_input(n_inputs), need_param(params.size());
    bool any_param = false;
    for (size_t k = 0; k < n_inputs; ++k) need_input[k] = ctx->needs_input_grad(k);
    for (size_t i = 0; i < params.size(); ++i) {
      need_param[i] = st->v.differentiate_params && params[i].requires_grad() && ctx->needs_input_grad(n_inputs + i);
      any_param = any_param || need_param[i];
    }
    torch::autograd::variable_list grads(n_inputs + params.size() + 1);  // + the state argument

    // A gradient penalty differentiates the input gradients again, through the inputs' history: they
    // come from a recompute on the inputs themselves (targets: fresh aliases of them, at which the
    // engine stops). Everything else comes from a recompute on detached copies, as torch does: with
    // the inputs' history attached, the engine would follow it to a parameter that is also used before
    // the segment (weights tied across blocks), count that use twice and free graph the outer backward
    // still needs.
    const bool attached = create_graph && !st->v.leaf_inputs;
    if (attached) {
      bool any_input = false;
      for (size_t k = 0; k < n_inputs; ++k) any_input = any_input || need_input[k];
      if (any_input) {
        std::vector<torch::Tensor> inputs;
        const auto outs = recompute(*st, /*detach=*/false, inputs);
        std::vector<torch::Tensor> targets;
        std::vector<size_t> slot;
        for (size_t k = 0; k < inputs.size(); ++k)
          if (need_input[k] && inputs[k].requires_grad()) targets.push_back(inputs[k]), slot.push_back(k);
        differentiate(st->v, outs, grad_outputs, targets, slot, create_graph, grads);
      }
      if (!any_param) return grads;
    }
    std::vector<torch::Tensor> inputs;
    const auto outs = recompute(*st, /*detach=*/true, inputs);
    if (st->v.params_by_hand && params.empty() && !create_graph) {
      std::vector<torch::Tensor> out_sel, grad_sel, targets;
      for (size_t i = 0; i < outs.size() && i < grad_outputs.size(); ++i)
        if (outs[i].requires_grad() && grad_outputs[i].defined())
          out_sel.push_back(outs[i]), grad_sel.push_back(grad_outputs[i]);
      for (const torch::Tensor& t : inputs) targets.push_back(t);
      for (const torch::Tensor& p : st->by_hand) targets.push_back(p);
      std::vector<size_t> differentiable;
      std::vector<torch::Tensor> wrt;
      for (size_t k = 0; k < targets.size(); ++k)
        if (targets[k].requires_grad()) differentiable.push_back(k), wrt.push_back(targets[k]);
      if (out_sel.empty() || wrt.empty()) return grads;
      const auto g = torch::autograd::grad(out_sel, wrt, grad_sel, /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
      torch::NoGradGuard no_grad;
      for (size_t j = 0; j < differentiable.size(); ++j) {
        const size_t k = differentiable[j];
        if (!g[j].defined()) continue;
        if (k < inputs.size()) {
          if (need_input[k]) grads[k] = g[j];
          continue;
        }
        torch::Tensor p = st->by_hand[k - inputs.size()];
        if (p.grad().defined())
          p.mutable_grad().add_(g[j]);
        else
          p.mutable_grad() = g[j].clone();
      }
      return grads;
    }
    if (st->v.nested_backward && params.empty() && !create_graph) {
      std::vector<torch::Tensor> out_sel, grad_sel;
      for (size_t i = 0; i < outs.size() && i < grad_outputs.size(); ++i)
        if (outs[i].requires_grad() && grad_outputs[i].defined())
          out_sel.push_back(outs[i]), grad_sel.push_back(grad_outputs[i]);
      if (!out_sel.empty()) torch::autograd::backward(out_sel, grad_sel);
      for (size_t k = 0; k < inputs.size(); ++k)
        if (need_input[k] && inputs[k].requires_grad()) grads[k] = inputs[k].grad();
      return grads;
    }
    std::vector<torch::Tensor> targets;
    std::vector<size_t> slot;
    if (!attached)
      for (size_t k = 0; k < inputs.size(); ++k)
        if (need_input[k] && inputs[k].requires_grad()) targets.push_back(inputs[k]), slot.push_back(k);
    if (st->v.two_pass && !targets.empty()) {  // the inputs first, keeping the graph for the parameters
      differentiate(st->v, outs, grad_outputs, targets, slot, create_graph, grads, /*retain=*/true);
      targets.clear(), slot.clear();
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (need_param[i]) targets.push_back(params[i]), slot.push_back(n_inputs + i);
    differentiate(st->v, outs, grad_outputs, targets, slot, create_graph, grads);
    return grads;
  }

 private:
  // Runs fn again under the forward's RNG and autocast state. `inputs` receives, per tensor input, what
  // the recompute is differentiated against: a detached copy (detach) or an alias of the input (its
  // history attached). Either is a leaf exactly when the input is (autocast caches the casts of fp32
  // leaves that require grad, so the recompute casts what the forward cast), unless leaf_inputs.
  static std::vector<torch::Tensor> recompute(State& st, bool detach, std::vector<torch::Tensor>& inputs) {
    checkpoint_detail::GlobalStateGuard guard(/*rng=*/true, st.generators);
    st.rng.restore();
    compat::ScopedAutocastState autocast(st.v.replay_autocast ? st.autocast : compat::AutocastState::current());
    torch::AutoGradMode grad_on(true);
    std::vector<c10::IValue> args = st.args;
    for (size_t k = 0; k < st.tensor_slots.size(); ++k) {
      const torch::Tensor& t = st.args[st.tensor_slots[k]].toTensor();
      torch::Tensor target = t, given = t;
      if (detach) {
        target = t.detach();
        if (t.is_floating_point()) target.requires_grad_(t.requires_grad());
        given = target;
      } else if (!t.is_leaf()) {
        target = t.view_as(t);
        given = target;
      }
      if (!st.v.leaf_inputs && !t.is_leaf() && target.requires_grad() && target.is_leaf())
        given = target.clone();  // not a leaf, as in the forward; its gradient reaches target
      args[st.tensor_slots[k]] = given;
      inputs.push_back(target);
    }
    SegmentScope scope(st.segment, /*recomputing=*/true);
    return st.fn(args);
  }

  static void differentiate(const ReentrantVariant& v, const std::vector<torch::Tensor>& outs,
                            const torch::autograd::variable_list& grad_outputs,
                            const std::vector<torch::Tensor>& targets, const std::vector<size_t>& slot,
                            bool create_graph, torch::autograd::variable_list& grads, bool retain = false) {
    std::vector<torch::Tensor> out_sel, grad_sel;
    for (size_t i = 0; i < outs.size() && i < grad_outputs.size(); ++i)
      if (outs[i].requires_grad() && (!v.outputs_with_grad_fn_only || outs[i].grad_fn()) && grad_outputs[i].defined())
        out_sel.push_back(outs[i]), grad_sel.push_back(grad_outputs[i]);
    if (targets.empty() || out_sel.empty()) return;
    torch::AutoGradMode grad_mode(create_graph);
    const auto g =
        torch::autograd::grad(out_sel, targets, grad_sel, /*retain_graph=*/create_graph || retain, create_graph,
                              /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k) grads[slot[k]] = g[k];
  }
};

}  // namespace

std::vector<torch::Tensor> ReentrantCheckpoint::run(const SegmentCall& call) {
  if (!torch::GradMode::is_enabled()) return call.fn(call.args);
  auto st = c10::make_intrusive<State>();
  st->fn = call.fn;
  st->args = call.args;
  st->v = v_;
  st->generators = call.generators;
  st->rng = RngState::capture(call.generators);
  st->autocast = compat::AutocastState::current();
  std::vector<torch::Tensor> inputs;
  for (size_t i = 0; i < call.args.size(); ++i)
    if (call.args[i].isTensor() && call.args[i].toTensor().defined()) {
      st->tensor_slots.push_back(i);
      inputs.push_back(call.args[i].toTensor());
    }
  // nested_backward and params_by_hand: as torch, the parameters are no inputs of the Function where an
  // input carries gradient (the nested backward reaches them); where none does they are, and the
  // skeleton's path runs.
  bool input_grad = false;
  for (const torch::Tensor& t : inputs) input_grad = input_grad || t.requires_grad();
  const std::vector<torch::Tensor> none;
  const bool params_outside = (v_.nested_backward || v_.params_by_hand) && input_grad;
  if (params_outside && v_.params_by_hand) st->by_hand = call.params;
  return ReentrantFunction::apply(at::TensorList(inputs), at::TensorList(params_outside ? none : call.params), st);
}

ImplEntry reentrant_hooks() {
  // LibTorch 1.13 does not run a leaf's hooks inside autograd::grad, so there the skeleton is correct.
  return {{"reentrant-hooks",
           "a reentrant checkpoint (autograd::grad inside backward): a parameter's gradient hook runs twice",
           "grad-baseline", "hook=scale or clip", false, true},
          [] { return std::make_unique<ReentrantCheckpoint>(); }};
}

}  // namespace ckv::faults
