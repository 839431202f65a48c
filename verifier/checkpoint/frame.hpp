// verifier/checkpoint/frame.hpp: the machinery of checkpoint() (checkpoint.hpp), one RecomputeFrame
// per checkpointed call. Its steps are virtual so that ckverify's fault injectors
// (verifier/impls/faults/) can each break exactly one of them in a file of their own; the library's
// users call checkpoint() and never need this header.
//
// Life of a frame: run_forward() captures the RNG and autocast state, offers fn's tensor inputs to the
// saved-tensor hooks around the checkpoint, if any (an offloading hook may move them), and runs fn
// with pack hooks installed; every tensor autograd saves is recorded by pack() (metadata and version
// counter only). The first unpack() of a backward call (graph task; outside backward, every unpack;
// in the forward, when fn runs backward itself) calls recompute(): check_unchanged(), then fn again
// from the same args under the forward's RNG and autocast state, with hooks that collect the tensors
// the recompute saves, stopping once it has them all (early stop). The collected tensors belong to
// that backward call: unpack() hands each one out once, a later call recomputes again, and what a call
// left unused is freed when it ends.
#pragma once

#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "verifier/checkpoint/checkpoint.hpp"
#include "verifier/checkpoint/compat.hpp"
#include "verifier/checkpoint/rng.hpp"
#include "verifier/checkpoint/segment_scope.hpp"

namespace ckv::checkpoint_detail {

class RecomputeFrame : public std::enable_shared_from_this<RecomputeFrame> {
 public:
  RecomputeFrame(SegmentFunction fn, std::vector<c10::IValue> args, CheckpointOptions options);
  virtual ~RecomputeFrame() = default;

  // The first forward: fn(args) with the frame's pack hooks installed. Call on a shared_ptr.
  std::vector<torch::Tensor> run_forward();
  // Hook entry points (SavedVariableHooks of the forward's saved tensors).
  size_t pack(const torch::Tensor& t);
  virtual torch::Tensor unpack(size_t index);
  // Called by the recompute's hooks for every tensor the recompute saves; true when the recompute has
  // every tensor it was started for and early stop ends it.
  bool collect(const torch::Tensor& t);

 protected:
  struct Saved {
    std::vector<int64_t> sizes;
    c10::ScalarType dtype;
    c10::Device device = c10::Device(c10::kCPU);
    c10::VariableVersion version{c10::VariableVersion::DISABLED};
    uint32_t saved_version = 0;
    // What the tensor is, for messages (what()): pack() only records the kind, as every saved tensor of
    // every checkpointed call passes through it.
    enum class Kind { input, input_view, parameter, parameter_view, inner } kind = Kind::inner;
    size_t arg = 0;                        // input, input_view
    std::vector<int64_t> parameter_sizes;  // parameter, parameter_view: the parameter's (the view's base)
    // "input 0", "a view of input 0", "a parameter of shape [4, 4]", ...
    std::string what() const;
  };
  // Captures what the recompute replays (RNG, autocast); called before fn runs.
  virtual void capture_state();
  // Throws CheckpointError when an input or a saved tensor changed in place since the forward.
  virtual void check_unchanged() const;
  // Runs fn again under the forward's state and collects the tensors it saves.
  virtual void recompute();
  // Puts the forward's generators back for the recompute (all devices).
  virtual void replay_rng() const;
  // The autocast state the recompute runs under.
  virtual compat::AutocastState recompute_autocast() const { return forward_autocast_; }
  // fn(args) with hooks that store every saved tensor into collected_, inside a SegmentScope that
  // tells the modules in fn whether this is a recompute (segment_scope.hpp); ends fn early once
  // collected_ has every tensor the forward saved so far (options_.early_stop).
  void run_fn_collecting();
  // args_, with the tensor inputs that outer saved-tensor hooks hold unpacked from them.
  std::vector<c10::IValue> recompute_args() const;
  // Whether the recompute tells the modules it is one (false only in a fault that replays effects).
  virtual bool marks_recompute() const { return true; }

  SegmentFunction fn_;
  std::vector<c10::IValue> args_;
  CheckpointOptions options_;
  RngState forward_rng_;
  compat::AutocastState forward_autocast_;
  std::vector<Saved> saved_;
  std::vector<std::pair<size_t, c10::VariableVersion>> arg_versions_;  // (arg index, counter)
  std::vector<uint32_t> arg_saved_versions_;
  // What the latest recompute() collected, by pack index.
  std::vector<torch::Tensor> collected_;
  // The tensors one backward call recomputed: each is handed out once (then undefined).
  struct Pass {
    std::vector<torch::Tensor> tensors;
    std::vector<bool> taken;
    std::weak_ptr<int> alive;  // expires when its backward call ends (none outside backward)
  };
  std::map<int64_t, Pass> passes_;                         // by backward call (compat::current_backward_key)
  int64_t next_private_key_ = -2;                          // for unpacks outside any backward call
  size_t wanted_ = 0;                                      // tensors the running recompute must collect
  int64_t recompute_backward_key_ = -1;                    // the backward call the running recompute serves
  std::thread::id recomputing_;                            // the thread running this frame's recompute, if any
  std::optional<std::vector<c10::IValue>> prepared_args_;  // recompute_args(), fetched before the state is set up
  bool forward_done_ = false;
  // Tensor inputs saved through the saved-tensor hooks around the checkpoint: (arg index, saved).
  std::vector<std::pair<size_t, std::unique_ptr<torch::autograd::SavedVariable>>> outer_;
  SegmentState segment_state_;
  std::recursive_mutex mutex_;  // recursive so that a re-entry on the recomputing thread is reported

 private:
  Pass& pass_for(int64_t key);
  void check_collected() const;
  void offer_inputs_to_outer_hooks();
};

// Saves a frame's tensors through its pack/unpack.
std::unique_ptr<torch::autograd::SavedVariableHooks> forward_hooks(const std::shared_ptr<RecomputeFrame>& frame);

// checkpoint() with a frame of the caller's type (the builtin uses RecomputeFrame itself).
template <class Frame, class... Extra>
std::vector<torch::Tensor> checkpoint_with(const SegmentFunction& fn, std::vector<c10::IValue> args,
                                           CheckpointOptions options, Extra&&... extra) {
  if (!torch::GradMode::is_enabled()) return fn(args);
  auto frame = std::make_shared<Frame>(fn, std::move(args), options, std::forward<Extra>(extra)...);
  return frame->run_forward();
}

// Restores RNG (when captured), autocast and grad mode on scope exit, exceptions included.
class GlobalStateGuard {
 public:
  explicit GlobalStateGuard(bool rng, const std::vector<at::Generator>& extra = {});
  ~GlobalStateGuard();
  GlobalStateGuard(const GlobalStateGuard&) = delete;
  GlobalStateGuard& operator=(const GlobalStateGuard&) = delete;

 private:
  RngState rng_;
  compat::AutocastState autocast_;
  bool grad_;
};

}  // namespace ckv::checkpoint_detail
