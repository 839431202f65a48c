// properties/generators.hpp: RapidCheck generators for Cases (gen::build style), shared by the
// RapidCheck properties under ctest, `ckverify check` and `ckverify faults`. Every dimension a real bug
// needs is generated (frozen inputs and parameters, tied weights, hooks, micro-batches in both orders,
// gradient penalties, in-place inputs, multi-tensor segments, bf16 and fp16 autocast), each at its
// default most of the time. Sizes stay small so that one case costs tens of milliseconds on a CPU core,
// except a bounded share of deep, narrow Cases (gen_deep); shrinking drives every field towards its
// default (pick shrinks towards its first element).
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "verifier/case/case.hpp"
#include "verifier/checkpoint/compat.hpp"

namespace ckv {

struct CaseGenOptions {
  std::optional<Plan> plan;  // fixed plan, or any plan
  std::string impl = "builtin";
  std::string device = "cpu";
  bool allow_autocast = true;  // bf16 (and fp16 where the build has it) for some cases
  bool force_dropout = false;  // every site's rate >= 0.1
  // Case fields every generated Case takes as given, in line form ("fx=none prec=fp32"): the search
  // explores the rest (`check --only`). A combination the fields cannot take throws CaseError.
  std::string only;
  // The implementation is a strategy (check --strategy): every block a whole unit over the hidden state
  // alone (plan=block, segio=single, no tied input projection).
  bool strategy = false;
};

// Like gen::element, but shrinks towards earlier elements (gen::element does not shrink at all): the
// first element of every list below is the simplest value, so a shrunk Case keeps only the dimensions
// its failure needs.
template <class T, class... Ts>
rc::Gen<T> pick(T first, Ts... rest) {
  const std::vector<T> v{first, static_cast<T>(rest)...};
  return rc::gen::map(rc::gen::inRange<size_t>(0, v.size()), [v](size_t i) { return v[i]; });
}

inline rc::Gen<double> gen_rate(bool force) {
  if (force) return pick(0.1, 0.25, 0.5);
  return pick(0.0, 0.0, 0.1, 0.25, 0.5);
}

// d_model is drawn as the head dimension (4 or 8) and multiplied by heads below, so heads always
// divide it. Head dim 2 is left out: LayerNorm over 2 features is degenerate (ill-conditioned).
inline rc::Gen<ModelConfig> gen_model() {
  using namespace rc;
  return gen::map(
      gen::build<ModelConfig>(
          gen::set(&ModelConfig::layers, gen::inRange(1, 9)), gen::set(&ModelConfig::heads, pick(1, 2, 4)),
          gen::set(&ModelConfig::d_model, pick(4, 8)), gen::set(&ModelConfig::ffn_mult, gen::inRange(1, 5)),
          gen::set(&ModelConfig::vocab, gen::inRange(2, 12)),
          gen::set(&ModelConfig::norm, pick(NormKind::layer, NormKind::rms)),
          gen::set(&ModelConfig::placement, pick(NormPlacement::pre, NormPlacement::post)),
          gen::set(&ModelConfig::attention, pick(true, true, false)),
          gen::set(&ModelConfig::causal, gen::arbitrary<bool>()),
          gen::set(&ModelConfig::activation,
                   pick(Activation::relu, Activation::gelu_tanh, Activation::gelu_erf, Activation::swiglu)),
          gen::set(&ModelConfig::loss, pick(LossKind::cross_entropy, LossKind::mse)),
          gen::set(&ModelConfig::tie,
                   pick(Tie::none, Tie::none, Tie::none, Tie::none, Tie::none, Tie::blocks, Tie::head)),
          gen::set(&ModelConfig::key_padding, pick(false, false, true)),
          gen::set(&ModelConfig::effects, pick(0u, 0u, 0u, 0u, 0u, 0u, kCounter | kLog, kBatchNorm, kNoise, kCache,
                                               kCounter | kLog | kBatchNorm | kNoise | kCache, kExternal))),
      [](ModelConfig m) {
        m.d_model *= m.heads;
        m.aux_weight = m.key_padding ? kAuxWeight : 0.0;  // segio=multi
        return m;
      });
}

inline rc::Gen<Plan> gen_plan() {
  using namespace rc;
  return gen::build<Plan>(gen::set(&Plan::kind, pick(PlanKind::none, PlanKind::every_block, PlanKind::every_n,
                                                     PlanKind::segments, PlanKind::sqrt_segments, PlanKind::attn_only,
                                                     PlanKind::ffn_only, PlanKind::from_layer)),
                          gen::set(&Plan::n, gen::inRange(0, 8)));
}

inline rc::Gen<Precision> gen_precision(const CaseGenOptions& o) {
  using namespace rc;
  if (!o.allow_autocast) return gen::just(Precision::fp32);
  if (compat::kCpuFp16Autocast || o.device != "cpu")
    return pick(Precision::fp32, Precision::fp32, Precision::fp32, Precision::fp32, Precision::bf16, Precision::bf16,
                Precision::fp16);
  return pick(Precision::fp32, Precision::fp32, Precision::bf16);
}

// A bounded share of large-but-narrow Cases: a deep stack at the smallest width. Bugs that need many
// checkpointed calls waiting for their backward at once (a fixed-size ring of saved states that wraps,
// a leak that grows per call) only show there: more than 32 calls wait with layers > 32, or with
// sched=ffbb and micro-batches. One case in kDeepShare. Only the depth and the width come from here (the
// micro-batches, steps and schedule are the generator's own), so a failure that shrinking can show
// without the depth becomes a small Case again, and one that needs it keeps the shallowest depth.
struct DeepShape {
  bool on = false;
  int layers = 0;
};
inline constexpr int kDeepShare = 12;
inline constexpr int kDeepMinLayers = 12, kDeepMaxLayers = 40;
// Cases that run as ranks (tp or dp > 1): 3 draws in kTpDraws (gen_case_free).
inline constexpr int kTpDraws = 128;

inline rc::Gen<DeepShape> gen_deep() {
  using namespace rc;
  return gen::build<DeepShape>(
      gen::set(&DeepShape::on, gen::map(gen::inRange(0, kDeepShare), [](int i) { return i == kDeepShare - 1; })),
      gen::set(&DeepShape::layers, gen::inRange(kDeepMinLayers, kDeepMaxLayers + 1)));
}

inline void apply_deep(const DeepShape& d, Case& c) {
  if (!d.on) return;
  c.model.layers = d.layers;
  c.model.heads = 1, c.model.d_model = 4, c.model.ffn_mult = 1;
  c.batch = std::min(c.batch, 2), c.seq = std::min(c.seq, 4);
}

inline rc::Gen<Case> gen_case_free(const CaseGenOptions& o) {
  using namespace rc;
  const auto rates = gen::container<std::array<double, kNumDropoutSites>>(gen_rate(o.force_dropout));
  const auto plan = o.plan ? gen::just(*o.plan) : gen_plan();
  const auto shallow = gen::build<Case>(
      gen::set(&Case::model, gen_model()), gen::set(&Case::dropout, rates),
      gen::set(&Case::dropout_impl, pick(DropoutImpl::explicit_mask, DropoutImpl::native)),
      gen::set(&Case::seed, gen::noShrink(gen::inRange<uint64_t>(0, uint64_t{1} << 53))),
      gen::set(&Case::batch, gen::inRange(1, 4)), gen::set(&Case::seq, gen::inRange(1, 9)),
      gen::set(&Case::steps, gen::inRange(1, 4)), gen::set(&Case::micro, pick(1, 1, 1, 1, 2, 3)),
      gen::set(&Case::sched, pick(Schedule::fb, Schedule::ffbb)),
      gen::set(&Case::input_frozen, pick(false, false, false, false, true)),
      gen::set(&Case::freeze,
               pick(Freeze::none, Freeze::none, Freeze::none, Freeze::none, Freeze::alt, Freeze::blocks)),
      gen::set(&Case::hook, pick(Hook::none, Hook::none, Hook::none, Hook::none, Hook::scale, Hook::clip)),
      gen::set(&Case::gp, pick(0.0, 0.0, 0.0, 0.0, 0.0, 0.1)),
      gen::set(&Case::inplace, pick(false, false, false, false, true)),
      gen::set(&Case::opt, pick(Optimizer::sgd, Optimizer::sgd, Optimizer::adam)),
      gen::set(&Case::resume, pick(0, 0, 0, 1, 2, 3)), gen::set(&Case::precision, gen_precision(o)),
      gen::set(&Case::plan, plan),
      // Fields added later come last, so the earlier fields of a seed's Cases stay what they were.
      gen::set(&Case::inplace_on, pick(InplaceOn::input, InplaceOn::input, InplaceOn::mask, InplaceOn::param)),
      gen::set(&Case::inplace_micro, pick(0, 0, 1, 2)),
      gen::set(&Case::segin, pick(SegIn::plain, SegIn::plain, SegIn::plain, SegIn::plain, SegIn::plain, SegIn::view)),
      gen::set(&Case::seqvar, pick(0, 0, 0, 1, 2)));
  // The deep shape first: RapidCheck shrinks a pair's first element first, so a deep failing Case is
  // tried small (and shallower) before any of its other fields.
  // Model fields added later come after the Case, for the same reason.
  const auto segout = pick(SegOut::plain, SegOut::plain, SegOut::plain, SegOut::plain, SegOut::plain, SegOut::plain,
                           SegOut::plain, SegOut::plain, SegOut::alias, SegOut::view);
  // One Case in eight draws per-token jitter (random ops other than dropout and the noise module).
  const auto rand = pick(RandOp::none, RandOp::none, RandOp::none, RandOp::none, RandOp::none, RandOp::none,
                         RandOp::none, RandOp::jitter);
  // A bounded share of Cases that run as ranks (3 draws in kTpDraws: tp=2, tp=4 and dp=2 once each):
  // each runs as processes of its own, tens of times the cost of a case in one process (the two
  // degrees together: `--only`). Shrinking takes the draw to 0, tp=dp=1, first.
  const auto degrees = gen::map(gen::inRange(0, kTpDraws), [](int i) {
    if (i == kTpDraws - 1) return std::pair<int, int>{4, 1};
    if (i == kTpDraws - 2) return std::pair<int, int>{2, 1};
    if (i == kTpDraws - 3) return std::pair<int, int>{1, 2};
    return std::pair<int, int>{1, 1};
  });
  const auto tpkeep = pick(TpKeep::none, TpKeep::reduced);  // a tensor-parallel Case's selective plan, or not
  return gen::map(
      gen::tuple(gen_deep(), shallow, segout, rand, degrees, tpkeep),
      [o](std::tuple<DeepShape, Case, SegOut, RandOp, std::pair<int, int>, TpKeep> dc) {
        Case c = std::move(std::get<1>(dc));
        apply_deep(std::get<0>(dc), c);
        c.model.segout = std::get<2>(dc);
        c.model.rand = std::get<3>(dc);
        std::tie(c.tp, c.dp) = std::get<4>(dc);
        if (std::get<0>(dc).on || o.device != "cpu") c.tp = c.dp = 1;  // deep Cases test depth; ranks run on the CPU
        // A degree fixed by --only shapes the Case for it here (apply_only then finds it valid).
        for (std::istringstream only(o.only); only;) {
          std::string tok;
          only >> tok;
          if (tok == "tp=1" || tok == "tp=2" || tok == "tp=4") c.tp = tok[3] - '0';
          if (tok == "dp=1" || tok == "dp=2") c.dp = tok[3] - '0';
        }
        if (c.tp > 1 || c.dp > 1) c.gp = 0.0, c.inplace = false;  // what ranks do not run yet (case.cpp)
        if (c.tp > 1) {
          // A model that splits: tp heads (each of the drawn head dimension), so d and the FFN width
          // divide by tp too.
          c.tpkeep = std::get<5>(dc);
          if (c.model.heads % c.tp != 0) {
            c.model.d_model = c.model.d_model / c.model.heads * c.tp;
            c.model.heads = c.tp;
          }
        }
        if (c.dp > 1) {
          // The step's micro-batches split evenly between the replicas; no state kept across them (case.cpp).
          if (c.micro % c.dp != 0) c.micro += c.dp - c.micro % c.dp;
          c.model.effects &= ~static_cast<unsigned>(kBatchNorm | kCache);
        }
        if (c.model.tie == Tie::head) c.model.segout = SegOut::plain;  // no hidden-state input to carry (case.cpp)
        if (c.gp > 0.0) c.input_frozen = false;                        // the penalty is on dloss/dx
#if !CKV_TORCH_AT_LEAST(2, 0)
        // LibTorch 1.13's CPU autocast cannot run a tied head in bf16 (check_environment).
        if (c.device == "cpu" && c.model.tie == Tie::head && c.precision == Precision::bf16) c.model.tie = Tie::none;
#endif
        // Shapes vary across micro-batches only where there are several, and leave each at least one token.
        c.seqvar = c.micro < 2 ? 0 : std::min(c.seqvar, (c.seq - 1) / (c.micro - 1));
        if (c.model.has(kBatchNorm) && c.batch * min_seq(c) < 4)  // BatchNorm needs four values per channel (case.cpp)
          c.seq = (4 + c.batch - 1) / c.batch + c.seqvar * (c.micro - 1);
        if (c.resume > 0) {  // a save position inside the run (at a step boundary under sched=ffbb)
          const int total = c.steps * c.micro;
          c.resume = total < 2 ? 0 : 1 + (c.resume - 1) % (total - 1);
          if (c.sched == Schedule::ffbb || c.dp > 1) c.resume -= c.resume % c.micro;
        }
        if (o.strategy) {
          c.model.key_padding = false, c.model.aux_weight = 0.0;  // segio=single
          if (c.model.tie == Tie::head) c.model.tie = Tie::none;
          c.model.segout = SegOut::plain;  // blocks over the hidden state alone
        }
        // The in-place experiment's details only where it runs; the key mask only where segments receive one.
        c.inplace_micro %= c.micro;
        if (c.inplace_on == InplaceOn::mask && (!c.model.key_padding || seq_of(c, c.inplace_micro) < 2))
          c.inplace_on = InplaceOn::input;
        if (c.inplace_on == InplaceOn::param) {  // between micro-batches: before the forward of one after the first
          if (c.micro < 2)
            c.inplace_on = InplaceOn::input;
          else
            c.inplace_micro = std::max(c.inplace_micro, 1);
        }
        if (!c.inplace) c.inplace_on = InplaceOn::input, c.inplace_micro = 0;
        c.impl = o.impl;
        c.device = o.device;
        if (o.plan) {  // a fixed plan is kept as given: grow the stack until it fits
          if (c.plan.kind == PlanKind::segments) c.model.layers = std::max(c.model.layers, c.plan.n);
          if (c.plan.kind == PlanKind::from_layer) c.model.layers = std::max(c.model.layers, c.plan.n + 1);
          return c;
        }
        // Generated plan parameters depend on the layer count: fold them into range.
        const int L = c.model.layers;
        if (c.plan.kind == PlanKind::every_n || c.plan.kind == PlanKind::segments) c.plan.n = 1 + c.plan.n % L;
        if (c.plan.kind == PlanKind::from_layer) c.plan.n %= L;
        if (c.plan.kind != PlanKind::every_n && c.plan.kind != PlanKind::segments &&
            c.plan.kind != PlanKind::from_layer)
          c.plan.n = 0;
        if (!c.plan.invalid_for(L).empty()) c.plan = Plan{};
        return c;
      });
}

// The generated Case with the `--only` fields. Where they contradict a field the generator chose (gp>0
// fixed on a Case with a frozen input, fx=bn on one with too few values per channel, a resume position
// past a fixed step count), the generator's fields go back to their defaults, first one at a time and
// then cumulatively in line order, until the Case is valid; impl, device, seed and a fixed plan
// (`check --plan`) are kept. Only fixed fields that contradict each other (or the defaults) are an error.
inline Case apply_only(const Case& c, const std::string& only, bool plan_fixed) {
  auto key = [](const std::string& tok) { return tok.substr(0, tok.find('=')); };
  auto split = [](const std::string& line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    for (std::string t; in >> t;) out.push_back(t);
    return out;
  };
  auto join = [](const std::vector<std::string>& toks) {
    std::string out;
    for (const auto& t : toks) out += (out.empty() ? "" : " ") + t;
    return out;
  };
  std::string first_error;
  try {
    return case_from_line(to_line(c) + " " + only);
  } catch (const CaseError& e) {
    first_error = e.what();
  }
  std::vector<std::string> fixed = {"impl", "device", "seed"};
  if (plan_fixed) fixed.push_back("plan");  // check --plan
  for (const auto& t : split(only)) fixed.push_back(key(t));
  auto is_fixed = [&](const std::string& tok) {
    return std::find(fixed.begin(), fixed.end(), key(tok)) != fixed.end();
  };
  const std::vector<std::string> toks = split(to_line(c));
  for (size_t i = 0; i < toks.size(); ++i) {
    if (is_fixed(toks[i])) continue;
    std::vector<std::string> t = toks;
    t.erase(t.begin() + static_cast<std::ptrdiff_t>(i));
    try {
      return case_from_line(join(t) + " " + only);
    } catch (const CaseError&) {
    }
  }
  std::vector<std::string> t = toks;
  std::string last_error;
  for (size_t i = 0; i < t.size();) {
    if (is_fixed(t[i])) {
      ++i;
      continue;
    }
    t.erase(t.begin() + static_cast<std::ptrdiff_t>(i));
    try {
      return case_from_line(join(t) + " " + only);
    } catch (const CaseError& e) {
      last_error = e.what();
    }
  }
  // Every field the generator chose is back at its default: the fixed fields contradict each other or
  // the defaults, whatever was generated.
  if (!last_error.empty())
    throw CaseError("--only " + sanitize(only, 100) + " cannot apply with the other fields at their defaults: " +
                    last_error + " (fix those fields too with --only)");
  throw CaseError("--only " + sanitize(only, 100) + " cannot apply to the generated case " + to_line(c) + ": " +
                  first_error);
}

inline rc::Gen<Case> gen_case(const CaseGenOptions& o) {
  if (o.only.empty()) return gen_case_free(o);
  return rc::gen::map(gen_case_free(o),
                      [only = o.only, plan = o.plan.has_value()](const Case& c) { return apply_only(c, only, plan); });
}

// A counterexample reads as the Case line.
inline void showValue(const Case& c, std::ostream& os) {
  os << to_line(c);
}

}  // namespace ckv
