// verifier/impls.cpp: see impls.hpp.
#include "verifier/impls.hpp"

#include <stdexcept>

#include "verifier/checkpoint.hpp"

namespace ckv {
namespace {
class VariantImpl : public CheckpointImpl {
 public:
  VariantImpl(std::string name, CheckpointOptions o, detail::Breakage b) : name_(std::move(name)), o_(o), b_(b) {}
  std::string name() const override { return name_; }
  torch::Tensor run(const SegmentFn& fn, const torch::Tensor& x, const std::vector<torch::Tensor>& params) override {
    // fn is copied: backward calls it long after this frame is gone.
    return detail::checkpoint_variant([fn](const std::vector<torch::Tensor>& in) { return fn(in.at(0)); }, {x}, params,
                                      o_, b_);
  }

 private:
  std::string name_;
  CheckpointOptions o_;
  detail::Breakage b_;
};
}  // namespace

const std::vector<ImplInfo>& known_impls() {
  static const std::vector<ImplInfo> v = {
      {"builtin", "ckverify's own checkpoint (verifier/checkpoint.hpp)", "", false, ""},
      {"no-preserve-rng", "the builtin with preserve_rng=false: recompute draws fresh dropout masks", "rng-replay", false, ""},
      {"cpu-rng-only", "restores the CPU generator but not the CUDA generators", "rng-replay", true, ""},
      {"no-autocast-replay", "recomputes under the backward's autocast state instead of the forward's", "grad-baseline", false, "prec=bf16"},
      {"leaf-input-recompute", "recomputes from detached leaf inputs, so autocast caches their casts (the bf16-ulp bug; post-LN, where block inputs feed linears directly)", "grad-baseline", false, "prec=bf16 pos=post"},
      {"inputs-only-grad", "differentiates only w.r.t. the segment inputs: parameters get no gradient", "grad-baseline", false, ""},
      {"recompute-twice", "runs the recompute twice in backward", "recompute-count", false, ""},
      {"no-restore-on-throw", "restores RNG, autocast and grad mode only when the recompute succeeds", "exception-safe", false, ""},
  };
  return v;
}

std::unique_ptr<CheckpointImpl> make_impl(const std::string& name) {
  CheckpointOptions o;
  detail::Breakage b;
  if (name == "builtin") {
  } else if (name == "no-preserve-rng") {
    o.preserve_rng = false;
  } else if (name == "cpu-rng-only") {
    b.cpu_rng_only = true;
  } else if (name == "no-autocast-replay") {
    b.skip_autocast_replay = true;
  } else if (name == "no-autocast-replay") {
    b.skip_autocast_replay = true;
  } else if (name == "leaf-input-recompute") {
    b.leaf_inputs = true;
  } else if (name == "inputs-only-grad") {
    b.inputs_only_grad = true;
  } else if (name == "recompute-twice") {
    b.recompute_twice = true;
  } else if (name == "no-restore-on-throw") {
    b.no_restore_on_throw = true;
  } else {
    std::string names;
    for (const auto& i : known_impls()) names += (names.empty() ? "" : "|") + i.name;
    throw std::invalid_argument("unknown implementation \"" + name + "\" (known: " + names + ")");
  }
  return std::make_unique<VariantImpl>(name, o, b);
}

}  // namespace ckv
