// verifier/checkpoint/checkpoint.hpp: activation checkpointing for LibTorch C++, which has none
// (upstream pytorch issue 52744). checkpoint(fn, args) runs fn normally, so its outputs sit in the real
// autograd graph, but keeps none of the tensors autograd saves for backward inside fn: a
// saved-tensor hook (saved_tensor_hooks.hpp) records only their metadata, and the first time backward
// asks for one of them fn is run again from `args` to recompute them all. This is the design of
// torch.utils.checkpoint(use_reentrant=False), and like it:
//   - gradients flow through the graph fn built in the first forward, so every parameter fn reads gets
//     its gradient whether or not it is declared (there is nothing to declare), a gradient hook on a
//     parameter runs once per backward, parameters shared with code outside the segment accumulate
//     exactly as without checkpointing (also under autocast, where the shared cast is part of the
//     graph), outputs that fn returns without grad stay without grad, and create_graph (double
//     backward, gradient penalties), retain_graph and nested checkpoints work;
//   - segments take several tensors and non-tensor values (ints, doubles, bools, None) and return
//     several tensors;
//   - the recompute replays the forward's random draws (the CPU generator and the default generator of
//     every CUDA device are captured before fn and reinstalled around the recompute, then put back, so
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
//   - the recompute always runs fn to the end (no early stop) and there is no context_fn, selective
//     policy or debug mode: ckverify needs the simplest correct reference implementation;
//   - arguments are positional (no kwargs).
// Errors (CheckpointError): an input or saved tensor modified in place before backward, and a recompute
// whose saved tensors differ in number, shape, dtype or device from the first forward's (fn is not
// deterministic: it depends on state that changed between forward and backward).
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
