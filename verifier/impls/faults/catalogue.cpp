// verifier/impls/faults/catalogue.cpp: the fault catalogue in `ckverify list` order.
#include "verifier/impls/faults/faults.hpp"

namespace ckv::faults {

const std::vector<ImplEntry>& catalogue() {
  static const std::vector<ImplEntry> v = {
      no_preserve_rng(),         cpu_rng_only(),
      per_segment_state(),       replays_effects(),
      rng_left_advanced(),       keep_activations(),
      no_autocast_replay(),      default_dtype_replay(),
      recompute_twice(),         single_recompute(),
      no_version_check(),        unchecked_mask(),
      version_by_segment(),      raw_storage_copy(),
      no_restore_on_throw(),     inputs_only_grad(),
      frozen_input_shortcut(),   trains_frozen(),
      first_output_only(),       resume_no_rng(),
      resume_rng_before(),       resume_no_optimizer(),
      resume_no_running_stats(), resume_no_accumulation(),
      reentrant_hooks(),         nograd_forward_cache(),
      leaf_input_recompute(),    reentrant_no_autocast(),
      carry_input_grads(),       rng_ring(),
      static_shape_pad(),        thread_recompute_cache(),
      leaf_output_dropped(),     engine_only_rng(),
      step_weight_stash(),       tracker_not_replayed(),
      tracker_left_advanced(),   tracker_same_seed(),
      replicated_from_stream(),  reentrant_two_pass(),
      resume_no_tracker(),       reentrant_nested_backward(),
      grads_by_hand(),           late_bound_args(),
      keep_every_step(),
  };
  return v;
}

}  // namespace ckv::faults
