// verifier/tests/test_model.cpp: the LibTorch model matches the Eigen fp64 reference, given the masks
// its site taps recorded, across block options, the model features the Case dimensions add, both dropout
// implementations and several steps; grad-reference catches planted reference errors and names them;
// the taps record what they should.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <chrono>
#include <cmath>
#include <thread>

#include "properties/property.hpp"
#include "properties/tolerance.hpp"
#include "verifier/dist/rng_tracker.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/model/memory.hpp"
#include "verifier/model/model.hpp"
#include "verifier/run/bench.hpp"
#include "verifier/run/run.hpp"

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

Finding reference_finding(const Observations& o) {
  return grad_reference_property().judge(o);
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
  // The features the Case dimensions need.
  for (const char* extra :
       {"tie=blocks plan=every2", "tie=head plan=block", "segio=multi plan=seg2 attn=bidir", "segio=multi plan=attn",
        "micro=3 sched=ffbb plan=block", "hook=scale plan=block", "hook=clip micro=2", "freeze=alt plan=block",
        "freeze=blocks input=frozen plan=block", "input=frozen tie=head segio=multi plan=ffn"}) {
    out.push_back(case_from_line(to_line(base_case()) + " " + extra));
  }
  return out;
}

TEST(ModelVsReference, Fp32LossAndAllGradientsMatchAcrossOptionsAndFeatures) {
  auto builtin = make_builtin();
  for (const Case& c : option_cases()) {
    for (DropoutImpl impl : {DropoutImpl::explicit_mask, DropoutImpl::native}) {
      Case k = c;
      k.dropout_impl = impl;
      k.steps = 2;  // the second step checks the parameters after an SGD step too
      const Observations o = observe(k, *builtin, nullptr, ReferenceUse::always);
      ASSERT_TRUE(o.test.completed) << o.test.error;
      const Finding f = reference_finding(o);
      EXPECT_TRUE(f.applicable && f.held) << to_line(k) << "\n" << f.where << "\n" << f.detail;
    }
  }
}

// observe() skips a step's fp32 evaluations where they cannot change grad-reference's verdict; with
// them made for every step, the verdict is the same, and a step off fp64 by more than the floor gets them.
TEST(ModelVsReference, SkippedFp32EvaluationsChangeNoVerdict) {
  auto builtin = make_builtin();
  int skipped = 0, steps = 0;
  for (const Case& c : option_cases()) {
    Case k = c;
    k.steps = 2;
    const Observations lazy = observe(k, *builtin, nullptr, ReferenceUse::always);
    ASSERT_TRUE(lazy.reference.computed) << lazy.reference.why_not;
    Observations full = lazy;
    for (size_t s = 0; s < full.reference.fp64.size(); ++s) {
      ++steps;
      if (full.reference.fp32[s]) continue;
      ++skipped;
      EXPECT_TRUE(floor_comparisons(lazy, s).decides);
      full.reference.fp32[s] = Fp32Evaluation{expected_step(full, static_cast<int>(s), RefScalar::fp32),
                                              expected_step(full, static_cast<int>(s), RefScalar::fp32, {}, true)};
    }
    // grad-reference judges a step without fp32 evaluations from the comparisons observe() made to
    // decide; made again from the records, they give the same verdict.
    Observations remade = lazy;
    remade.reference.floor.clear();
    const Finding r = reference_finding(remade);
    const Finding a = reference_finding(lazy), b = reference_finding(full);
    EXPECT_EQ(a.held, r.held) << to_line(k);
    EXPECT_EQ(a.detail, r.detail) << to_line(k);
    EXPECT_EQ(a.applicable, b.applicable) << to_line(k) << "\n" << a.detail << "\n" << b.detail;
    EXPECT_EQ(a.held, b.held) << to_line(k) << "\n" << a.detail << "\n" << b.detail;
    EXPECT_EQ(a.where, b.where) << to_line(k);
    // The same steps with one gradient element moved past the floor, or made NaN, need them.
    for (size_t s = 0; s < lazy.reference.fp64.size(); ++s) {
      Observations moved = lazy, nan = lazy;
      std::vector<const std::vector<double>*> all64;
      const std::vector<ReferenceTensor> tensors = reference_tensors(lazy, s);
      for (const auto& x : tensors) all64.push_back(&x.e64);
      moved.test.steps[s].losses.at(0) +=
          2.0 * reference_floor_tolerance(tensors.at(0).e64, reference_model_scale(all64)).atol;
      nan.test.steps[s].losses.at(0) = std::nan("");
      EXPECT_FALSE(floor_comparisons(moved, s).decides) << to_line(k);
      EXPECT_FALSE(floor_comparisons(nan, s).decides) << to_line(k);
    }
  }
  // The skip is taken (it is what makes a verified case cheaper): on most steps of a correct run.
  EXPECT_GT(2 * skipped, steps) << skipped << " of " << steps;
}

TEST(ModelVsReference, ParameterNamesMatchTheReferenceLayoutInOrder) {
  for (const char* extra : {"", "tie=blocks layers=3", "tie=head", "act=swiglu attn=off"}) {
    const Case c = case_from_line(to_line(base_case()) + " " + extra);
    SiteTap tap(c.dropout_impl, c.dropout);
    TransformerImpl model(c.model, &tap);
    const ParamSet layout = param_layout(c.model);
    const auto named = model.named_parameters();
    ASSERT_EQ(named.size(), layout.items.size()) << extra;
    for (size_t i = 0; i < layout.items.size(); ++i) {
      EXPECT_EQ(named.pairs()[i].first, layout.items[i].name) << extra;
      EXPECT_EQ(named.pairs()[i].second.sizes().vec(), layout.items[i].shape) << layout.items[i].name;
    }
  }
}

// named_params() is taken once in the constructor: it must stay the module's own parameters, in order,
// after Module::to() (which swaps each parameter's data) and after load().
TEST(ModelVsReference, NamedParamsStayTheModulesParameters) {
  for (const char* extra : {"", "tie=blocks layers=3", "act=swiglu attn=off norm=rmsnorm"}) {
    const Case c = case_from_line(to_line(base_case()) + " " + extra);
    SiteTap tap(c.dropout_impl, c.dropout);
    TransformerImpl model(c.model, &tap);
    model.to(torch::kDouble);
    model.load(make_params(c.model, 7));
    const auto named = model.named_parameters();
    const auto& cached = model.named_params();
    ASSERT_EQ(cached.size(), named.size()) << extra;
    for (size_t i = 0; i < cached.size(); ++i) {
      EXPECT_EQ(cached[i].first, named.pairs()[i].first) << extra;
      EXPECT_TRUE(cached[i].second.is_same(named.pairs()[i].second)) << cached[i].first;
      EXPECT_EQ(cached[i].second.scalar_type(), torch::kDouble) << cached[i].first;
    }
    // values() reads through them: what load() wrote.
    EXPECT_EQ(model.values().items, make_params(c.model, 7).items) << extra;
  }
}

// grad-reference must fail on planted reference errors, and say where.
TEST(ModelVsReference, PlantedReferenceErrorsAreCaughtAndNamed) {
  auto builtin = make_builtin();
  const Observations clean = observe(base_case(), *builtin, nullptr, ReferenceUse::always);
  ASSERT_TRUE(reference_finding(clean).held) << reference_finding(clean).detail;
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
    Observations o = clean;
    // The planted error is in the reference's code, so both of its evaluations carry it.
    o.reference.fp64[0] = expected_step(o, 0, RefScalar::fp64, p.f);
    o.reference.fp32[0] = Fp32Evaluation{expected_step(o, 0, RefScalar::fp32, p.f),
                                         expected_step(o, 0, RefScalar::fp32, p.f, /*perturb=*/true)};
    const Finding f = reference_finding(o);
    EXPECT_FALSE(f.held);
    EXPECT_NE(f.where.find(p.expect_in_where), std::string::npos) << f.where << "\n" << f.detail;
    EXPECT_NE(f.detail.find("Mismatched elements"), std::string::npos) << f.detail;
  }
}

// Where the run under test reproduced plain autograd bit for bit in all the reference reads and compares,
// grad-reference's verdict would be the baseline's: observe() does not evaluate the reference, and says
// why. Any difference in a compared value or a first-forward draw makes it evaluate it again; so does a
// correct run whose rounding differs (the reference then holds it).
TEST(ModelVsReference, NotEvaluatedWhereTheRunReproducesPlainAutogradBitForBit) {
  auto builtin = make_builtin();
  const Case k = case_from_line(
      "layers=2 d=16 heads=4 drop=0.2 act=relu fx=bn,noise rand=jitter micro=2 steps=2 "
      "plan=block seed=4");
  const Observations o = observe(k, *builtin);
  ASSERT_TRUE(o.test.completed) << o.test.error;
  EXPECT_FALSE(o.reference.computed);
  EXPECT_NE(o.reference.why_not.find("reproduced plain autograd bit for bit"), std::string::npos)
      << o.reference.why_not;
  const Finding f = reference_finding(o);
  EXPECT_FALSE(f.applicable);
  EXPECT_EQ(f.detail, o.reference.why_not);

  ASSERT_TRUE(reproduces_bitwise(o.test, o.baseline));
  ASSERT_FALSE(o.test.sites.empty());
  ASSERT_FALSE(o.test.relu.empty());
  ASSERT_FALSE(o.test.noise.empty());
  ASSERT_FALSE(o.test.jitter.empty());
  ASSERT_FALSE(o.test.steps[1].ledger.batchnorm.items.empty());
  auto differs = [&](const char* what, auto edit) {
    RunRecord t = o.test;
    edit(t);
    EXPECT_FALSE(reproduces_bitwise(t, o.baseline)) << what;
  };
  auto next = [](double v) { return std::nextafter(v, 1e300); };
  differs("a loss", [&](RunRecord& t) { t.steps[1].losses[1] = next(t.steps[1].losses[1]); });
  differs("NaN losses on both sides", [&](RunRecord& t) {
    RunRecord b = o.baseline;
    t.steps[0].losses[0] = b.steps[0].losses[0] = std::nan("");
    EXPECT_FALSE(reproduces_bitwise(t, b));
  });
  differs("a gradient",
          [&](RunRecord& t) { t.steps[1].grads.items[3].data[0] = next(t.steps[1].grads.items[3].data[0]); });
  differs("a gradient left undefined", [&](RunRecord& t) { t.steps[0].grad_defined[2] = !t.steps[0].grad_defined[2]; });
  differs("x.grad", [&](RunRecord& t) { t.steps[0].dx[1][5] = next(t.steps[0].dx[1][5]); });
  differs("BatchNorm statistics", [&](RunRecord& t) {
    auto& v = t.steps[1].ledger.batchnorm.items[0].data[0];
    v = next(v);
  });
  differs("a step fewer", [&](RunRecord& t) { t.steps.pop_back(); });
  differs("a dropout mask", [&](RunRecord& t) {
    for (SiteCall& r : t.sites)
      if (r.mask.defined()) {
        r.mask = r.mask.clone();
        r.mask.view(-1)[0] = !r.mask.view(-1)[0].item<bool>();
        return;
      }
  });
  // The last first-forward record of a list (call 0: the draws the reference reads).
  auto last_first = [](auto& records) -> auto& {
    for (size_t i = records.size(); i-- > 0;)
      if (records[i].call == 0) return records[i];
    throw std::logic_error("no first-forward record");
  };
  differs("a ReLU side", [&](RunRecord& t) {
    auto& r = last_first(t.relu);
    r.positive = r.positive.logical_not();
  });
  differs("a noise eps", [&](RunRecord& t) { last_first(t.noise).eps = last_first(t.noise).eps * 2; });
  differs("a jitter eps", [&](RunRecord& t) { last_first(t.jitter).eps = last_first(t.jitter).eps + 1; });
  differs("a draw missing", [&](RunRecord& t) { t.sites.erase(t.sites.begin()); });
  // The recompute's draws are rng-replay's: the reference reads the first forward's only.
  RunRecord recomputed = o.test;
  SiteCall again = recomputed.sites.front();
  again.call = 1, again.phase = 1;
  if (again.mask.defined()) again.mask = again.mask.logical_not();
  recomputed.sites.push_back(again);
  EXPECT_TRUE(reproduces_bitwise(recomputed, o.baseline));

  // A correct checkpoint whose outputs are rounded differently (x * 3 / 3 in fp32): the reference judges
  // it, and it holds.
  struct Rounds : CheckpointImpl {
    std::unique_ptr<CheckpointImpl> inner = make_builtin();
    std::vector<torch::Tensor> run(const SegmentCall& call) override {
      auto out = inner->run(call);
      for (auto& t : out)
        if (t.defined() && t.is_floating_point()) t = t * 3 / 3;
      return out;
    }
  };
  Rounds rounds;
  const Observations r = observe(k, rounds);
  ASSERT_TRUE(r.test.completed) << r.test.error;
  ASSERT_FALSE(reproduces_bitwise(r.test, r.baseline));
  EXPECT_TRUE(r.reference.computed) << r.reference.why_not;
  const Finding held = reference_finding(r);
  EXPECT_TRUE(held.applicable && held.held) << held.where << "\n" << held.detail;
}

TEST(SiteTap, RecordsOneFirstForwardCallPerSiteWithTheSiteShapeAndState) {
  Case c = base_case();
  c.steps = 2;
  c.micro = 2;
  const RunRecord run = train(c, nullptr);
  ASSERT_TRUE(run.completed) << run.error;
  ASSERT_EQ(run.sites.size(), static_cast<size_t>(2 * 2 * c.model.layers * kNumDropoutSites));
  int64_t kept = 0, total = 0;
  for (const SiteCall& r : run.sites) {
    EXPECT_EQ(r.call, 0);
    EXPECT_EQ(r.phase, 0);
    EXPECT_TRUE(r.grad_enabled);
    EXPECT_FALSE(r.autocast.cpu_enabled);
    EXPECT_EQ(r.mask.sizes().vec(), dropout_site_shape(c.model, c.batch, c.seq, r.site));
    if (r.site == DropoutSite::ffn_hidden) {
      kept += r.mask.sum().item<int64_t>();
      total += r.mask.numel();
    }
  }
  // 1280 draws at keep probability 0.7: the share is 0.7 +- 0.1 with overwhelming probability; the seed is fixed.
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(total), 0.7, 0.1);
}

TEST(SiteTap, NativeMaskRecoveryReproducesTheOutput) {
  torch::manual_seed(3);
  SiteTap tap(DropoutImpl::native, {0.0, 0.0, 0.4, 0.0});
  torch::Tensor x = torch::randn({4, 6});
  x.index_put_({0}, 0.0);  // a row of exact zeros: unknown positions
  const torch::Tensor out = tap.apply(x, 0, DropoutSite::ffn_hidden);
  const SiteCall& r = tap.calls().at(0);
  ASSERT_TRUE(r.known.defined());
  EXPECT_EQ(r.known.index({0}).sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::allclose(out, x * r.mask.to(torch::kFloat) / 0.6));
  EXPECT_GT(r.mask.logical_not().sum().item<int64_t>(), 0) << "some positions must have been dropped";
  tap.apply(x, 0, DropoutSite::attn_out);  // rate 0: recorded without a mask
  EXPECT_FALSE(tap.calls().at(1).mask.defined());
}

TEST(Model, RunsAreDeterministicPerSeed) {
  const Case c = base_case();
  const RunRecord a = train(c, nullptr), b = train(c, nullptr);
  EXPECT_EQ(a.steps[0].losses, b.steps[0].losses);
  EXPECT_EQ(a.steps[0].dx, b.steps[0].dx);
  Case other = c;
  other.seed = 12;
  EXPECT_NE(train(other, nullptr).steps[0].losses, a.steps[0].losses);
}

// SegmentCall::generators (interface.hpp): fn forks a model-parallel tracker's stream. Run plainly (impl
// null) or through `impl`, shown the stream or not: x's gradient, and the stream's state before and after
// backward.
struct StreamRun {
  torch::Tensor grad, stream_before_backward, stream_after;
};
StreamRun run_with_stream(CheckpointImpl* impl, bool show) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({4, 6}).requires_grad_();
  auto tracker = std::make_shared<dist::RngTracker>();
  tracker->add(kModelParallelStream, 77);
  torch::manual_seed(9);
  const SegmentFunction fn = [tracker](const std::vector<c10::IValue>& a) {
    const torch::Tensor in = a.at(0).toTensor();
    torch::Tensor keep_mp;
    {
      const auto fork = tracker->fork(kModelParallelStream);
      keep_mp = torch::empty_like(in).bernoulli_(0.5);
    }
    const torch::Tensor keep = torch::empty_like(in).bernoulli_(0.5);  // the default generator
    return std::vector<torch::Tensor>{in.sin() * keep_mp * keep};
  };
  torch::Tensor out;
  if (!impl) {
    out = fn({x})[0];
  } else {
    SegmentCall call;
    call.fn = fn;
    call.args = {x};
    if (show) call.generators = tracker->generators();
    out = impl->run(call).at(0);
  }
  StreamRun r;
  r.stream_before_backward = tracker->generators().at(0).get_state();
  out.sum().backward();
  r.grad = x.grad();
  r.stream_after = tracker->generators().at(0).get_state();
  return r;
}

// The builtin replays the generators a call shows it and leaves them after the recompute as it found
// them; not shown the stream, its recompute forks it where the forward left it: other masks, other
// gradients (the bug of a tracker not restored in the recompute).
TEST(ImplInterface, TheBuiltinReplaysTheGeneratorsACallShowsIt) {
  const StreamRun plain = run_with_stream(nullptr, false);
  const StreamRun shown = run_with_stream(make_builtin().get(), true);
  const StreamRun unshown = run_with_stream(make_builtin().get(), false);
  EXPECT_TRUE(torch::equal(shown.grad, plain.grad));
  EXPECT_TRUE(torch::equal(shown.stream_after, shown.stream_before_backward));
  EXPECT_FALSE(torch::equal(unshown.grad, plain.grad));
}

// Through the Python bridge the segment carries them as torch.Generator objects (segment.generators):
// the torch_checkpoint adapter's non-reentrant checkpoint replays them; torch's reentrant one cannot
// (it takes no context_fn) and recomputes other masks.
TEST(ImplInterface, PythonImplementationsAreShownTheGeneratorsToo) {
#ifdef CKV_TEST_PYTHON
  const StreamRun plain = run_with_stream(nullptr, false);
  const StreamRun shown = run_with_stream(make_impl("py:ckverify.adapters:torch_checkpoint").get(), true);
  EXPECT_TRUE(torch::equal(shown.grad, plain.grad));
  EXPECT_TRUE(torch::equal(shown.stream_after, shown.stream_before_backward));
  const StreamRun reentrant = run_with_stream(
      make_impl("py:ckverify.adapters:torch_checkpoint:use_reentrant=true,recompute_aware=false").get(), true);
  EXPECT_FALSE(torch::equal(reentrant.grad, plain.grad));
#else
  GTEST_SKIP() << "this build has no Python bridge (the floor build)";
#endif
}

// ---- memory measurement (verifier/model/memory.hpp) ----

TEST(Memory, AccountsChargeTheBytesOfTheTensorsAllocatedWhileCurrent) {
  MemoryReporting reporting;
  MemoryAccount a(c10::DeviceType::CPU), b(c10::DeviceType::CPU);
  torch::Tensor kept;
  {
    ChargeTo charge(&a);
    kept = torch::empty({1000}, torch::kFloat);                          // 4000 bytes
    { const torch::Tensor temp = torch::empty({500}, torch::kDouble); }  // 4000 bytes, freed at once
    {
      ChargeTo none(nullptr);
      const torch::Tensor uncharged = torch::empty({10000}, torch::kFloat);
      EXPECT_EQ(a.live(), 4000);
    }
  }
  EXPECT_EQ(a.live(), 4000);
  EXPECT_EQ(a.peak(), 8000);
  {
    ChargeTo charge(&b);  // a free goes back to the account that allocated, whichever is current
    kept = torch::Tensor();
    const torch::Tensor t = torch::empty({250}, torch::kFloat);
    EXPECT_EQ(b.live(), 1000);
  }
  EXPECT_EQ(a.live(), 0);
  EXPECT_EQ(b.live(), 0);
  a.reset_peak();
  EXPECT_EQ(a.peak(), 0);
}

// Allocations and frees on a thread LibTorch's thread-local hook does not reach (one the
// implementation starts itself) are charged too, on CPU: a recompute on a helper thread is measured.
TEST(Memory, AllocationsOnThreadsStartedElsewhereAreCharged) {
  MemoryReporting reporting;
  MemoryAccount a(c10::DeviceType::CPU);
  ChargeTo charge(&a);
  torch::Tensor kept;
  std::thread([&] {
    kept = torch::empty({1000}, torch::kFloat);                         // 4000 bytes, kept
    { const torch::Tensor temp = torch::empty({250}, torch::kFloat); }  // 1000 bytes, freed there
  }).join();
  EXPECT_EQ(a.live(), 4000);
  EXPECT_EQ(a.peak(), 5000);
  std::thread([&] { kept = torch::Tensor(); }).join();  // freed on another thread again
  EXPECT_EQ(a.live(), 0);
}

TEST(Memory, NothingIsReportedOutsideAReportingScope) {
  MemoryAccount a(c10::DeviceType::CPU);
  ChargeTo charge(&a);
  const torch::Tensor t = torch::empty({1000}, torch::kFloat);
  EXPECT_EQ(a.live(), 0);
}

TEST(Memory, TheRunStageRecordsEveryStepAndPerUnitLevels) {
  Case c = base_case();
  c.steps = 2;
  const RunRecord r = train(c, nullptr);
  ASSERT_EQ(r.memory.steps.size(), 2u);
  for (const StepMemory& s : r.memory.steps) {
    EXPECT_GT(s.after_forward, s.before);
    EXPECT_GE(s.peak, s.after_forward);
    EXPECT_LT(s.after_backward, s.after_forward) << "backward frees the activations";
  }
  // The same step twice holds the same bytes: the instruments (tap records, generator captures) are not
  // charged to the run.
  EXPECT_EQ(r.memory.steps[0].before, r.memory.steps[1].before);
  EXPECT_EQ(r.memory.steps[0].peak, r.memory.steps[1].peak);
  EXPECT_EQ(r.memory.unit_levels.size(), static_cast<size_t>(c.model.layers));
  for (size_t i = 1; i < r.memory.unit_levels.size(); ++i)
    EXPECT_GT(r.memory.unit_levels[i], r.memory.unit_levels[i - 1]) << "each block keeps activations";
  EXPECT_GT(r.memory.params, 0);
  ASSERT_EQ(r.times.size(), 2u);
  EXPECT_EQ(r.times[0].unit_forward.size(), static_cast<size_t>(c.model.layers));
}

// ---- bench (verifier/run/bench.hpp) ----

TEST(Bench, GrowthFitRecoversTheExponentDespiteAConstant) {
  for (const double k : {0.5, 1.0}) {
    std::vector<std::pair<double, double>> pts;
    for (const double L : {4.0, 9.0, 16.0, 25.0, 36.0}) pts.emplace_back(L, 5000.0 + 300.0 * std::pow(L, k));
    const GrowthFit f = fit_growth(pts);
    EXPECT_NEAR(f.k, k, 1e-9);
    EXPECT_NEAR(f.c, 5000.0, 1e-3);
    EXPECT_NEAR(f.a, 300.0, 1e-3);
  }
}

// Every round runs every row once, and over 2n rounds each row runs right after each other row exactly
// as often as right before it (the rows' order alone made one of two identical implementations
// "faster": with the order only rotated, the second always ran right after the first).
TEST(Bench, RoundOrderIsBalanced) {
  for (size_t n = 1; n <= 6; ++n) {
    std::map<std::pair<size_t, size_t>, int> after;  // (earlier, later) adjacent in one round
    for (int round = 0; round < static_cast<int>(2 * n); ++round) {
      std::vector<size_t> order = bench_round_order(n, round);
      for (size_t k = 1; k < order.size(); ++k) ++after[{order[k - 1], order[k]}];
      std::sort(order.begin(), order.end());
      for (size_t k = 0; k < n; ++k) ASSERT_EQ(order[k], k) << "n " << n << " round " << round;
    }
    for (const auto& [pair, count] : after) {
      const auto back = after.find({pair.second, pair.first});
      EXPECT_EQ(count, back == after.end() ? 0 : back->second)
          << "n " << n << ": row " << pair.second << " after row " << pair.first;
    }
  }
}

TEST(Bench, PlansTrainIdenticallyAndCheckpointingKeepsLess) {
  Case c = case_from_line("layers=4 d=16 heads=2 ffn=4 vocab=7 batch=2 seq=16 seed=3");
  BenchOptions o;
  o.warmup = 0, o.repeats = 2, o.max_repeats = 2, o.growth = true, o.growth_layers = {1, 4, 9};
  std::vector<Plan> plans;
  for (const char* s : {"none", "block", "sqrt"}) {
    Plan p;
    std::string err;
    ASSERT_TRUE(Plan::parse(s, p, err));
    plans.push_back(p);
  }
  const BenchResult r = run_bench(c, plans, {{"builtin", [] { return make_builtin(); }}}, o);
  ASSERT_EQ(r.plans.size(), 3u);
  for (const PlanBench& p : r.plans) {
    ASSERT_TRUE(p.completed) << p.plan << ": " << p.error;
    EXPECT_EQ(p.losses.size(), 2u) << p.plan;
    EXPECT_EQ(p.losses, r.plans[0].losses) << p.plan << " trained differently";
    EXPECT_GT(p.step_s, 0.0);
  }
  EXPECT_TRUE(r.diverged.empty());
  EXPECT_LT(r.plans[1].forward_kept, r.plans[0].forward_kept / 2) << "block keeps only the block boundaries";
  EXPECT_GE(r.plans[1].overhead_expected, 0.0);
  ASSERT_EQ(r.growth.size(), 3u);
  EXPECT_LT(r.growth[2].sqrt, r.growth[2].none);
  EXPECT_GT(r.fit_none.k, r.fit_sqrt.k);
}

// An implementation that fails is a finding of the growth law, and a depth the Case limits refuse stops
// it short with the reason; neither loses the plans' results.
TEST(Bench, GrowthReportsAFailingImplementationAndStopsShortAtALimit) {
  struct Throws : CheckpointImpl {
    std::vector<torch::Tensor> run(const SegmentCall&) override { throw std::runtime_error("planted"); }
  };
  Case c = case_from_line("layers=2 d=8 heads=2 ffn=2 vocab=5 batch=1 seq=4 seed=3");
  BenchOptions o;
  o.warmup = 0, o.repeats = 1, o.max_repeats = 1, o.growth = true, o.growth_layers = {1, 2, 4};
  const BenchResult failing = run_bench(c, {Plan{}}, {{"throws", [] { return std::make_unique<Throws>(); }}}, o);
  ASSERT_EQ(failing.plans.size(), 1u);
  EXPECT_TRUE(failing.plans[0].completed);
  EXPECT_NE(failing.growth_failed.find("planted"), std::string::npos) << failing.growth_failed;
  o.growth_layers = {1, 2, 4, kMaxLayers + 1};
  const BenchResult limited = run_bench(c, {Plan{}}, {{"builtin", [] { return make_builtin(); }}}, o);
  EXPECT_EQ(limited.growth.size(), 3u);
  EXPECT_EQ(limited.growth_stopped.rfind("L=65", 0), 0u) << limited.growth_stopped;
  EXPECT_TRUE(limited.growth_failed.empty());
}

// The order-statistic interval for a median: its coverage is exact and one wild outlier cannot move it.
TEST(Bench, MedianIntervalIsDistributionFree) {
  const Interval few = median_interval({3, 1, 2, 5, 4});
  EXPECT_EQ(few.lo, 1);
  EXPECT_EQ(few.hi, 5);
  EXPECT_NEAR(few.coverage, 1 - 2.0 / 32, 1e-12);  // below 95%: too few samples
  const Interval six = median_interval({6, 1, 2, 5, 4, 3});
  EXPECT_EQ(six.lo, 1);
  EXPECT_EQ(six.hi, 6);
  EXPECT_NEAR(six.coverage, 1 - 2.0 / 64, 1e-12);
  std::vector<double> v;
  for (int i = 1; i <= 20; ++i) v.push_back(i);
  const Interval twenty = median_interval(v);
  EXPECT_EQ(twenty.lo, 6);  // P(Binomial(20, 1/2) <= 5) = 0.0207: coverage 95.9%; k = 7 would be 88.5%
  EXPECT_EQ(twenty.hi, 15);
  EXPECT_NEAR(twenty.coverage, 0.958610535, 1e-8);
  v.back() = 1e9;
  EXPECT_EQ(median_interval(v).hi, 15);
  EXPECT_EQ(median_interval({}).coverage, 0.0);
  EXPECT_EQ(median_interval({7}).lo, 7);
}

// Several implementations side by side: every plan runs with each, each is compared with the first per
// round, and an implementation that really is slower is told apart from one that is not. Only medians are
// asserted against time: on a shared machine one stalled round of the fast one moves an interval's lower
// end (the least ratio of six), never the median of them; the intervals are asserted to hold their medians.
TEST(Bench, ImplementationsSideBySideWithIntervals) {
  struct Slow : CheckpointImpl {
    std::unique_ptr<CheckpointImpl> inner = make_builtin();
    std::vector<torch::Tensor> run(const SegmentCall& call) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      return inner->run(call);
    }
  };
  Case c = case_from_line("layers=2 d=8 heads=2 ffn=2 vocab=5 batch=1 seq=4 seed=3");
  BenchOptions o;
  o.warmup = 1, o.repeats = 6, o.max_repeats = 12, o.time_cap_s = 60;
  Plan block;
  std::string err;
  ASSERT_TRUE(Plan::parse("block", block, err));
  const BenchResult r =
      run_bench(c, {Plan{}, block},
                {{"builtin", [] { return make_builtin(); }}, {"slow", [] { return std::make_unique<Slow>(); }}}, o);
  ASSERT_EQ(r.impls, (std::vector<std::string>{"builtin", "slow"}));
  ASSERT_EQ(r.plans.size(), 3u);  // none, block with each
  EXPECT_EQ(r.plans[1].impl, "builtin");
  EXPECT_EQ(r.plans[2].impl, "slow");
  EXPECT_GE(r.rounds, 6);
  EXPECT_LE(r.rounds, 12);
  EXPECT_FALSE(r.stopped.empty());
  for (const PlanBench& p : r.plans) {
    ASSERT_TRUE(p.completed) << p.plan << ": " << p.error;
    EXPECT_EQ(p.step_times.size(), static_cast<size_t>(r.rounds));
    EXPECT_EQ(p.losses, r.plans[0].losses);
  }
  ASSERT_EQ(r.comparisons.size(), 1u);
  const ImplComparison& cmp = r.comparisons[0];
  EXPECT_EQ(cmp.impl, "slow");
  EXPECT_EQ(cmp.against, "builtin");
  EXPECT_GE(cmp.ci.coverage, 0.95);
  EXPECT_GT(cmp.ratio, 1.0) << "25 ms per segment call (at least 100 ms a step) on a step of a few ms";
  EXPECT_LE(cmp.ci.lo, cmp.ratio);
  EXPECT_GE(cmp.ci.hi, cmp.ratio);
  EXPECT_GT(r.plans[2].overhead, 0.0);
  for (const PlanBench& p : r.plans) {
    EXPECT_LE(p.overhead_ci.lo, p.overhead) << p.plan << " " << p.impl;
    EXPECT_GE(p.overhead_ci.hi, p.overhead) << p.plan << " " << p.impl;
  }
}

// to_doubles reads any tensor's values in row-major order: dense fp32/fp64 CPU tensors in place, every
// other layout and dtype through a conversion.
TEST(Model, ToDoublesReadsEveryLayoutAndDtype) {
  torch::manual_seed(3);
  const torch::Tensor base = torch::randn({4, 6});
  auto expect_same = [](const torch::Tensor& t, const char* what) {
    const torch::Tensor want = t.detach().to(torch::kDouble).contiguous();
    const std::vector<double> got = to_doubles(t);
    ASSERT_EQ(got.size(), static_cast<size_t>(want.numel())) << what;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want.reshape({-1})[static_cast<int64_t>(i)].item<double>()) << what << " at " << i;
  };
  expect_same(base, "fp32");
  expect_same(base.to(torch::kDouble), "fp64");
  expect_same(base.t(), "transposed");
  expect_same(base.slice(1, 2, 5), "a slice with a storage offset");
  expect_same(base.select(0, 2), "a row");
  expect_same(base.to(torch::kHalf), "fp16");
  expect_same(base.to(torch::kBFloat16), "bf16");
  expect_same((base * 10).to(torch::kLong), "int64");
  expect_same(base.reshape({2, 2, 6}).narrow(2, 1, 3), "a narrowed 3-d view");
  const torch::Tensor p = base.clone().requires_grad_(true);
  (p * p).sum().backward();
  expect_same(p, "a parameter that requires grad");
  expect_same(p.grad(), "its gradient");
  EXPECT_TRUE(to_doubles(torch::empty({0})).empty());
}

}  // namespace
}  // namespace ckv
