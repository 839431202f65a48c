// reference/tests/test_reference.cpp: the fp64 reference's self-check. Finite differences against the
// hand-written backward for every parameter kind and block option; planted errors that the check must
// catch; causality; and a hand-computed known answer for seed 001's lab block.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "reference/finite_diff.hpp"
#include "reference/transformer.hpp"

namespace ckv {
namespace {

constexpr double kFdThreshold = 1e-6;  // the reference's stated self-check bound (finite_diff.hpp metric)

ModelConfig small_config() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.ffn_mult = 2;
  c.vocab = 5;
  return c;
}

// Masks drawn here (not by LibTorch) so the reference tests need no LibTorch at all.
DropoutMasks random_masks(const ModelConfig& c, int B, int T, double p, uint64_t seed) {
  DropoutMasks m;
  m.p.fill(p);
  m.masks.resize(static_cast<size_t>(c.layers));
  SplitMix64 rng(seed);
  for (int l = 0; l < c.layers; ++l)
    for (DropoutSite s : kAllDropoutSites) {
      if (!c.attention && (s == DropoutSite::attn_probs || s == DropoutSite::attn_out)) continue;
      int64_t n = 1;
      for (auto d : dropout_site_shape(c, B, T, s)) n *= d;
      auto& v = m.masks[static_cast<size_t>(l)][static_cast<size_t>(s)];
      v.resize(static_cast<size_t>(n));
      for (auto& x : v) x = rng.uniform() < p ? 0.0 : 1.0;
    }
  return m;
}

struct Fixture {
  ModelConfig cfg;
  ParamSet params;
  CaseData data;
  DropoutMasks masks;
};
Fixture make_fixture(const ModelConfig& c, double p = 0.25, uint64_t seed = 7) {
  const int B = 2, T = 3;
  return {c, make_params(c, seed), make_case_data(c, B, T, seed), random_masks(c, B, T, p, seed + 1)};
}

using Options = std::tuple<NormKind, NormPlacement, Activation, bool /*attention*/, bool /*causal*/, LossKind>;
class FiniteDifference : public ::testing::TestWithParam<Options> {};

TEST_P(FiniteDifference, EveryGradientMatchesCentralDifferences) {
  ModelConfig c = small_config();
  std::tie(c.norm, c.placement, c.activation, c.attention, c.causal, c.loss) = GetParam();
  const Fixture f = make_fixture(c);
  const FdReport r = finite_difference_check(c, f.params, f.data, f.masks);
  ASSERT_EQ(r.tensors.size(), f.params.items.size() + 1) << "every parameter and x must be checked";
  EXPECT_LE(r.worst().rel_err, kFdThreshold) << r.describe();
}

std::string option_name(const ::testing::TestParamInfo<Options>& info) {
  const auto& [n, pl, a, attn, causal, loss] = info.param;
  return std::string(to_string(n)) + "_" + std::string(to_string(pl)) + "_" + std::string(to_string(a)) +
         (attn ? "_attn" : "_noattn") + (causal ? "_causal" : "_bidir") + "_" + std::string(to_string(loss));
}

INSTANTIATE_TEST_SUITE_P(AllBlockOptions, FiniteDifference,
                         ::testing::Combine(::testing::Values(NormKind::layer, NormKind::rms),
                                            ::testing::Values(NormPlacement::pre, NormPlacement::post),
                                            ::testing::Values(Activation::relu, Activation::gelu_tanh,
                                                              Activation::gelu_erf, Activation::swiglu),
                                            ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(LossKind::cross_entropy, LossKind::mse)),
                         option_name);

// ---- the model features the Case dimensions need: tied weights, key padding, auxiliary loss ----
struct Feature {
  const char* label;
  Tie tie;
  bool padding;
  double aux;
  NormPlacement placement;
  unsigned effects = 0;
  SegOut segout = SegOut::plain;
  RandOp rand = RandOp::none;
};
class FeatureFiniteDifference : public ::testing::TestWithParam<Feature> {};
TEST_P(FeatureFiniteDifference, EveryGradientMatchesCentralDifferences) {
  ModelConfig c = small_config();
  c.layers = 3;
  c.tie = GetParam().tie;
  c.key_padding = GetParam().padding;
  c.aux_weight = GetParam().aux;
  c.placement = GetParam().placement;
  c.effects = GetParam().effects;
  c.segout = GetParam().segout;
  c.rand = GetParam().rand;
  Fixture f = make_fixture(c);
  if (c.rand == RandOp::jitter) {  // the per-token eps, as LibTorch's first forward would have drawn them
    SplitMix64 rng(7);
    f.masks.jitter.resize(static_cast<size_t>(c.layers));
    for (auto& e : f.masks.jitter) {
      e.resize(static_cast<size_t>(f.data.batch * f.data.seq));
      for (auto& v : e) v = 3.0 * rng.normal();  // large, so that a jitter left out of a pass shows
    }
  }
  if (c.has(kNoise)) {  // the noise module's eps, as LibTorch's first forward would have drawn them
    SplitMix64 rng(99);
    f.masks.noise.resize(static_cast<size_t>(c.layers));
    for (auto& e : f.masks.noise) {
      e.resize(static_cast<size_t>(f.data.batch * f.data.seq * c.d_model));
      for (auto& v : e) v = rng.normal();
    }
  }
  const FdReport r =
      finite_difference_check(c, f.params, f.data, f.masks, ReferenceOptions{{}, RefScalar::fp64, 0.5, 2});
  ASSERT_EQ(r.tensors.size(), f.params.items.size() + 1);
  EXPECT_LE(r.worst().rel_err, kFdThreshold) << r.describe();
}
INSTANTIATE_TEST_SUITE_P(Features, FeatureFiniteDifference,
                         ::testing::Values(Feature{"tie_blocks", Tie::blocks, false, 0.0, NormPlacement::pre},
                                           Feature{"tie_head", Tie::head, false, 0.0, NormPlacement::post},
                                           Feature{"padding_aux", Tie::none, true, 0.05, NormPlacement::pre},
                                           Feature{"all", Tie::head, true, 0.01, NormPlacement::post},
                                           Feature{"batchnorm", Tie::none, false, 0.0, NormPlacement::pre, kBatchNorm},
                                           Feature{"effects_tied", Tie::blocks, false, 0.0, NormPlacement::post,
                                                   kBatchNorm | kNoise | kCache | kCounter},
                                           Feature{"carried_skip", Tie::blocks, true, 0.01, NormPlacement::pre, 0,
                                                   SegOut::alias},
                                           Feature{"jitter", Tie::none, false, 0.0, NormPlacement::post, kBatchNorm,
                                                   SegOut::plain, RandOp::jitter}),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(Features, TiedBlocksShareOneParameterSet) {
  ModelConfig c = small_config();
  c.layers = 4;
  c.tie = Tie::blocks;
  int block_params = 0;
  for (const auto& a : param_layout(c).items) {
    EXPECT_EQ(a.name.rfind("layer1", 0), std::string::npos) << a.name;
    block_params += a.name.rfind("layer0.", 0) == 0;
  }
  EXPECT_GT(block_params, 0);
  EXPECT_EQ(part_param_names(c, ModelPart::block_ffn, 3), part_param_names(c, ModelPart::block_ffn, 0));
}

TEST(Features, PaddedKeysDoNotReachAnyQuery) {
  ModelConfig c = small_config();
  c.key_padding = true;
  c.causal = false;
  Fixture f = make_fixture(c, 0.0);
  const auto base = reference_forward_backward(c, f.params, f.data, f.masks);
  const int T = f.data.seq, D = c.d_model, b = 1;  // batch element 1 sees keys < T-1: position T-1 is padding
  ASSERT_EQ(key_length(b, T), T - 1);
  for (int k = 0; k < D; ++k) f.data.x[static_cast<size_t>((b * T + T - 1) * D + k)] += 0.5 * (k % 3 - 1.0);
  const auto moved = reference_forward_backward(c, f.params, f.data, f.masks);
  // Layer 0's outputs at the other positions of batch element 1 cannot see the padded key.
  for (int t = 0; t < T - 1; ++t)
    for (int k = 0; k < D; ++k) {
      const size_t i = static_cast<size_t>((b * T + t) * D + k);
      EXPECT_EQ(moved.layer_out[0][i], base.layer_out[0][i]) << "t=" << t;
    }
}

// The carried skip is in the forward (finite differences alone would pass a reference that left it out of
// both passes): the logits move by the head of kSkipScale * x, and every layer output stays as it was.
TEST(Features, CarriedSkipAddsTheStackInputBeforeTheFinalNorm) {
  ModelConfig c = small_config();
  const Fixture f = make_fixture(c);
  const auto plain = reference_forward_backward(c, f.params, f.data, f.masks);
  for (SegOut out : {SegOut::alias, SegOut::view}) {
    c.segout = out;
    const auto skip = reference_forward_backward(c, f.params, f.data, f.masks);
    EXPECT_EQ(skip.layer_out, plain.layer_out);
    EXPECT_NE(skip.logits, plain.logits);
    EXPECT_NE(skip.dx, plain.dx);
  }
  ModelConfig tied = small_config();
  tied.tie = Tie::head;
  const Fixture t = make_fixture(tied);
  tied.segout = SegOut::alias;  // x is (B,T,vocab) there: nothing to add to the stack output
  EXPECT_THROW(reference_forward_backward(tied, t.params, t.data, t.masks), std::invalid_argument);
}

// The jitter is in the forward (finite differences alone would pass a reference that left it out of both
// passes): with eps given, layer outputs move; with eps 0 they are the plain ones.
TEST(Features, JitterScalesEachTokensFfnOutput) {
  ModelConfig c = small_config();
  Fixture f = make_fixture(c);
  const auto plain = reference_forward_backward(c, f.params, f.data, f.masks);
  c.rand = RandOp::jitter;
  f.masks.jitter.assign(static_cast<size_t>(c.layers),
                        std::vector<double>(static_cast<size_t>(f.data.batch * f.data.seq), 0.0));
  EXPECT_EQ(reference_forward_backward(c, f.params, f.data, f.masks).layer_out, plain.layer_out);
  f.masks.jitter[0][1] = 1.0;
  const auto jittered = reference_forward_backward(c, f.params, f.data, f.masks);
  EXPECT_NE(jittered.layer_out[0], plain.layer_out[0]);
  EXPECT_NE(jittered.dx, plain.dx);
  f.masks.jitter[0].pop_back();
  EXPECT_THROW(reference_forward_backward(c, f.params, f.data, f.masks), std::invalid_argument);
}

TEST(Features, Fp32EvaluationIsCloseToFp64) {
  ModelConfig c = small_config();
  c.aux_weight = 0.01;
  c.key_padding = true;
  const Fixture f = make_fixture(c);
  const auto e = reference_forward_backward(c, f.params, f.data, f.masks);
  const auto a = reference_forward_backward(c, f.params, f.data, f.masks, ReferenceOptions{{}, RefScalar::fp32, 1.0});
  EXPECT_NEAR(a.loss, e.loss, 1e-5 * std::abs(e.loss));
  bool differs = a.loss != e.loss;
  for (size_t k = 0; k < e.grads.items.size(); ++k)
    for (size_t i = 0; i < e.grads.items[k].data.size(); ++i) {
      const double ev = e.grads.items[k].data[i], av = a.grads.items[k].data[i];
      EXPECT_NEAR(av, ev, 1e-4 * (1.0 + std::abs(ev))) << e.grads.items[k].name;
      differs |= av != ev;
    }
  EXPECT_TRUE(differs) << "the fp32 evaluation must round like fp32, not be a copy of the fp64 one";
}

// ---- planted errors: the self-check must fail, and name the right tensors ----
struct Planted {
  const char* label;
  ReferenceFaults faults;
  const char* tensor_that_must_fail;
};
class PlantedBackwardError : public ::testing::TestWithParam<Planted> {};

TEST_P(PlantedBackwardError, IsCaughtByFiniteDifferences) {
  const Fixture f = make_fixture(small_config());
  const FdReport r = finite_difference_check(f.cfg, f.params, f.data, f.masks, ReferenceOptions{GetParam().faults});
  bool found = false;
  for (const auto& t : r.tensors)
    if (t.name == GetParam().tensor_that_must_fail) {
      found = true;
      EXPECT_GT(t.rel_err, 1e-2) << GetParam().label << " was not caught at " << t.name << "\n" << r.describe();
    }
  EXPECT_TRUE(found);
  EXPECT_GT(r.worst().rel_err, 1e3 * kFdThreshold) << r.describe();
}

ReferenceFaults with(bool ReferenceFaults::*field) {
  ReferenceFaults f;
  f.*field = true;
  return f;
}
INSTANTIATE_TEST_SUITE_P(
    Faults, PlantedBackwardError,
    ::testing::Values(
        Planted{"transposed_weight", with(&ReferenceFaults::transposed_attn_weight_grad), "layer1.attn.wq.weight"},
        Planted{"missing_dropout_scale_bwd", with(&ReferenceFaults::missing_dropout_scale_backward), "x"},
        Planted{"missing_dropout_scale_fwd", with(&ReferenceFaults::missing_dropout_scale_forward), "x"},
        Planted{"wrong_softmax_backward", with(&ReferenceFaults::wrong_softmax_backward), "layer0.attn.wk.weight"}),
    [](const auto& info) { return std::string(info.param.label); });

// A wrong causal mask is a forward error that backward follows consistently, so finite differences
// cannot see it; causality can. (verifier/tests also catches it against LibTorch.)
double max_change_before_last_position(const ReferenceFaults& faults) {
  ModelConfig c = small_config();
  c.causal = true;
  Fixture f = make_fixture(c, 0.0);
  const auto base = reference_forward_backward(c, f.params, f.data, f.masks, ReferenceOptions{faults});
  const int T = f.data.seq, D = c.d_model;
  for (int b = 0; b < f.data.batch; ++b)
    for (int k = 0; k < D; ++k)  // not a constant shift: LayerNorm would hide that
      f.data.x[static_cast<size_t>((b * T + T - 1) * D + k)] += 0.5 * (k % 3 - 1.0);
  const auto moved = reference_forward_backward(c, f.params, f.data, f.masks, ReferenceOptions{faults});
  double worst = 0.0;
  for (int b = 0; b < f.data.batch; ++b)
    for (int t = 0; t < T - 1; ++t)
      for (int k = 0; k < D; ++k) {
        const size_t i = static_cast<size_t>((b * T + t) * D + k);
        worst = std::max(worst, std::abs(moved.layer_out.back()[i] - base.layer_out.back()[i]));
      }
  return worst;
}
TEST(Causality, FuturePositionsDoNotReachThePast) {
  EXPECT_EQ(max_change_before_last_position({}), 0.0);
}
TEST(Causality, PlantedOffByOneMaskIsCaught) {
  EXPECT_GT(max_change_before_last_position(with(&ReferenceFaults::causal_mask_off_by_one)), 1e-3);
}

// ---- seed 001's lab block: LayerNorm -> Linear(D,4D) -> ReLU -> Linear(4D,D) plus residual ----
TEST(LabBlock, MatchesAHandComputedForward) {
  ModelConfig c;
  c.layers = 1;
  c.d_model = 4;
  c.heads = 1;
  c.ffn_mult = 4;
  c.vocab = 3;
  c.attention = false;
  c.activation = Activation::relu;
  c.norm = NormKind::layer;
  c.placement = NormPlacement::pre;
  const ParamSet p = make_params(c, 3);
  const CaseData d = make_case_data(c, 1, 2, 3);
  const auto r = reference_forward_backward(c, p, d, DropoutMasks::none(1));
  int block_params = 0;
  for (const auto& a : p.items) block_params += a.name.rfind("layer0.", 0) == 0;
  ASSERT_EQ(block_params, 6) << "the lab block has exactly one LayerNorm and two Linears";
  const int D = 4, F = 16;
  for (int t = 0; t < 2; ++t) {
    const double* x = &d.x[static_cast<size_t>(t * D)];
    double mean = 0, var = 0;
    for (int k = 0; k < D; ++k) mean += x[k] / D;
    for (int k = 0; k < D; ++k) var += (x[k] - mean) * (x[k] - mean) / D;
    double n[4], hid[16];
    for (int k = 0; k < D; ++k)
      n[k] =
          (x[k] - mean) / std::sqrt(var + kNormEps) * p.ptr("layer0.norm2.weight")[k] + p.ptr("layer0.norm2.bias")[k];
    for (int j = 0; j < F; ++j) {
      double z = p.ptr("layer0.ffn.fc1.bias")[j];
      for (int k = 0; k < D; ++k) z += p.ptr("layer0.ffn.fc1.weight")[j * D + k] * n[k];
      hid[j] = z > 0 ? z : 0;
    }
    for (int k = 0; k < D; ++k) {
      double y = x[k] + p.ptr("layer0.ffn.fc2.bias")[k];
      for (int j = 0; j < F; ++j) y += p.ptr("layer0.ffn.fc2.weight")[k * F + j] * hid[j];
      EXPECT_NEAR(r.layer_out[0][static_cast<size_t>(t * D + k)], y, 1e-12);
    }
  }
}

TEST(Birth, ParametersAreDeterministicAndFloatRepresentable) {
  const ModelConfig c = small_config();
  const ParamSet a = make_params(c, 42), b = make_params(c, 42), other = make_params(c, 43);
  ASSERT_EQ(a.items.size(), b.items.size());
  bool differs = false;
  for (size_t i = 0; i < a.items.size(); ++i) {
    EXPECT_EQ(a.items[i].data, b.items[i].data) << a.items[i].name;
    differs |= a.items[i].data != other.items[i].data;
    for (double v : a.items[i].data) ASSERT_EQ(v, static_cast<double>(static_cast<float>(v)));
  }
  EXPECT_TRUE(differs);
}

TEST(Inputs, WrongShapesAreRejected) {
  const ModelConfig c = small_config();
  Fixture f = make_fixture(c);
  f.data.x.pop_back();
  EXPECT_THROW(reference_loss(c, f.params, f.data, f.masks), std::invalid_argument);
}

}  // namespace
}  // namespace ckv
