// verifier/impls/parallel_fault.hpp: the tensor-parallel faults that live in the training framework, not in
// the checkpoint (the checkpoint is the builtin): named here so that the implementation table
// (registry.hpp) can list them without reaching up into the run stage, whose trainer applies them to
// the sharded model it builds (run/trainer.hpp). They show only on Cases with tp > 1.
#pragma once

namespace ckv {

enum class ParallelFault {
  none,
  same_stream_seed,        // the model-parallel stream seeded equally on every tensor-parallel rank
  replicated_from_stream,  // replicated dropout (attn_out, ffn_out) drawn from the model-parallel stream
};

}  // namespace ckv
