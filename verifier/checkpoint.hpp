// verifier/checkpoint.hpp: activation checkpointing for LibTorch C++ (which has none: upstream
// pytorch issue 52744). checkpoint(fn, inputs, params) runs fn without keeping its activations and,
// in backward, recomputes fn with grad enabled and back-propagates through the recomputed graph.
//
// It gets right every failure class real implementations shipped:
//   - RNG: the CPU generator and the generator of *every* CUDA device are saved before the forward and
//     reinstalled for the recompute (so dropout draws the same masks), including devices fn reaches on
//     its own rather than through its inputs; afterwards the generators are put back as they were, so
//     backward does not perturb the random stream. preserve_rng=false skips this, for segments that
//     are proven free of randomness.
//   - autocast and grad mode: the recompute runs under the autocast state (enabled flag and dtype, per
//     device type) of the first forward, with grad enabled; both are restored afterwards.
//   - parameter gradients: the segment's parameters are explicit inputs of the autograd node, so they
//     receive gradients even when no input requires grad (the frozen-embedding / LoRA case where
//     reentrant checkpoints silently dropped them).
//   - autocast casts: an input that was not a leaf in the forward is not a leaf in the recompute either
//     (autocast caches the casts of fp32 leaves, which would change how gradients are summed and shift
//     bf16 gradients by an ulp: found by ckverify's own grad-baseline on bf16 cases).
//   - exceptions: RNG, autocast and grad mode are restored by RAII guards when fn throws in recompute.
//   - in-place changes: an input or parameter modified in place between forward and backward is
//     detected through its version counter and reported, instead of being silently recomputed from.
// Called with grad disabled, checkpoint simply runs fn: there is no backward to prepare for.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace ckv {

struct CheckpointOptions {
  bool preserve_rng = true;
};

using MultiSegmentFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// `params`: the tensors fn reads that need gradients and are not among `inputs` (module parameters).
torch::Tensor checkpoint(const MultiSegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params = {}, CheckpointOptions options = {});
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& params = {}, CheckpointOptions options = {});
// The module's parameters are the segment's parameters.
torch::Tensor checkpoint(torch::nn::Module& module, const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                         const torch::Tensor& x, CheckpointOptions options = {});

namespace detail {
// Deliberately broken variants, used only by the fault injectors (verifier/faults.hpp) to prove that
// every property fires. The correct implementation is the all-false default.
struct Breakage {
  bool cpu_rng_only = false;          // restore the CPU generator but not the CUDA ones
  bool skip_autocast_replay = false;  // recompute under the backward's autocast state
  bool inputs_only_grad = false;      // differentiate only w.r.t. the inputs: parameters get nothing
  bool recompute_twice = false;       // run the recompute two times
  bool no_restore_on_throw = false;   // restore global state only on the success path
  bool skip_version_check = false;    // recompute from inputs modified in place
  bool leaf_inputs = false;           // hand fn the detached (leaf) inputs: changes autocast's cast caching
};
torch::Tensor checkpoint_variant(const MultiSegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                                 const std::vector<torch::Tensor>& params, CheckpointOptions options,
                                 const Breakage& breakage);
}  // namespace detail

}  // namespace ckv
