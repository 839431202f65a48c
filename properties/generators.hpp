// properties/generators.hpp: RapidCheck generators for Cases (gen::build style), shared by the
// RapidCheck properties under ctest and by `ckverify check`. Sizes are kept small so that one case
// (baseline + checkpointed run + reference + exception experiment) costs tens of milliseconds on a
// CPU core; shrinking drives every field towards the simplest value (1 layer, no dropout, ...).
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <optional>
#include <ostream>

#include "verifier/case.hpp"

namespace ckv {

struct CaseGenOptions {
  std::optional<Plan> plan;  // fixed plan, or any plan
  std::string impl = "builtin";
  std::string device = "cpu";
  bool allow_bf16 = true;      // a third of the cases run under bf16 autocast
  bool force_dropout = false;  // every site's rate >= 0.1 (for fault demonstrations)
};

inline rc::Gen<double> gen_rate(bool force) {
  if (force) return rc::gen::element(0.1, 0.25, 0.5);
  return rc::gen::element(0.0, 0.0, 0.1, 0.25, 0.5);
}

// d_model is drawn as the head dimension (4 or 8) and multiplied by heads below, so heads always
// divide it. Head dim 2 is left out: LayerNorm over 2 features is degenerate (ill-conditioned).
inline rc::Gen<ModelConfig> gen_model() {
  using namespace rc;
  return gen::map(
      gen::build<ModelConfig>(
          gen::set(&ModelConfig::layers, gen::inRange(1, 9)), gen::set(&ModelConfig::heads, gen::element(1, 2, 4)),
          gen::set(&ModelConfig::d_model, gen::element(4, 8)), gen::set(&ModelConfig::ffn_mult, gen::inRange(1, 5)),
          gen::set(&ModelConfig::vocab, gen::inRange(2, 12)),
          gen::set(&ModelConfig::norm, gen::element(NormKind::layer, NormKind::rms)),
          gen::set(&ModelConfig::placement, gen::element(NormPlacement::pre, NormPlacement::post)),
          gen::set(&ModelConfig::attention, gen::element(true, true, false)),
          gen::set(&ModelConfig::causal, gen::arbitrary<bool>()),
          gen::set(&ModelConfig::activation,
                   gen::element(Activation::relu, Activation::gelu_tanh, Activation::gelu_erf, Activation::swiglu)),
          gen::set(&ModelConfig::loss, gen::element(LossKind::cross_entropy, LossKind::mse))),
      [](ModelConfig m) {
        m.d_model *= m.heads;
        return m;
      });
}

inline rc::Gen<Plan> gen_plan() {
  using namespace rc;
  return gen::build<Plan>(
      gen::set(&Plan::kind,
               gen::element(PlanKind::none, PlanKind::every_block, PlanKind::every_n, PlanKind::segments,
                            PlanKind::sqrt_segments, PlanKind::attn_only, PlanKind::ffn_only, PlanKind::from_layer)),
      gen::set(&Plan::n, gen::inRange(0, 8)));
}

inline rc::Gen<Case> gen_case(const CaseGenOptions& o) {
  using namespace rc;
  const auto rates = gen::container<std::array<double, kNumDropoutSites>>(gen_rate(o.force_dropout));
  const auto precision =
      o.allow_bf16 ? gen::element(Precision::fp32, Precision::fp32, Precision::bf16) : gen::just(Precision::fp32);
  const auto plan = o.plan ? gen::just(*o.plan) : gen_plan();
  return gen::map(
      gen::build<Case>(gen::set(&Case::model, gen_model()), gen::set(&Case::dropout, rates),
                       gen::set(&Case::dropout_impl, gen::element(DropoutImpl::explicit_mask, DropoutImpl::native)),
                       gen::set(&Case::seed, gen::noShrink(gen::inRange<uint64_t>(0, uint64_t{1} << 53))),
                       gen::set(&Case::batch, gen::inRange(1, 4)), gen::set(&Case::seq, gen::inRange(1, 9)),
                       gen::set(&Case::steps, gen::inRange(1, 4)), gen::set(&Case::precision, precision),
                       gen::set(&Case::plan, plan)),
      [o](Case c) {
        if (o.plan) {  // a fixed plan is kept as given: grow the stack until it fits
          if (c.plan.kind == PlanKind::segments) c.model.layers = std::max(c.model.layers, c.plan.n);
          if (c.plan.kind == PlanKind::from_layer) c.model.layers = std::max(c.model.layers, c.plan.n + 1);
          c.impl = o.impl;
          c.device = o.device;
          return c;
        }
        // Generated plan parameters depend on the layer count: fold them into range.
        const int L = c.model.layers;
        if (c.plan.kind == PlanKind::every_n) c.plan.n = 1 + c.plan.n % L;
        if (c.plan.kind == PlanKind::segments) c.plan.n = 1 + c.plan.n % L;
        if (c.plan.kind == PlanKind::from_layer) c.plan.n %= L;
        if (c.plan.kind != PlanKind::every_n && c.plan.kind != PlanKind::segments &&
            c.plan.kind != PlanKind::from_layer)
          c.plan.n = 0;
        if (!c.plan.invalid_for(L).empty()) c.plan = Plan{};
        c.impl = o.impl;
        c.device = o.device;
        return c;
      });
}

// A counterexample reads as the Case line.
inline void showValue(const Case& c, std::ostream& os) {
  os << to_line(c);
}

}  // namespace ckv
