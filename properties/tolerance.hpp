// properties/tolerance.hpp: the one tolerance table (DESIGN.md, "Tolerances"). Every bound the
// properties use is made here, as an (rtol, atol) pair with the reason attached; a comparison passes
// elementwise when |actual - expected| <= atol + rtol * |expected| (compare.hpp).
//
//   vs the baseline   bitwise: a correct checkpoint replays the same kernels on the same values (CPU).
//                     Exception: a gradient whose contributions arrive along several paths (a parameter
//                     read in several places; every gradient under a gradient penalty, which adds a
//                     second-order path). Those contributions may legitimately be summed in another order
//                     (a reentrant checkpoint sums a segment's contributions first) and, under autocast,
//                     in fp32 where the plain graph sums them in the autocast dtype; so such a gradient is
//                     compared within paths * eps(accumulation dtype) * kSharedFactor * the step's largest
//                     |gradient| (the contributions, not their sum, set the rounding: a sum that cancels
//                     to nearly zero still carries the rounding of its large terms).
//   vs the reference  conditioned on the Case itself: the reference is evaluated again in fp32 (same
//                     weights, same masks), once as is and once with its inputs and weights moved by a few
//                     ulps (run.hpp). Their distance from fp64 (the larger of the two, err32) shows how far
//                     fp32 rounding moves this step: per tensor, and as the step's spread (the worst
//                     err32 / scale over the tensors that are not negligible, scale >= 1e-3 of the
//                     largest). LibTorch may differ from fp64 by kReferenceFactor * max(err32, spread *
//                     scale) plus a floor of kReferenceFloor fp32 epsilons of the step's largest gradient
//                     (the rounding noise of an element is relative to the magnitudes summed into it, and in
//                     backward those are the step's gradients, not the element itself). One fp32
//                     evaluation can be lucky where LibTorch is not (a near-tie in a saturated softmax goes
//                     the same way as fp64; a diverged step cancels the same way), hence the perturbed
//                     evaluation and the step-wide spread. A step whose spread, or a tensor whose own
//                     err32, exceeds kReferenceCap / kReferenceFactor of its scale is too ill-conditioned
//                     in fp32 for the check to mean anything: reported as not checked, never as held. So
//                     is a step after training has diverged: activations kDivergence times those of step
//                     0 (a learning rate that blows the model up leaves fp32 cancelling what fp64 keeps).
#pragma once

#include <cstdint>

#include <string>
#include <vector>

#include "verifier/case/case.hpp"

namespace ckv {

struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
  std::string why;
  bool exact() const { return rtol == 0.0 && atol == 0.0; }
};

inline constexpr double kSharedFactor = 2.0;
inline constexpr double kReferenceFactor = 32.0;
inline constexpr double kReferenceFloor = 64.0;
inline constexpr double kReferenceCap = 0.05;
inline constexpr double kDivergence = 1e4;

// Checkpointed vs non-checkpointed LibTorch, same device and precision.
Tolerance baseline_tolerance(Precision p);
// A gradient whose contributions arrive along `uses` paths; `step_scale` is the largest |gradient| of
// the step's baseline (every parameter and x.grad).
Tolerance shared_gradient_tolerance(Precision p, int uses, double step_scale);
// Any gradient: a correct checkpoint may sum an activation's gradient contributions in another order
// than the plain graph (a reentrant checkpoint runs a nested backward per segment, and its engine visits
// the segment's nodes in its own order; under autocast some of those sums are in the autocast dtype),
// so every gradient may move by rounding: 2 x kReorderPaths x paths fp32 epsilons of the step's largest
// gradient, and under autocast 2 x kAutocastReorderPaths x paths epsilons of the autocast dtype. `paths` is 2 under a
// gradient penalty (its second-order path meets the first-order one later in a nested backward).
// Found by gating correct implementations written elsewhere: torch.utils.checkpoint(use_reentrant=True)
// one fp32 ulp off on a bias gradient; an independently written reentrant plugin up to 2.7x the first
// bound (8 fp32 epsilons) with a gradient penalty and dropout, 1.4x with a clipping hook (the scale is
// taken from clipped gradients), and one fp16 ulp off on x.grad under fp16 autocast; torch's reentrant
// checkpoint under bf16 (autocast caches one cast of its detached leaf input for q, k and v, whose
// gradients then meet in bf16) 1.13x a 2-epsilon bf16 bound on x.grad.
inline constexpr int kReorderPaths = 8;
inline constexpr int kAutocastReorderPaths = 4;
Tolerance reorder_tolerance(Precision p, int paths, double step_scale);
// A measured floor for the same comparison: `deviation` is the largest |difference| that ckverify's
// reference reentrant checkpoint (a correct design that sums in another order) showed on this tensor
// at this step of this Case (Observations::design). The fixed bound above assumes rounding of the
// step's largest gradient is amplified a few times at most; an ill-conditioned step amplifies it
// further (BatchNorm over four values divides by their spread, a gradient penalty differentiates that
// division again, a tied head adds paths): gating correct reentrant designs written outside the tree
// found 1.3-1.6x the fixed bound in fp32 on such Cases, every one equal to the reference design's own
// deviation, and under autocast rounding that the next layers amplify past the gradients' own size.
// The factor leaves room for a third summation order, whose rounding lands elsewhere.
inline constexpr double kDesignFloorFactor = 4.0;
Tolerance design_floor_tolerance(double deviation);
// refuses-inplace under inplace_on=param: the gradients of a run whose checkpointed segment's parameters
// were edited in place between micro-batches, against plain autograd's with the same edit. A correct
// checkpoint differs by summation order: the bounds above, every gradient taken as reaching its tensor
// along `uses` paths. A recompute from other parameter values than its forward read moves the gradients
// by a share of what the edit itself moves them (`edit_effect`: the largest |difference| the edit makes
// in plain autograd's gradients, its parameters' and x's); kParamEditShare of it is allowed besides (and
// kAutocastParamEditShare under autocast, where rounding that later layers amplify can approach a
// gradient's own size), so an ill-conditioned step's rounding is never reported as a stale parameter.
inline constexpr double kParamEditShare = 0.05;
inline constexpr double kAutocastParamEditShare = 0.2;
Tolerance parameter_edit_tolerance(Precision p, int paths, int uses, double step_scale, double edit_effect);
// The larger atol of the two (same rtol 0).
Tolerance looser(const Tolerance& a, const Tolerance& b);
// That parameter after an optimizer step of rate lr, given the gradient tolerance: SGD moves it by lr
// times the gradient's difference; Adam normalises the gradient, so a difference of rounding in a
// gradient near zero can move its update by up to 2 lr (in either direction).
Tolerance shared_update_tolerance(const Tolerance& gradient, double lr);
Tolerance adam_update_tolerance(const Tolerance& gradient, double lr);

// audit-amp: the drift checkpointing adds to a parameter group's gradients (rel-L2 against the
// non-checkpointed run) may reach the measured noise floor (the plain run at another thread count) or
// kAmpDesignFactor times the drift of ckverify's reference checkpoints of the other design on the same
// Case (the design floor: reentrant checkpoints, one recomputing from the inputs, one from detached
// leaves as torch's use_reentrant=True does), whichever is larger. Those are correct, yet they sum
// a shared tensor's gradient contributions in the autocast dtype where the plain graph sums them in fp32
// (a tied head; autocast caching one cast of a block input that q, k and v share): 0.1-0.2 of the group's
// whole AMP error, as large as a real bug's drift (a recompute with autocast off: 0.2-0.35), so no share
// of the error separates them; the groups they move do. The factor leaves room for a third correct
// summation order.
inline constexpr double kAmpDesignFactor = 2.0;
double amp_drift_allowance(double noise_floor, double design_floor);

// memory-saved (properties/memory_saved.cpp): the step's activation peak may reach kMemoryPeakFactor
// times the plan's estimate (the estimate counts the activations units keep, not autograd's
// bookkeeping or the temporaries a recompute allocates beside the gradients' own), plus a slack of
// kMemorySlackFraction
// of the baseline's activations and at least kMemoryMinSlack bytes (RNG states, scalars, bookkeeping
// tensors) for what is held after backward.
inline constexpr double kMemoryPeakFactor = 1.25;
inline constexpr int64_t kMemoryMinSlack = 4096;
inline constexpr double kMemorySlackFraction = 0.05;

// bench: a plan's loss curve may leave the plain run's by this much (relative) before it is reported as
// diverged. CPU fp32 replays are bitwise equal; a correct checkpoint that sums a shared gradient in
// another order moves a loss by rounding that the steps then carry (grad-baseline's reorder bound).
inline constexpr double kBenchLossTolerance = 1e-5;

// How far fp32 rounding moves one step, from the fp64 and fp32 evaluations of its tensors.
struct StepConditioning {
  double model_scale = 0.0;  // the largest finite |fp64| over the step's tensors
  double spread = 0.0;       // the worst err32 / scale over tensors with scale >= 1e-3 * model_scale
  std::string worst;         // index of that tensor among those measured, for messages
};
// e32[k] lists the fp32 evaluations of tensor k (the plain and the perturbed one).
using Fp32Evaluations = std::vector<const std::vector<double>*>;
StepConditioning step_conditioning(const std::vector<const std::vector<double>*>& e64,
                                   const std::vector<Fp32Evaluations>& e32);

// LibTorch fp32 vs the fp64 reference for one tensor, from the fp32 evaluation `e32` of the same
// reference and the step's conditioning.
struct ReferenceBound {
  Tolerance tol;
  bool checkable = true;
  std::string why_not;  // when not checkable
};
ReferenceBound reference_tolerance(const std::vector<double>& e64, const Fp32Evaluations& e32,
                                   const StepConditioning& step);
// The part of that bound that needs no fp32 evaluation: kReferenceFloor fp32 epsilons of the larger of
// the tensor's and the step's largest |fp64| (`model_scale`, as StepConditioning has it). Every
// checkable tensor is allowed at least this much, so a step whose every tensor is within it holds
// whatever the fp32 evaluations would show, and they are not run (observe.cpp).
Tolerance reference_floor_tolerance(const std::vector<double>& e64, double model_scale);
double reference_model_scale(const std::vector<const std::vector<double>*>& e64);

}  // namespace ckv
