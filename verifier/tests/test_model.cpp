// verifier/tests/test_model.cpp: the LibTorch model matches the Eigen fp64 reference, given the masks
// its dropout taps recorded, across block options and both dropout implementations; the comparison
// catches planted errors; the taps record what they should.
#include <gtest/gtest.h>

#include "properties/properties.hpp"
#include "verifier/model.hpp"
#include "verifier/runner.hpp"

namespace ckv {
namespace {

Case base_case() {
  Case c;
  c.model.layers = 2;
  c.model.d_model = 16;
  c.model.heads = 4;
  c.model.ffn_mult = 2;
  c.model.vocab = 7;
  c.batch = 2;
  c.seq = 5;
  c.dropout = {0.2, 0.1, 0.3, 0.15};
  c.seed = 11;
  return c;
}

std::string failures(const RunObservation& run, const ReferenceFaults& faults = {}) {
  std::string out;
  for (int s = 0; s < static_cast<int>(run.steps.size()); ++s)
    for (const auto& r : reference_comparisons(run, s, faults))
      if (!r.ok()) out += "step " + std::to_string(s) + " " + r.message() + "\n";
  return out;
}

// Every block option appears in at least one configuration, with and without dropout.
std::vector<Case> option_cases() {
  std::vector<Case> out;
  for (NormKind n : {NormKind::layer, NormKind::rms})
    for (NormPlacement pl : {NormPlacement::pre, NormPlacement::post})
      for (Activation a : {Activation::relu, Activation::gelu_tanh, Activation::gelu_erf, Activation::swiglu}) {
        Case c = base_case();
        c.model.norm = n;
        c.model.placement = pl;
        c.model.activation = a;
        c.model.causal = a != Activation::gelu_erf;
        c.model.loss = pl == NormPlacement::post ? LossKind::mse : LossKind::cross_entropy;
        c.seed = out.size() + 100;
        out.push_back(c);
      }
  Case lab = base_case();  // seed 001's lab block
  lab.model.attention = false;
  lab.model.activation = Activation::relu;
  lab.model.ffn_mult = 4;
  out.push_back(lab);
  return out;
}

TEST(ModelVsReference, Fp32LossAndAllGradientsMatchAcrossBlockOptions) {
  for (const Case& c : option_cases()) {
    for (DropoutImpl impl : {DropoutImpl::explicit_mask, DropoutImpl::native}) {
      Case k = c;
      k.dropout_impl = impl;
      k.steps = 2;  // the second step checks the parameters after an SGD step too
      const RunObservation run = run_case(k, nullptr);
      EXPECT_EQ(failures(run), "") << to_line(k);
      EXPECT_TRUE(grad_reference(run).held) << to_line(k);
    }
  }
}

TEST(ModelVsReference, ParameterNamesMatchTheReferenceLayout) {
  const Case c = base_case();
  DropoutTap tap(c.dropout_impl, c.dropout);
  TransformerImpl model(c.model, &tap);
  const ParamSet layout = param_layout(c.model);
  const auto named = model.named_parameters();
  ASSERT_EQ(named.size(), layout.items.size());
  for (const auto& a : layout.items) {
    ASSERT_TRUE(named.contains(a.name)) << a.name;
    EXPECT_EQ(named[a.name].sizes().vec(), a.shape) << a.name;
  }
}

// The comparison must fail on planted errors, and say where.
TEST(ModelVsReference, PlantedReferenceErrorsAreCaughtAndNamed) {
  const RunObservation run = run_case(base_case(), nullptr);
  ASSERT_EQ(failures(run), "");
  struct P {
    ReferenceFaults f;
    const char* expect_in_where;
  };
  ReferenceFaults transposed, scale_fwd, scale_bwd, softmax, causal;
  transposed.transposed_attn_weight_grad = true;
  scale_fwd.missing_dropout_scale_forward = true;
  scale_bwd.missing_dropout_scale_backward = true;
  softmax.wrong_softmax_backward = true;
  causal.causal_mask_off_by_one = true;
  for (const P& p : {P{transposed, "step 0 layer1.attn.wo.weight.grad"}, P{scale_fwd, "step 0 loss"},
                     P{scale_bwd, "step 0 layer1.ffn.fc2."}, P{softmax, "step 0 layer1.attn.wk.bias.grad"},
                     P{causal, "step 0 loss"}}) {
    const Finding f = grad_reference(run, p.f);
    EXPECT_FALSE(f.held);
    EXPECT_NE(f.where.find(p.expect_in_where), std::string::npos) << f.where << "\n" << f.detail;
    EXPECT_NE(f.detail.find("Mismatched elements"), std::string::npos) << f.detail;
  }
}

TEST(DropoutTap, RecordsOneFirstForwardCallPerSiteWithTheSiteShape) {
  Case c = base_case();
  c.steps = 2;
  const RunObservation run = run_case(c, nullptr);
  ASSERT_EQ(run.masks.size(), static_cast<size_t>(2 * c.model.layers * kNumDropoutSites));
  int64_t kept = 0, total = 0;
  for (const MaskRecord& r : run.masks) {
    EXPECT_EQ(r.call, 0);
    EXPECT_TRUE(r.grad_enabled);
    EXPECT_EQ(r.mask.sizes().vec(), dropout_site_shape(c.model, c.batch, c.seq, r.site));
    if (r.site == DropoutSite::ffn_hidden) {
      kept += r.mask.sum().item<int64_t>();
      total += r.mask.numel();
    }
  }
  // 640 draws at keep probability 0.7: the share is 0.7 +- 0.1 with overwhelming probability; the seed is fixed.
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(total), 0.7, 0.1);
}

TEST(DropoutTap, NativeMaskRecoveryReproducesTheOutput) {
  torch::manual_seed(3);
  DropoutTap tap(DropoutImpl::native, {0.0, 0.0, 0.4, 0.0});
  torch::Tensor x = torch::randn({4, 6});
  x.index_put_({0}, 0.0);  // a row of exact zeros: unknown positions
  const torch::Tensor out = tap.apply(x, 0, DropoutSite::ffn_hidden);
  const MaskRecord& r = tap.records().at(0);
  ASSERT_TRUE(r.known.defined());
  EXPECT_EQ(r.known.index({0}).sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::allclose(out, x * r.mask.to(torch::kFloat) / 0.6));
  EXPECT_GT(r.mask.logical_not().sum().item<int64_t>(), 0) << "some positions must have been dropped";
}

TEST(Model, RunsAreDeterministicPerSeed) {
  const Case c = base_case();
  const RunObservation a = run_case(c, nullptr), b = run_case(c, nullptr);
  EXPECT_EQ(a.steps[0].loss, b.steps[0].loss);
  EXPECT_EQ(a.steps[0].dx, b.steps[0].dx);
  Case other = c;
  other.seed = 12;
  EXPECT_NE(run_case(other, nullptr).steps[0].loss, a.steps[0].loss);
}

}  // namespace
}  // namespace ckv
