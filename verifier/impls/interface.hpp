// verifier/impls/interface.hpp: the one interface every checkpoint implementation under test sits
// behind (DESIGN.md, "Implementations under test"): ckverify's builtin, each fault injector, and (in
// later issues) C++ plugins and Python callables. The run stage (verifier/run/) cuts a Case's block
// stack into the segments of its plan and hands every checkpointed segment to run().
//
// Lifetime rules: `call.fn` and every tensor in `call.args` stay valid until end_step(call.step)
// returns; an implementation may copy fn and call it again (from any thread) until then, which is
// what a recompute does. fn is deterministic given the same arguments, RNG state and autocast state.
#pragma once

#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "verifier/checkpoint/checkpoint.hpp"

namespace ckv {

// 2: strategies (is_strategy, run_stack). 3: SegmentCall::generators.
inline constexpr int kImplInterfaceVersion = 3;

struct SegmentCall {
  SegmentFunction fn;
  // Positional arguments: tensors (the hidden state first; some do not require grad, some are not
  // floating point) and non-tensor values (int, double, bool, None).
  std::vector<c10::IValue> args;
  // Every parameter fn reads, shared ones included (an implementation that differentiates w.r.t.
  // parameters explicitly needs them; the builtin does not).
  std::vector<torch::Tensor> params;
  int segment = 0;  // index of the segment in the plan, stable across steps and micro-batches
  int step = 0;     // optimizer step
  int micro = 0;    // micro-batch within the step
  // Generators fn draws from besides the devices' default ones: the streams of a model-parallel RNG
  // tracker (verifier/dist/rng_tracker.hpp), forked inside fn. A checkpoint replays them as it replays
  // the defaults: their states captured before the forward, set again for the recompute, and left after
  // it as they were before it. Empty where fn draws from the defaults only.
  std::vector<at::Generator> generators;
};

// The block stack of one micro-batch's forward, handed to a strategy (is_strategy()): one SegmentCall
// per block, in order (fn(h) -> {h}; `segment` is the block's index), and the stack's input.
struct StackCall {
  std::vector<SegmentCall> blocks;
  torch::Tensor x;
  int step = 0;
  int micro = 0;
};

class CheckpointImpl {
 public:
  virtual ~CheckpointImpl() = default;
  // fn(args), run as one checkpointed segment: returns fn's outputs with a graph through which
  // backward yields the gradients of every tensor argument and parameter that requires grad.
  virtual std::vector<torch::Tensor> run(const SegmentCall& call) = 0;
  // Step boundaries: before the first forward of a step, and after its optimizer update.
  virtual void begin_step(int /*step*/) {}
  virtual void end_step(int /*step*/) {}
  // A strategy decides itself which blocks to checkpoint, and how: the run stage then hands it the
  // whole block stack (run_stack) instead of each checkpointed segment of the Case's plan (run). It
  // returns the stack's output, with a graph to every block's parameters and to x. Only Cases whose
  // blocks are whole units (plan=block, segio=single, no tied input projection) run a strategy.
  virtual bool is_strategy() const { return false; }
  virtual torch::Tensor run_stack(const StackCall& /*call*/) {
    throw std::logic_error("run_stack called on an implementation that is not a strategy");
  }
};

}  // namespace ckv
