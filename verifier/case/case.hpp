// verifier/case/case.hpp: the Case, the one value that determines a run (DESIGN.md). It prints as one
// readable line and round-trips through JSON; everything ckverify does can be replayed from a Case
// file. One field table (case_fields()) drives the line form, the JSON form, validation, the limits
// and `ckverify list`: a field is spelled the same way everywhere (the line's key is the JSON key).
// Invalid cases are rejected with a CaseError whose message is one line naming the field and the
// allowed values. Torch-free, so tools and tests can use it without LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/config.hpp"
#include "verifier/case/plan.hpp"

namespace ckv {

// How dropout draws its mask: an explicit bernoulli mask from the current generator (ckverify's own
// instrumented dropout), or LibTorch's native torch::dropout with the mask recovered from its output
// (see model/site_tap.hpp for the zero-input caveat).
enum class DropoutImpl { explicit_mask, native };
// fp32: everything in float32. bf16 / fp16: the forward runs under autocast to that dtype.
enum class Precision { fp32, bf16, fp16 };
// Frozen parameters (requires_grad false): none; alt: every other parameter tensor in layout order
// (LoRA-style partial training, mixed inside every segment); blocks: every block parameter, so only
// the final norm and the head train.
enum class Freeze { none, alt, blocks };
// A gradient hook on every trainable parameter: scale multiplies the gradient by 0.5, clip clamps it
// to [-0.01, 0.01] (a non-linear transform: applying it per contribution differs from applying it once).
enum class Hook { none, scale, clip };
// Micro-batch order within a step: fb = forward, backward per micro-batch; ffbb = every forward first,
// then the backwards in reverse order (two live forwards of one segment at once).
enum class Schedule { fb, ffbb };
// Segment signature: single = fn(h) -> h; multi = fn(h, key_mask, start, stop, aux_weight) ->
// (h, aux_loss): several tensors in and out and non-tensor arguments (model: key padding, aux loss).
enum class SegIO { single, multi };
// The optimizer: plain SGD, or Adam (beta1 0.9, beta2 0.999, eps 1e-8, bias-corrected) whose moments
// and step count are training state a resume must carry.
enum class Optimizer { sgd, adam };
// What the in-place experiment (inplace=true) modifies between a forward and its backward: the hidden
// state a checkpointed segment received, or the bool key mask every segment receives (segio=multi; plain
// autograd does not save it, so a plain run's gradients are those of the forward that ran).
enum class InplaceOn { input, mask, param };
// How a segment's hidden-state input arrives: as the previous segment produced it (contiguous), or as a
// non-contiguous view with a storage offset of an equal-valued buffer (a view of a padded tensor, as a
// slice of a larger activation is).
enum class SegIn { plain, view };
// What a checkpointed segment keeps of its tensor-parallel regions (tp > 1): nothing (the recompute runs
// every region again, its forward all-reduce included), or each region's forward all-reduce output, so
// that the recompute runs only the rank's local ops (the selective plan that saves the communicated
// result; dist::leave_parallel's keep_in_checkpoint).
enum class TpKeep { none, reduced };

inline constexpr double kAuxWeight = 0.01;  // segio=multi: aux loss weight per block
inline constexpr double kClipHook = 0.01;   // hook=clip bound
inline constexpr double kAdamBeta1 = 0.9, kAdamBeta2 = 0.999, kAdamEps = 1e-8;  // opt=adam

std::string_view to_string(DropoutImpl v);
std::string_view to_string(Precision v);
std::string_view to_string(Freeze v);
std::string_view to_string(Hook v);
std::string_view to_string(Schedule v);
std::string_view to_string(SegIO v);
std::string_view to_string(Optimizer v);
std::string_view to_string(InplaceOn v);
std::string_view to_string(SegIn v);
std::string_view to_string(TpKeep v);

class CaseError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Case {
  ModelConfig model;
  std::array<double, kNumDropoutSites> dropout{};  // rate per site, indexed by DropoutSite
  DropoutImpl dropout_impl = DropoutImpl::explicit_mask;
  uint64_t seed = 1;
  int batch = 2;
  int seq = 8;
  // Shapes that vary across micro-batches (0: none): micro-batch m is seqvar * m tokens shorter than seq
  // (seq_of), so a segment sees a new shape within a step and the full one again at the next step.
  int seqvar = 0;
  int steps = 1;
  int micro = 1;  // micro-batches accumulated per optimizer step (no zero_grad between them)
  Schedule sched = Schedule::fb;
  double lr = 0.05;  // learning rate
  Optimizer opt = Optimizer::sgd;
  // Resume experiment (0: none): the run under test is saved to a state file after `resume`
  // micro-batches (step resume / micro, micro-batch resume % micro), loaded into a freshly built model
  // and optimizer, and continued to the end; the result must equal the uninterrupted run bitwise.
  int resume = 0;
  bool input_frozen = false;  // the block-stack input x does not require grad (frozen embedding)
  Freeze freeze = Freeze::none;
  Hook hook = Hook::none;
  double gp = 0.0;       // gradient penalty gp * |dL/dx|^2 through create_graph (0: none)
  bool inplace = false;  // also run the in-place experiment (refuses-inplace)
  InplaceOn inplace_on = InplaceOn::input;
  // The micro-batch whose forward the in-place experiment edits after; under sched=ffbb every forward of
  // the step runs first, so the edit lands while the later micro-batches' calls also wait for backward.
  // Under inplace_on=param (at least 1): the micro-batch before whose forward the parameters are edited,
  // every earlier one's forward and backward done.
  int inplace_micro = 0;
  SegIn segin = SegIn::plain;
  Precision precision = Precision::fp32;
  // Tensor-parallel degree (docs/parallel.md): 1, or the Case runs as tp processes joined over Gloo, each
  // holding heads/tp of the attention heads and d_ff/tp of the FFN (model/shard.hpp).
  int tp = 1;
  TpKeep tpkeep = TpKeep::none;
  // Data-parallel replicas (docs/parallel.md): 1, or 2: the step's micro-batches are split between two
  // replicas (each of tp ranks), whose gradients a DDP-style reducer averages after every backward.
  int dp = 1;
  std::string device = "cpu";  // "cpu", "cuda" or "cuda:N"
  Plan plan;
  std::string impl = "builtin";

  double p(DropoutSite s) const { return dropout[static_cast<size_t>(s)]; }
  SegIO segio() const { return model.key_padding ? SegIO::multi : SegIO::single; }
  // How many processes the Case runs as (1: ckverify's own).
  int ranks() const { return tp * dp; }
  bool operator==(const Case& o) const;
  bool operator!=(const Case& o) const { return !(*this == o); }
};

// One field of the table. `values` is what the help prints ("1..64", "none|alt|blocks").
struct CaseFieldInfo {
  std::string key, values, help;
  bool always_printed;  // printed in every line; the others only when not at their default
};
std::vector<CaseFieldInfo> case_field_infos();

// The sequence length of micro-batch m (seqvar shortens each later micro-batch of a step).
inline int seq_of(const Case& c, int micro) {
  return c.seq - c.seqvar * micro;
}
// The shortest sequence of any micro-batch.
inline int min_seq(const Case& c) {
  return seq_of(c, c.micro - 1);
}
// Tokens per optimizer step: batch x the sequence lengths of its micro-batches.
inline int64_t tokens_per_step(const Case& c) {
  int64_t n = 0;
  for (int m = 0; m < c.micro; ++m) n += static_cast<int64_t>(c.batch) * seq_of(c, m);
  return n;
}

// Why the model cannot be split over `tp` tensor-parallel ranks ("tp=2 needs heads divisible by it ..."),
// or "" when it can: heads and the FFN width must divide by it.
std::string tp_error(const ModelConfig& m, int tp);

// Throws CaseError naming the first invalid field or combination.
void validate(const Case& c);

// Rough peak memory of running the Case (both LibTorch runs, the experiments and the references), in
// bytes; check_environment compares it with the machine.
double estimated_bytes(const Case& c);
// The number of trainable values of the Case's model (embedding, blocks, head), roughly.
double estimated_parameters(const Case& c);

// One readable line: "layers=2 d=16 heads=2 ffn=4 vocab=11 norm=layernorm pos=pre attn=causal ...".
std::string to_line(const Case& c);
// Parses the line form (any subset of keys, the rest default); throws CaseError.
Case case_from_line(const std::string& line);

// Checks one key=value as its field alone does (known key, value within the field's limits), without the
// rules that join fields (those need the whole Case); throws CaseError.
void check_field_text(const std::string& key_value);

std::string to_json(const Case& c);            // pretty-printed JSON, the line's keys
Case case_from_json(const std::string& text);  // throws CaseError (malformed JSON included)
// Reads a Case file: a regular file of at most 1 MiB, JSON nested at most a few levels; throws CaseError.
Case load_case_file(const std::string& path);

// The side-effecting modules of a model (reference/config.hpp, Effect) as the Case line spells them:
// "none" or a comma list in a fixed order ("counter,bn").
std::string effects_to_string(unsigned effects);
bool effects_from_string(const std::string& s, unsigned& out, std::string& error);

// Messages quote user text through this: one printable line, at most `max` characters.
std::string sanitize(const std::string& s, size_t max = 80);

}  // namespace ckv
