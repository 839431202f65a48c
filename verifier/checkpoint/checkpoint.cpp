// verifier/checkpoint/checkpoint.cpp: checkpoint() and the RecomputeFrame behind it (frame.hpp).
#include "verifier/checkpoint/checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "verifier/checkpoint/frame.hpp"
#include "verifier/checkpoint/saved_tensor_hooks.hpp"

namespace ckv {
namespace checkpoint_detail {
namespace {

std::string shape_of(c10::IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

// The forward's hooks: pack records metadata only, unpack recomputes.
class ForwardHooks : public torch::autograd::SavedVariableHooks {
 public:
  explicit ForwardHooks(std::shared_ptr<RecomputeFrame> frame) : frame_(std::move(frame)) {}
  void call_pack_hook(const torch::Tensor& t) override { index_ = frame_->pack(t); }
  torch::Tensor call_unpack_hook() override { return frame_->unpack(index_); }

 private:
  std::shared_ptr<RecomputeFrame> frame_;
  size_t index_ = 0;
};

// The recompute's hooks: pack keeps the tensor for the forward's unpack; the recompute's own graph is
// dropped with its outputs, so its unpack never runs.
class CollectHooks : public torch::autograd::SavedVariableHooks {
 public:
  explicit CollectHooks(std::vector<torch::Tensor>* sink) : sink_(sink) {}
  void call_pack_hook(const torch::Tensor& t) override {
    // Detached, so that the kept tensor does not keep the recompute's graph alive.
    sink_->push_back(t.requires_grad() ? t.detach() : t);
  }
  torch::Tensor call_unpack_hook() override {
    throw CheckpointError("ckverify checkpoint: backward through a recompute's own graph is not supported");
  }

 private:
  std::vector<torch::Tensor>* sink_;
};

}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> forward_hooks(const std::shared_ptr<RecomputeFrame>& frame) {
  return std::make_unique<ForwardHooks>(frame);
}

GlobalStateGuard::GlobalStateGuard(bool rng)
    : autocast_(compat::AutocastState::current()), grad_(torch::GradMode::is_enabled()) {
  if (rng) rng_ = RngState::capture();
}
GlobalStateGuard::~GlobalStateGuard() {
  if (!rng_.empty()) rng_.restore();
  autocast_.apply();
  torch::GradMode::set_enabled(grad_);
}

RecomputeFrame::RecomputeFrame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions options)
    : fn_(std::move(fn)), args_(std::move(args)), options_(options) {
  for (size_t i = 0; i < args_.size(); ++i)
    if (args_[i].isTensor() && args_[i].toTensor().defined()) {
      const torch::Tensor& t = args_[i].toTensor();
      if (t.is_inference()) continue;  // inference tensors have no version counter
      arg_versions_.emplace_back(i, torch::autograd::impl::version_counter(t));
      arg_saved_versions_.push_back(t._version());
    }
}

void RecomputeFrame::capture_state() {
  forward_autocast_ = compat::AutocastState::current();
  if (options_.preserve_rng) forward_rng_ = RngState::capture();
}

std::vector<torch::Tensor> RecomputeFrame::run_forward() {
  capture_state();
  SavedTensorHooksScope hooks([self = shared_from_this()] { return forward_hooks(self); });
  SegmentScope scope(segment_state_, /*recomputing=*/false);
  return fn_(args_);
}

size_t RecomputeFrame::pack(const torch::Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  Saved s;
  s.sizes = t.sizes().vec();
  s.dtype = t.scalar_type();
  s.device = t.device();
  if (!t.is_inference()) {
    s.version = torch::autograd::impl::version_counter(t);
    s.saved_version = t._version();
  }
  for (size_t i = 0; i < args_.size() && s.what.empty(); ++i) {
    if (!args_[i].isTensor() || !args_[i].toTensor().defined()) continue;
    const torch::Tensor& a = args_[i].toTensor();
    if (a.unsafeGetTensorImpl() == t.unsafeGetTensorImpl())
      s.what = fmt::format("input {}", i);
    else if (a.has_storage() && t.has_storage() && a.storage().is_alias_of(t.storage()))
      s.what = fmt::format("a view of input {}", i);
  }
  if (s.what.empty()) {
    const bool view = t.is_view();
    const at::TensorBase& base = view ? t._base() : static_cast<const at::TensorBase&>(t);
    if (base.is_leaf() && base.requires_grad())
      s.what = (view ? "a view of a parameter of shape " : "a parameter of shape ") + shape_of(base.sizes());
    else
      s.what = "a tensor of shape " + shape_of(t.sizes()) + " computed inside the segment";
  }
  saved_.push_back(std::move(s));
  return saved_.size() - 1;
}

torch::Tensor RecomputeFrame::unpack(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index >= recomputed_.size() || !recomputed_[index].defined()) recompute();
  if (index >= recomputed_.size())
    throw CheckpointError(fmt::format(
        "ckverify checkpoint: the recompute saved {} tensor(s) for backward but the first forward saved {}; the "
        "segment function is not deterministic (it depends on state that changed between forward and backward)",
        recomputed_.size(), saved_.size()));
  torch::Tensor t = std::move(recomputed_[index]);
  recomputed_[index] = torch::Tensor();
  const Saved& s = saved_[index];
  if (t.sizes().vec() != s.sizes || t.scalar_type() != s.dtype || t.device() != s.device)
    throw CheckpointError(fmt::format(
        "ckverify checkpoint: saved tensor {} ({}) was {} {} on {} in the first forward but {} {} on {} in the "
        "recompute; the recompute did not replay the forward (autocast state, RNG, or state the segment reads)",
        index, s.what, c10::toString(s.dtype), shape_of(s.sizes), s.device.str(), c10::toString(t.scalar_type()),
        shape_of(t.sizes()), t.device().str()));
  return t;
}

void RecomputeFrame::check_unchanged() const {
  for (size_t k = 0; k < arg_versions_.size(); ++k) {
    const uint32_t now = arg_versions_[k].second.current_version();
    if (now != arg_saved_versions_[k])
      throw CheckpointError(fmt::format(
          "ckverify checkpoint: input {} of the checkpointed segment was modified in place between its forward and "
          "its backward (version {} -> {}); recomputing from the new value would give wrong gradients. Clone it "
          "before modifying it.",
          arg_versions_[k].first, arg_saved_versions_[k], now));
  }
  for (const Saved& s : saved_)
    if (s.version.enabled() && s.version.current_version() != s.saved_version)
      throw CheckpointError(fmt::format(
          "ckverify checkpoint: {} that the checkpointed segment saved for backward was modified in place between "
          "its forward and its backward (version {} -> {}); recomputing from the new value would give wrong "
          "gradients (an optimizer step before backward?)",
          s.what, s.saved_version, s.version.current_version()));
}

void RecomputeFrame::replay_rng() const {
  forward_rng_.restore();
}

void RecomputeFrame::run_fn_collecting() {
  recomputed_.clear();
  SavedTensorHooksScope hooks([this] { return std::make_unique<CollectHooks>(&recomputed_); });
  SegmentScope scope(segment_state_, marks_recompute());
  fn_(args_);  // the outputs (and the recompute's graph) are dropped here
}

void RecomputeFrame::recompute() {
  check_unchanged();
  GlobalStateGuard guard(options_.preserve_rng);
  if (options_.preserve_rng) replay_rng();
  compat::ScopedAutocastState autocast(recompute_autocast());
  torch::AutoGradMode grad_on(true);
  run_fn_collecting();
}

}  // namespace checkpoint_detail

std::vector<torch::Tensor> checkpoint(const SegmentFunction& fn, std::vector<c10::IValue> args,
                                      CheckpointOptions options) {
  return checkpoint_detail::checkpoint_with<checkpoint_detail::RecomputeFrame>(fn, std::move(args), options);
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x,
                         CheckpointOptions options) {
  return checkpoint(
             [fn](const std::vector<c10::IValue>& a) { return std::vector<torch::Tensor>{fn(a.at(0).toTensor())}; },
             {x}, options)
      .at(0);
}

}  // namespace ckv
