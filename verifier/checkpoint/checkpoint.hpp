// verifier/checkpoint/checkpoint.hpp: activation checkpointing for LibTorch C++, which has none
// (upstream pytorch issue 52744). checkpoint(fn, args) runs fn normally, so its outputs sit in the real
// autograd graph, but keeps none of the tensors autograd saves for backward inside fn: a
// saved-tensor hook (saved_tensor_hooks.hpp) records only their metadata, and the first time a
// backward call asks for one of them fn is run again from `args` to recompute them. This is the design
// of torch.utils.checkpoint(use_reentrant=False), and like it:
//   - gradients flow through the graph fn built in the first forward, so every parameter fn reads gets
//     its gradient whether or not it is declared (there is nothing to declare), a gradient hook on a
//     parameter runs once per backward, parameters shared with code outside the segment accumulate
//     exactly as without checkpointing (also under autocast, where the shared cast is part of the
//     graph), outputs that fn returns without grad stay without grad, and create_graph (double
//     backward, gradient penalties), retain_graph and nested checkpoints work;
//   - fn may itself run backward (torch::autograd::grad inside the segment), in the forward and in the
//     recompute, also inside nested checkpoints (on the CPU; on CUDA, the saves of a backward that fn
//     runs happen on autograd's device threads, which the hooks do not reach: not supported there);
//   - each backward call recomputes for itself: what one backward call recomputed is handed out once
//     (a tensor unpacked twice in one call is an error), never reused by a later call (also after a
//     call that failed), and freed when the call ends;
//   - the recompute stops as soon as it has recomputed every tensor the forward saved (early stop; turn
//     it off with CheckpointOptions::early_stop = false to run fn to the end, which also reports a
//     recompute that saves more tensors than the forward did);
//   - saved-tensor hooks around the checkpoint see its tensor inputs, before fn runs (an offloading hook
//     can move them), never the tensors saved inside fn;
//   - segments take several tensors and non-tensor values (ints, doubles, bools, None) and return
//     several tensors;
//   - the recompute replays the forward's random draws (the CPU generator, the default generator of
//     every CUDA device and CheckpointOptions::generators are captured before fn and reinstalled around
//     the recompute, then put back, so
//     backward leaves the random stream as it found it) and runs under the forward's autocast state
//     (enabled flag and dtype per device type) with grad enabled; all of it is restored when the
//     recompute throws;
//   - called with grad disabled it simply runs fn;
//   - modules inside fn can tell the recompute from the first forward, and keep state between them
//     (segment_scope.hpp), so counters, logs and running statistics take effect once.
// Where it differs from torch.utils.checkpoint(use_reentrant=False), and why:
//   - every saved tensor's version counter is checked before the recompute (torch checks only the
//     inputs): a parameter changed in place between forward and backward (an optimizer step taken
//     early) would otherwise be recomputed from silently;
//   - the generators of *every* CUDA device are replayed, not only those of the inputs' devices;
//   - there is no context_fn, selective policy or debug mode: ckverify needs the simplest correct
//     reference implementation;
//   - arguments are positional (no kwargs).
// fn must let exceptions it does not know pass (early stop ends it with one that is not a
// std::exception; it is never thrown inside a backward that fn runs). fn must not differentiate
// through its own first forward (a tensor it stashed there): that is reported, not deadlocked.
// Errors (CheckpointError): an input or saved tensor modified in place before backward, a recompute
// whose saved tensors differ in number, shape, dtype or device from the first forward's (fn is not
// deterministic: it depends on state that changed between forward and backward), and a saved tensor
// unpacked twice in one backward call.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <stdexcept>
#include <vector>

#include "verifier/checkpoint/segment_scope.hpp"

namespace ckv {

// A segment: positional arguments in (tensors and non-tensor values), tensors out.
using SegmentFunction = std::function<std::vector<torch::Tensor>(const std::vector<c10::IValue>& args)>;

struct CheckpointOptions {
  // Replay the segment's random draws in the recompute. false is only for segments proven free of
  // randomness: it skips capturing the generators (a few KB copied per call).
  bool preserve_rng = true;
  // Stop the recompute once every tensor the forward saved has been recomputed (as torch does).
  bool early_stop = true;
  // Generators fn draws from besides the devices' defaults (the streams of a model-parallel RNG
  // tracker, verifier/dist/rng_tracker.hpp): captured before fn and replayed in the recompute like the
  // defaults (with preserve_rng).
  std::vector<at::Generator> generators;
};

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// fn is copied and called again in backward: what it captures must outlive the backward.
std::vector<torch::Tensor> checkpoint(const SegmentFunction& fn, std::vector<c10::IValue> args,
                                      CheckpointOptions options = {});
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x,
                         CheckpointOptions options = {});

}  // namespace ckv
