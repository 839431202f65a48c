// verifier/impls/faults/faults.hpp: the fault catalogue, one entry per file in this directory. Each
// fault is a small implementation behind the public interface that gets one thing wrong, and names the
// property that must kill it (ckverify faults proves that each one does).
#pragma once

#include "verifier/impls/registry.hpp"

namespace ckv::faults {

// Every fault below, in `ckverify list` order (catalogue.cpp; also built into the faults plugin).
const std::vector<ImplEntry>& catalogue();

// On ckverify's recompute frame (verifier/checkpoint/frame.hpp), one step broken:
ImplEntry no_preserve_rng();         // preserve_rng=false
ImplEntry cpu_rng_only();            // CUDA generators not replayed
ImplEntry no_autocast_replay();      // recompute under the backward's autocast state
ImplEntry default_dtype_replay();    // recompute under autocast with the device's default dtype
ImplEntry recompute_twice();         // recompute runs fn twice
ImplEntry no_restore_on_throw();     // global state restored only when the recompute succeeds
ImplEntry no_version_check();        // inputs modified in place are recomputed from silently
ImplEntry unchecked_mask();          // only inputs that require grad are checked for in-place changes
ImplEntry version_by_segment();      // the in-place check looks at the segment's latest call
ImplEntry step_weight_stash();       // parameters copied once per step, every recompute runs on the copy
ImplEntry raw_storage_copy();        // recomputes from input copies read as contiguous storage
ImplEntry single_recompute();        // a second backward through the segment fails
ImplEntry per_segment_state();       // RNG state kept per segment, not per call
ImplEntry rng_ring();                // RNG states in a ring of 32 slots that wraps
ImplEntry engine_only_rng();         // the CPU generator's engine replayed, not its cached normal
ImplEntry replays_effects();         // the recompute is not marked: side effects happen twice
ImplEntry rng_left_advanced();       // the generators are not put back after the recompute
ImplEntry keep_activations();        // recomputed activations kept alive until the step ends
ImplEntry thread_recompute_cache();  // the same, recomputed on a helper thread
// Wrappers around the builtin:
ImplEntry trains_frozen();          // turns on requires_grad of every declared parameter
ImplEntry frozen_input_shortcut();  // no tensor input requires grad: runs fn without a graph
ImplEntry first_output_only();      // only the first output keeps its graph
ImplEntry static_shape_pad();       // pads every call to the segment's longest sequence
ImplEntry late_bound_args();        // recomputes with the latest forward's non-tensor arguments
// Resume faults (resume_savers.cpp): the builtin checkpoint with a training-state saver that forgets
ImplEntry resume_no_rng();            // the generator states
ImplEntry resume_rng_before();        // the generators as they were after the step (saves them before it)
ImplEntry resume_no_optimizer();      // Adam's moments and step counts
ImplEntry resume_no_running_stats();  // BatchNorm's running statistics
ImplEntry resume_no_accumulation();   // the position inside the step (gradient accumulation)
ImplEntry resume_no_tracker();        // the model-parallel tracker's streams (tp > 1)
// On the reentrant skeleton (reentrant.hpp):
ImplEntry reentrant_hooks();        // a correct-looking reentrant checkpoint: parameter hooks run twice
ImplEntry nograd_forward_cache();   // its no-grad forward poisons autocast's cast cache
ImplEntry inputs_only_grad();       // differentiates only the inputs
ImplEntry leaf_input_recompute();   // recomputes from detached leaf inputs (the bf16 ulp bug)
ImplEntry reentrant_no_autocast();  // recomputes with autocast off
ImplEntry carry_input_grads();      // keeps a step's input gradients through the next step
ImplEntry keep_every_step();        // keeps every call's outputs for good
ImplEntry leaf_output_dropped();    // drops the gradient of an output that is an input
// Tensor parallelism (tensor_parallel.cpp; Cases with tp > 1):
ImplEntry tracker_not_replayed();       // the model-parallel stream is not replayed in the recompute
ImplEntry tracker_left_advanced();      // it is replayed, and left where the recompute left it
ImplEntry tracker_same_seed();          // the stream seeded equally on every rank (framework; builtin)
ImplEntry replicated_from_stream();     // replicated dropout drawn from the stream (framework; builtin)
ImplEntry reentrant_two_pass();         // the recompute differentiated in two passes: collectives twice
ImplEntry reentrant_nested_backward();  // a nested backward per segment: a dp hook fires twice
ImplEntry grads_by_hand();              // parameter gradients added by hand: the dp reducer never runs

}  // namespace ckv::faults
