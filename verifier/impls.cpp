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

namespace {
struct Variant {
  ImplInfo info;
  CheckpointOptions options;
  detail::Breakage breakage;
};
detail::Breakage broken(bool detail::Breakage::*field) {
  detail::Breakage b;
  b.*field = true;
  return b;
}
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {{"builtin", "ckverify's own checkpoint (verifier/checkpoint.hpp)", "", false, ""}, {}, {}},
      {{"no-preserve-rng", "the builtin with preserve_rng=false: recompute draws fresh dropout masks", "rng-replay",
        false, ""},
       CheckpointOptions{false},
       {}},
      {{"cpu-rng-only", "restores the CPU generator but not the CUDA generators", "rng-replay", true, ""},
       {},
       broken(&detail::Breakage::cpu_rng_only)},
      {{"no-autocast-replay", "recomputes under the backward's autocast state instead of the forward's",
        "grad-baseline", false, "prec=bf16"},
       {},
       broken(&detail::Breakage::skip_autocast_replay)},
      {{"leaf-input-recompute",
        "recomputes from detached leaf inputs, so autocast caches their casts (the bf16-ulp bug; post-LN, where block "
        "inputs feed linears directly)",
        "grad-baseline", false, "prec=bf16 pos=post"},
       {},
       broken(&detail::Breakage::leaf_inputs)},
      {{"inputs-only-grad", "differentiates only w.r.t. the segment inputs: parameters get no gradient",
        "grad-baseline", false, ""},
       {},
       broken(&detail::Breakage::inputs_only_grad)},
      {{"recompute-twice", "runs the recompute twice in backward", "recompute-count", false, ""},
       {},
       broken(&detail::Breakage::recompute_twice)},
      {{"no-restore-on-throw", "restores RNG, autocast and grad mode only when the recompute succeeds",
        "exception-safe", false, ""},
       {},
       broken(&detail::Breakage::no_restore_on_throw)},
  };
  return v;
}
}  // namespace

const std::vector<ImplInfo>& known_impls() {
  static const std::vector<ImplInfo> infos = [] {
    std::vector<ImplInfo> out;
    for (const auto& v : variants()) out.push_back(v.info);
    return out;
  }();
  return infos;
}

std::unique_ptr<CheckpointImpl> make_impl(const std::string& name) {
  std::string names;
  for (const auto& v : variants()) {
    if (v.info.name == name) return std::make_unique<VariantImpl>(name, v.options, v.breakage);
    names += (names.empty() ? "" : "|") + v.info.name;
  }
  throw std::invalid_argument("unknown implementation \"" + name + "\" (known: " + names + ")");
}

}  // namespace ckv
