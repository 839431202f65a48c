// verifier/tests/test_checkpoint.cpp: the checkpoint library's guarantees, each shown against the
// broken variant that violates it (detail::Breakage).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "verifier/checkpoint.hpp"
#include "verifier/compat.hpp"

namespace ckv {
namespace {

torch::Tensor run_variant(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x,
                          const std::vector<torch::Tensor>& params, detail::Breakage b = {}) {
  return detail::checkpoint_variant([fn](const std::vector<torch::Tensor>& in) { return fn(in.at(0)); }, {x}, params,
                                    {}, b);
}

TEST(Checkpoint, GradientsEqualThePlainRunBitwise) {
  torch::manual_seed(1);
  torch::nn::Linear lin(6, 6);
  const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) { return torch::dropout(torch::gelu(lin->forward(t)), 0.3, true); };
  torch::manual_seed(7);
  fn(x).pow(2).sum().backward();
  const torch::Tensor gx = x.grad().clone(), gw = lin->weight.grad().clone();
  x.mutable_grad().reset();
  lin->weight.mutable_grad().reset();
  torch::manual_seed(7);
  checkpoint(*lin, fn, x).pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), gx));
  EXPECT_TRUE(torch::equal(lin->weight.grad(), gw));
}

// The frozen-embedding / LoRA case: no input requires grad, the parameters inside still must get one.
TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  torch::nn::Linear lin(4, 4);
  const torch::Tensor x = torch::randn({2, 4});  // no grad
  auto fn = [&](const torch::Tensor& t) { return lin->forward(t); };
  checkpoint(*lin, fn, x).sum().backward();
  ASSERT_TRUE(lin->weight.grad().defined());
  EXPECT_GT(lin->weight.grad().abs().sum().item<double>(), 0.0);
  lin->weight.mutable_grad().reset();
  detail::Breakage b;
  b.inputs_only_grad = true;
  run_variant(fn, x, lin->parameters(), b).sum().backward();
  EXPECT_FALSE(lin->weight.grad().defined()) << "the broken variant should drop parameter gradients";
}

TEST(Checkpoint, InputModifiedInPlaceBeforeBackwardIsAnError) {
  torch::nn::Linear lin(4, 4);
  const torch::Tensor leaf = torch::randn({2, 4}).requires_grad_(true);
  const torch::Tensor x = leaf * 2;
  auto fn = [&](const torch::Tensor& t) { return lin->forward(t).tanh(); };
  const torch::Tensor out = checkpoint(*lin, fn, x);
  {
    torch::NoGradGuard g;
    x.add_(1.0);
  }
  try {
    out.sum().backward();
    FAIL() << "backward recomputed from a modified input";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place between the checkpointed forward and its backward"),
              std::string::npos)
        << e.what();
  }
  // Without the check, backward silently recomputes from the new value.
  const torch::Tensor y = leaf * 2;
  detail::Breakage b;
  b.skip_version_check = true;
  const torch::Tensor out2 = run_variant(fn, y, lin->parameters(), b);
  {
    torch::NoGradGuard g;
    y.add_(1.0);
  }
  EXPECT_NO_THROW(out2.sum().backward());
}

TEST(Checkpoint, RecomputeRunsUnderTheForwardsAutocastState) {
  torch::nn::Linear lin(4, 4);
  const torch::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  for (bool broken : {false, true}) {
    std::vector<compat::AutocastState> seen;
    std::vector<c10::ScalarType> dtypes;
    auto fn = [&](const torch::Tensor& t) {
      seen.push_back(compat::AutocastState::current());
      torch::Tensor y = lin->forward(t);
      dtypes.push_back(y.scalar_type());
      return y.to(torch::kFloat);
    };
    detail::Breakage b;
    b.skip_autocast_replay = broken;
    torch::Tensor out;
    {
      compat::ScopedAutocastState ac(compat::AutocastState::current().with(torch::kCPU, true, torch::kBFloat16));
      out = run_variant(fn, x, lin->parameters(), b);
    }
    out.sum().backward();
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_TRUE(seen[0].cpu_enabled);
    EXPECT_EQ(dtypes[0], torch::kBFloat16);
    if (!broken) {
      EXPECT_TRUE(seen[1] == seen[0]);
      EXPECT_EQ(dtypes[1], torch::kBFloat16);
    } else {
      EXPECT_FALSE(seen[1].cpu_enabled) << "the broken variant should recompute outside autocast";
      EXPECT_EQ(dtypes[1], torch::kFloat);
    }
    EXPECT_FALSE(compat::AutocastState::current().cpu_enabled) << "autocast state leaked out of backward";
  }
}

TEST(Checkpoint, BackwardLeavesTheRandomStreamAsItFoundIt) {
  torch::nn::Linear lin(4, 4);
  const torch::Tensor x = torch::randn({8, 4}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) { return torch::dropout(lin->forward(t), 0.5, true); };
  const torch::Tensor out = checkpoint(*lin, fn, x);
  torch::manual_seed(99);
  const torch::Tensor before = compat::default_generator(torch::Device(torch::kCPU)).get_state();
  out.sum().backward();
  EXPECT_TRUE(torch::equal(compat::default_generator(torch::Device(torch::kCPU)).get_state(), before));
}

TEST(Checkpoint, WithGradDisabledItJustRunsTheFunction) {
  torch::nn::Linear lin(4, 4);
  int calls = 0;
  auto fn = [&](const torch::Tensor& t) {
    ++calls;
    return lin->forward(t);
  };
  torch::NoGradGuard g;
  const torch::Tensor out = checkpoint(*lin, fn, torch::randn({2, 4}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.requires_grad());
}

// A segment that reaches a CUDA device only inside fn (its input is on the CPU) must still replay the
// CUDA generator.
TEST(Checkpoint, CudaGeneratorsReachedOnlyInsideFnAreReplayed) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  torch::nn::Linear lin(16, 16);
  lin->to(torch::kCUDA);
  const torch::Tensor x = torch::randn({32, 16}).requires_grad_(true);  // CPU
  std::vector<torch::Tensor> masks;
  auto fn = [&](const torch::Tensor& t) {
    const torch::Tensor h = lin->forward(t.to(torch::kCUDA));
    const torch::Tensor keep = torch::empty_like(h).bernoulli_(0.5);
    masks.push_back(keep.cpu());
    return (h * keep).cpu();
  };
  checkpoint(*lin, fn, x).sum().backward();
  ASSERT_EQ(masks.size(), 2u);
  EXPECT_TRUE(torch::equal(masks[0], masks[1]));
  masks.clear();
  detail::Breakage b;
  b.cpu_rng_only = true;
  run_variant(fn, x, lin->parameters(), b).sum().backward();
  ASSERT_EQ(masks.size(), 2u);
  EXPECT_FALSE(torch::equal(masks[0], masks[1]));
}

}  // namespace
}  // namespace ckv
