// verifier/checkpoint/checkpoint.cpp: checkpoint() and the RecomputeFrame behind it (frame.hpp).
#include "verifier/checkpoint/checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "verifier/checkpoint/frame.hpp"
#include "verifier/checkpoint/saved_tensor_hooks.hpp"

#include <torch/csrc/autograd/engine.h>

#include <thread>

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

// Thrown by the recompute's pack hook once every needed tensor is collected; caught by run_fn_collecting.
struct StopRecompute {};

// The recompute's hooks: pack hands the tensor to the frame for the forward's unpack. The recompute's
// own graph is normally dropped with its outputs; when fn itself runs backward (torch.autograd.grad
// inside the segment), that graph is unpacked during the recompute, so each hook keeps its tensor.
class CollectHooks : public torch::autograd::SavedVariableHooks {
 public:
  explicit CollectHooks(RecomputeFrame* frame) : frame_(frame) {}
  void call_pack_hook(const torch::Tensor& t) override {
    // Detached, so that neither the frame nor this hook keeps the recompute's graph alive.
    kept_ = t.requires_grad() ? t.detach() : t;
    if (frame_->collect(kept_)) throw StopRecompute{};
  }
  torch::Tensor call_unpack_hook() override { return kept_; }

 private:
  RecomputeFrame* frame_;
  torch::Tensor kept_;
};

}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> forward_hooks(const std::shared_ptr<RecomputeFrame>& frame) {
  return std::make_unique<ForwardHooks>(frame);
}

GlobalStateGuard::GlobalStateGuard(bool rng, const std::vector<at::Generator>& extra)
    : autocast_(compat::AutocastState::current()), grad_(torch::GradMode::is_enabled()) {
  if (rng) rng_ = RngState::capture(extra);
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
  if (options_.preserve_rng) forward_rng_ = RngState::capture(options_.generators);
}

std::vector<torch::Tensor> RecomputeFrame::run_forward() {
  capture_state();
  offer_inputs_to_outer_hooks();
  std::vector<torch::Tensor> out;
  {
    SavedTensorHooksScope hooks([self = shared_from_this()] { return forward_hooks(self); });
    SegmentScope scope(segment_state_, /*recomputing=*/false);
    out = fn_(args_);
  }
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  forward_done_ = true;
  // A backward that fn ran inside itself has ended: what its recompute left is not needed again.
  passes_.clear();
  // The inputs the outer hooks hold are theirs from now on.
  for (const auto& entry : outer_) args_[entry.first] = c10::IValue();
  return out;
}

void RecomputeFrame::offer_inputs_to_outer_hooks() {
  // As torch saves a checkpoint's inputs for backward, before fn runs: when saved-tensor hooks surround
  // the checkpoint (an offloading hook, or the frame of an enclosing checkpoint), the inputs are saved
  // through them and the recompute unpacks them (with their autograd identity, as any saved tensor).
  if (!saved_tensor_hooks_active()) return;
  for (size_t i = 0; i < args_.size(); ++i) {
    if (!args_[i].isTensor() || !args_[i].toTensor().defined() || args_[i].toTensor().is_inference()) continue;
    outer_.emplace_back(i, std::make_unique<torch::autograd::SavedVariable>(args_[i].toTensor(), false));
  }
}

std::vector<c10::IValue> RecomputeFrame::recompute_args() const {
  std::vector<c10::IValue> args = args_;
  if (forward_done_)
    for (const auto& [i, saved] : outer_) args[i] = saved->unpack();
  return args;
}

size_t RecomputeFrame::pack(const torch::Tensor& t) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Saved s;
  s.sizes = t.sizes().vec();
  s.dtype = t.scalar_type();
  s.device = t.device();
  if (!t.is_inference()) {
    s.version = torch::autograd::impl::version_counter(t);
    s.saved_version = t._version();
  }
  bool found = false;
  for (size_t i = 0; i < args_.size() && !found; ++i) {
    if (!args_[i].isTensor() || !args_[i].toTensor().defined()) continue;
    const torch::Tensor& a = args_[i].toTensor();
    if (a.unsafeGetTensorImpl() == t.unsafeGetTensorImpl())
      s.kind = Saved::Kind::input, s.arg = i, found = true;
    else if (a.has_storage() && t.has_storage() && a.storage().is_alias_of(t.storage()))
      s.kind = Saved::Kind::input_view, s.arg = i, found = true;
  }
  if (!found) {
    const bool view = t.is_view();
    const at::TensorBase& base = view ? t._base() : static_cast<const at::TensorBase&>(t);
    if (base.is_leaf() && base.requires_grad()) {
      s.kind = view ? Saved::Kind::parameter_view : Saved::Kind::parameter;
      s.parameter_sizes = base.sizes().vec();
    }
  }
  saved_.push_back(std::move(s));
  return saved_.size() - 1;
}

std::string RecomputeFrame::Saved::what() const {
  switch (kind) {
    case Kind::input:
      return fmt::format("input {}", arg);
    case Kind::input_view:
      return fmt::format("a view of input {}", arg);
    case Kind::parameter:
      return "a parameter of shape " + shape_of(parameter_sizes);
    case Kind::parameter_view:
      return "a view of a parameter of shape " + shape_of(parameter_sizes);
    case Kind::inner:
      break;
  }
  return "a tensor of shape " + shape_of(sizes) + " computed inside the segment";
}

bool RecomputeFrame::collect(const torch::Tensor& t) {
  collected_.push_back(t);
  // Stop only at the recompute's own level: never from inside a backward that fn itself runs (the
  // engine would not unwind that call cleanly), where the stop is left to the next save outside it.
  return options_.early_stop && collected_.size() >= wanted_ &&
         compat::current_backward_key() == recompute_backward_key_;
}

void RecomputeFrame::check_collected() const {
  // Without early stop a recompute that saves more than the forward is reported; with it, the extra
  // saves can only be those a stop deferred out of a backward that fn ran.
  if (collected_.size() < wanted_ || (forward_done_ && !options_.early_stop && collected_.size() > wanted_))
    throw CheckpointError(fmt::format(
        "ckverify checkpoint: the recompute saved {} tensor(s) for backward but the first forward saved {}; the "
        "segment function is not deterministic (it depends on state that changed between forward and backward)",
        collected_.size(), wanted_));
  for (size_t index = 0; index < wanted_; ++index) {
    const torch::Tensor& t = collected_[index];
    const Saved& s = saved_[index];
    if (t.sizes().vec() != s.sizes || t.scalar_type() != s.dtype || t.device() != s.device)
      throw CheckpointError(fmt::format(
          "ckverify checkpoint: saved tensor {} ({}) was {} {} on {} in the first forward but {} {} on {} in the "
          "recompute; the recompute did not replay the forward (autocast state, RNG, or state the segment reads)",
          index, s.what(), c10::toString(s.dtype), shape_of(s.sizes), s.device.str(), c10::toString(t.scalar_type()),
          shape_of(t.sizes()), t.device().str()));
  }
}

RecomputeFrame::Pass& RecomputeFrame::pass_for(int64_t key) {
  // A pass belongs to a backward call that is still running: its sentinel dies with the call (the
  // callback queued below holds it, and the engine drops its callbacks when the call ends, also when it
  // fails), so a later call, even one that reuses the key, recomputes.
  for (auto it = passes_.begin(); it != passes_.end();)
    it = it->second.alive.expired() && it->first >= 0 ? passes_.erase(it) : std::next(it);
  if (auto it = passes_.find(key); it != passes_.end()) return it->second;
  struct Clear {  // what a failed recompute collected is not kept
    RecomputeFrame* f;
    ~Clear() { f->collected_.clear(); }
  } clear{this};
  wanted_ = saved_.size();
  collected_.clear();
  recomputing_ = std::this_thread::get_id();
  struct Done {
    RecomputeFrame* f;
    ~Done() { f->recomputing_ = std::thread::id(); }
  } done{this};
  recompute();
  check_collected();
  Pass pass;
  collected_.resize(wanted_);
  pass.tensors = std::move(collected_);
  pass.taken.assign(wanted_, false);
  if (key >= 0) {
    // Free what this backward call leaves unused when it ends.
    auto sentinel = std::make_shared<int>(0);
    pass.alive = sentinel;
    torch::autograd::Engine::get_default_engine().queue_callback(
        [weak = std::weak_ptr<RecomputeFrame>(shared_from_this()), key, sentinel] {
          if (auto frame = weak.lock()) {
            std::lock_guard<std::recursive_mutex> lock(frame->mutex_);
            frame->passes_.erase(key);
          }
        });
  }
  return passes_[key] = std::move(pass);
}

torch::Tensor RecomputeFrame::unpack(size_t index) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (recomputing_ == std::this_thread::get_id())
    throw CheckpointError(
        "ckverify checkpoint: a saved tensor of a segment was asked for while that segment was being recomputed "
        "(fn differentiates through its own first forward, e.g. a tensor it stashed in the forward)");
  int64_t key = compat::current_backward_key();
  const bool private_key = key < 0;
  if (private_key) key = next_private_key_--;  // outside backward: a recompute of its own
  struct Erase {                               // a private pass serves this one unpack
    RecomputeFrame* f;
    int64_t key;
    bool on;
    ~Erase() {
      if (on) f->passes_.erase(key);
    }
  } erase{this, key, private_key};
  Pass& pass = pass_for(key);
  if (index >= pass.tensors.size())
    throw CheckpointError(fmt::format("ckverify checkpoint: saved tensor {} was never recomputed", index));
  if (pass.taken[index])
    throw CheckpointError(fmt::format(
        "ckverify checkpoint: saved tensor {} ({}) was unpacked twice in one backward call; the checkpoint hands "
        "each recomputed tensor out once (a custom backward that reads its saved tensors twice?)",
        index, saved_[index].what()));
  torch::Tensor t = std::move(pass.tensors[index]);
  pass.tensors[index] = torch::Tensor();
  pass.taken[index] = true;
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
          s.what(), s.saved_version, s.version.current_version()));
}

void RecomputeFrame::replay_rng() const {
  forward_rng_.restore();
}

void RecomputeFrame::run_fn_collecting() {
  collected_.clear();
  const std::vector<c10::IValue> args = prepared_args_ ? *prepared_args_ : recompute_args();
  recompute_backward_key_ = compat::current_backward_key();
  SavedTensorHooksScope hooks([this] { return std::make_unique<CollectHooks>(this); });
  SegmentScope scope(segment_state_, marks_recompute());
  try {
    fn_(args);  // the outputs (and the recompute's graph) are dropped here
  } catch (const StopRecompute&) {
  }
}

void RecomputeFrame::recompute() {
  check_unchanged();
  // The inputs come back from the outer hooks before the recompute's state is set up (an unpack hook
  // runs under the caller's RNG, autocast and grad mode, as in torch).
  prepared_args_ = recompute_args();
  struct Forget {
    RecomputeFrame* f;
    ~Forget() { f->prepared_args_.reset(); }
  } forget{this};
  GlobalStateGuard guard(options_.preserve_rng, options_.generators);
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
