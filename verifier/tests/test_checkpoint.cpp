// verifier/tests/test_checkpoint.cpp: the checkpoint library's guarantees (checkpoint.hpp), each against
// the same computation without checkpointing, bitwise.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <optional>

#include "verifier/checkpoint/checkpoint.hpp"
#include "verifier/checkpoint/compat.hpp"
#include "verifier/checkpoint/rng.hpp"
#include "verifier/checkpoint/saved_tensor_hooks.hpp"

namespace ckv {
namespace {

struct Net {
  torch::nn::Linear a{6, 6}, b{6, 6};
  Net() {
    torch::manual_seed(1);
    a = torch::nn::Linear(6, 6);
    b = torch::nn::Linear(6, 6);
  }
  void zero() {
    for (auto* m : {&a, &b})
      for (auto& p : (*m)->parameters()) p.mutable_grad().reset();
  }
  std::vector<torch::Tensor> grads() const {
    std::vector<torch::Tensor> out;
    for (const auto* m : {&a, &b})
      for (const auto& p : (*m)->parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return out;
  }
};

bool same(const std::vector<torch::Tensor>& x, const std::vector<torch::Tensor>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].defined() != y[i].defined()) return false;
    if (x[i].defined() && !torch::equal(x[i], y[i])) return false;
  }
  return true;
}

TEST(Checkpoint, GradientsEqualThePlainRunBitwise) {
  Net n;
  const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) {
    return n.b->forward(torch::dropout(torch::gelu(n.a->forward(t)), 0.3, true));
  };
  torch::manual_seed(7);
  fn(x).pow(2).sum().backward();
  const auto plain = n.grads();
  const torch::Tensor gx = x.grad().clone();
  n.zero();
  x.mutable_grad().reset();
  torch::manual_seed(7);
  checkpoint(fn, x).pow(2).sum().backward();
  EXPECT_TRUE(same(n.grads(), plain));
  EXPECT_TRUE(torch::equal(x.grad(), gx));
}

// A generator of its own that fn draws from by swapping its state into the default CPU generator (as
// a model-parallel RNG tracker's fork does): replayed when named in CheckpointOptions::generators, and
// left as the forward left it once backward is done; not named, the recompute draws another mask.
TEST(Checkpoint, NamedGeneratorsAreReplayedLikeTheDefaultOne) {
  at::Generator stream = at::detail::createCPUGenerator(77);
  auto fork_draw = [&](const torch::Tensor& like) {
    at::Generator def = at::detail::getDefaultCPUGenerator();
    const torch::Tensor saved = def.get_state();
    def.set_state(stream.get_state());
    torch::Tensor keep = torch::empty_like(like).bernoulli_(0.5);
    stream.set_state(def.get_state());
    def.set_state(saved);
    return keep;
  };
  auto fn = [&](const torch::Tensor& x) { return (x.sin() * fork_draw(x) * 2.0).cos(); };
  auto grad_of = [&](bool checkpointed, bool named) {
    stream.set_current_seed(77);
    torch::manual_seed(5);
    const torch::Tensor x = torch::linspace(-1, 1, 64).requires_grad_();
    torch::Tensor y;
    if (!checkpointed) {
      y = fn(x);
    } else {
      CheckpointOptions options;
      if (named) options.generators = {stream};
      y = checkpoint(fn, x, options);
    }
    const torch::Tensor after_forward = stream.get_state();
    y.sum().backward();
    if (!checkpointed || named) {
      EXPECT_TRUE(torch::equal(stream.get_state(), after_forward)) << "backward moved the stream on";
    }
    return x.grad().clone();
  };
  const torch::Tensor plain = grad_of(false, false);
  EXPECT_TRUE(torch::equal(grad_of(true, true), plain));
  EXPECT_FALSE(torch::equal(grad_of(true, false), plain));
}

TEST(Checkpoint, SeveralInputsAndOutputsAndNonTensorArguments) {
  Net n;
  const torch::Tensor h = torch::randn({2, 3, 6}).requires_grad_(true);
  const torch::Tensor mask = torch::rand({2, 3}) > 0.3;  // bool, never requires grad
  int calls = 0;
  const SegmentFunction fn = [&](const std::vector<c10::IValue>& a) -> std::vector<torch::Tensor> {
    ++calls;
    const torch::Tensor x = a.at(0).toTensor(), m = a.at(1).toTensor();
    const int64_t repeat = a.at(2).toInt();
    const double scale = a.at(3).toDouble();
    EXPECT_TRUE(a.at(4).isNone());
    torch::Tensor y = x;
    for (int64_t i = 0; i < repeat; ++i) y = torch::tanh(n.a->forward(y)) * m.unsqueeze(-1);
    return {y, y.pow(2).mean() * scale};
  };
  const std::vector<c10::IValue> args = {h, mask, int64_t{2}, 0.25, c10::IValue()};
  auto loss_of = [](const std::vector<torch::Tensor>& o) { return o[0].sum() + o[1]; };
  loss_of(fn(args)).backward();
  const auto plain = n.grads();
  const torch::Tensor gh = h.grad().clone();
  n.zero();
  h.mutable_grad().reset();
  calls = 0;
  const auto outs = checkpoint(fn, args);
  ASSERT_EQ(outs.size(), 2u);
  loss_of(outs).backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(same(n.grads(), plain));
  EXPECT_TRUE(torch::equal(h.grad(), gh));
}

TEST(Checkpoint, OutputsWithoutGradStayWithoutGrad) {
  Net n;
  const torch::Tensor x = torch::randn({2, 6}).requires_grad_(true);
  const SegmentFunction fn = [&](const std::vector<c10::IValue>& a) -> std::vector<torch::Tensor> {
    const torch::Tensor y = n.a->forward(a.at(0).toTensor());
    return {y, y.detach() * 2, torch::zeros({})};
  };
  const auto outs = checkpoint(fn, {x});
  EXPECT_TRUE(outs[0].requires_grad());
  EXPECT_FALSE(outs[1].requires_grad());
  EXPECT_FALSE(outs[2].requires_grad());
}

TEST(Checkpoint, ParameterHooksRunOncePerBackward) {
  Net n;
  int calls = 0;
  n.a->weight.register_hook([&](const torch::Tensor& g) {
    ++calls;
    return g.clamp(-0.01, 0.01);  // non-linear: applying it per contribution would show
  });
  const torch::Tensor x = torch::randn({4, 6}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) { return n.a->forward(torch::tanh(n.a->forward(t))); };  // weight used twice
  fn(x).sum().backward();
  ASSERT_EQ(calls, 1);
  const auto plain = n.grads();
  n.zero();
  calls = 0;
  checkpoint(fn, x).sum().backward();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(same(n.grads(), plain));
}

TEST(Checkpoint, CreateGraphSupportsAGradientPenalty) {
  Net n;
  const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) { return n.b->forward(torch::tanh(n.a->forward(t))); };
  auto penalised = [&](bool ckpt) {
    n.zero();
    const torch::Tensor loss = (ckpt ? checkpoint(fn, x) : fn(x)).pow(2).sum();
    const torch::Tensor g = torch::autograd::grad({loss}, {x}, {}, true, /*create_graph=*/true)[0];
    ASSERT_TRUE(g.requires_grad()) << "the gradient must carry a graph for the penalty";
    (loss + g.pow(2).sum()).backward();
  };
  penalised(false);
  const auto plain = n.grads();
  penalised(true);
  EXPECT_TRUE(same(n.grads(), plain));
}

TEST(Checkpoint, EveryParameterFnReadsGetsItsGradientWithNothingDeclared) {
  Net n;
  const torch::Tensor x = torch::randn({2, 6});  // no input requires grad: the frozen-embedding case
  checkpoint([&](const torch::Tensor& t) { return n.b->forward(n.a->forward(t)); }, x).sum().backward();
  for (const auto& g : n.grads()) {
    ASSERT_TRUE(g.defined());
    EXPECT_GT(g.abs().sum().item<double>(), 0.0);
  }
}

TEST(Checkpoint, InputModifiedInPlaceBeforeBackwardIsRefused) {
  Net n;
  const torch::Tensor leaf = torch::randn({2, 6}).requires_grad_(true);
  const torch::Tensor x = leaf * 2;
  const torch::Tensor out = checkpoint([&](const torch::Tensor& t) { return n.a->forward(t).tanh(); }, x);
  {
    torch::NoGradGuard g;
    x.add_(1.0);
  }
  try {
    out.sum().backward();
    FAIL() << "backward recomputed from a modified input";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 of the checkpointed segment was modified in place"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, ParameterModifiedInPlaceBeforeBackwardIsRefused) {
  Net n;
  const torch::Tensor x = torch::randn({2, 6}).requires_grad_(true);
  const torch::Tensor out = checkpoint([&](const torch::Tensor& t) { return n.a->forward(t).tanh(); }, x);
  {
    torch::NoGradGuard g;
    n.a->weight.sub_(0.1);  // an optimizer step taken before backward
  }
  try {
    out.sum().backward();
    FAIL() << "backward recomputed from a modified parameter";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a view of a parameter of shape [6, 6]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, RecomputeRunsUnderTheForwardsAutocastStateAndMatchesBitwise) {
  Net n;
  const torch::Tensor x = torch::randn({2, 6}).requires_grad_(true);
  std::vector<c10::ScalarType> dtypes;
  auto fn = [&](const torch::Tensor& t) {
    const torch::Tensor y = n.b->forward(n.a->forward(t));  // b's input is a's bf16 output
    dtypes.push_back(y.scalar_type());
    return y.to(torch::kFloat);
  };
  const compat::AutocastState bf16 = compat::AutocastState::current().with(torch::kCPU, true, torch::kBFloat16);
  for (bool ckpt : {false, true}) {
    n.zero();
    torch::Tensor out;
    {
      compat::ScopedAutocastState ac(bf16);
      // Without early stop, so that the recompute reaches the line that records y's dtype.
      CheckpointOptions to_the_end;
      to_the_end.early_stop = false;
      out = ckpt ? checkpoint(fn, x, to_the_end) : fn(x);
    }
    out.sum().backward();
  }
  ASSERT_EQ(dtypes.size(), 3u);
  EXPECT_EQ(dtypes[2], torch::kBFloat16) << "the recompute must run under the forward's autocast";
  EXPECT_FALSE(compat::AutocastState::current().cpu_enabled) << "autocast state leaked out of backward";
}

TEST(Checkpoint, SharedWeightUnderAutocastMatchesThePlainRunBitwise) {
  Net n;
  const torch::Tensor x = torch::randn({4, 6}).requires_grad_(true);
  const compat::AutocastState bf16 = compat::AutocastState::current().with(torch::kCPU, true, torch::kBFloat16);
  auto run = [&](bool ckpt) {
    n.zero();
    torch::Tensor out;
    {
      compat::ScopedAutocastState ac(bf16);
      const torch::Tensor h =
          ckpt ? checkpoint([&](const torch::Tensor& t) { return n.a->forward(t); }, x) : n.a->forward(x);
      out = n.a->forward(h).to(torch::kFloat);  // the same weight outside the segment
    }
    out.sum().backward();
    return n.grads();
  };
  const auto plain = run(false);
  EXPECT_TRUE(same(run(true), plain));
}

TEST(Checkpoint, BackwardLeavesTheRandomStreamAsItFoundIt) {
  Net n;
  const torch::Tensor x = torch::randn({8, 6}).requires_grad_(true);
  const torch::Tensor out =
      checkpoint([&](const torch::Tensor& t) { return torch::dropout(n.a->forward(t), 0.5, true); }, x);
  torch::manual_seed(99);
  const torch::Tensor before = compat::default_generator(torch::Device(torch::kCPU)).get_state();
  out.sum().backward();
  EXPECT_TRUE(torch::equal(compat::default_generator(torch::Device(torch::kCPU)).get_state(), before));
}

TEST(Checkpoint, ARecomputeThatThrowsPropagatesAndRestoresTheState) {
  Net n;
  const torch::Tensor x = torch::randn({4, 6}).requires_grad_(true);
  int calls = 0;
  auto fn = [&](const torch::Tensor& t) {
    if (++calls == 2) throw std::runtime_error("planted");
    return torch::dropout(n.a->forward(t), 0.5, true);
  };
  const torch::Tensor out = checkpoint(fn, x) * 1.0;  // the recompute is not the output's own node
  torch::manual_seed(5);
  const torch::Tensor before = compat::default_generator(torch::Device(torch::kCPU)).get_state();
  try {
    out.sum().backward();
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("planted"), std::string::npos);
  }
  EXPECT_TRUE(torch::equal(compat::default_generator(torch::Device(torch::kCPU)).get_state(), before));
  EXPECT_TRUE(torch::GradMode::is_enabled());
}

TEST(Checkpoint, WithGradDisabledItJustRunsTheFunction) {
  Net n;
  int calls = 0;
  auto fn = [&](const torch::Tensor& t) {
    ++calls;
    return n.a->forward(t);
  };
  torch::NoGradGuard g;
  const torch::Tensor out = checkpoint(fn, torch::randn({2, 6}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.requires_grad());
}

TEST(Checkpoint, RetainGraphAndNestedCheckpointsMatchThePlainRun) {
  Net n;
  const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
  auto inner = [&](const torch::Tensor& t) { return torch::tanh(n.b->forward(t)); };
  auto outer_plain = [&](const torch::Tensor& t) { return inner(n.a->forward(t)); };
  auto outer_nested = [&](const torch::Tensor& t) { return checkpoint(inner, n.a->forward(t)); };
  const torch::Tensor plain_out = outer_plain(x).pow(2).sum();
  plain_out.backward({}, /*retain_graph=*/true);
  plain_out.backward();
  const auto plain = n.grads();
  n.zero();
  const torch::Tensor out = checkpoint(outer_nested, x).pow(2).sum();
  out.backward({}, /*retain_graph=*/true);
  out.backward();
  EXPECT_TRUE(same(n.grads(), plain));
}

TEST(Checkpoint, ARecomputeThatSavesSomethingElseIsAnError) {
  Net n;
  const torch::Tensor x = torch::randn({2, 6}).requires_grad_(true);
  int calls = 0;
  auto fn = [&](const torch::Tensor& t) {  // depends on state that changes between forward and backward
    return ++calls == 1 ? n.a->forward(t).tanh() : n.a->forward(t.repeat({2, 1})).tanh().narrow(0, 0, 2);
  };
  const torch::Tensor out = checkpoint(fn, x);
  try {
    out.sum().backward();
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("recompute"), std::string::npos) << e.what();
  }
}

CheckpointOptions to_the_end() {
  CheckpointOptions o;
  o.early_stop = false;
  return o;
}

// torch's "Rule 6": fn runs backward itself (here a gradient of its own, with create_graph so that the
// outer backward differentiates through it), in the forward and again in the recompute.
TEST(Checkpoint, BackwardInsideTheSegmentMatchesThePlainRun) {
  for (const CheckpointOptions& options : {CheckpointOptions{}, to_the_end()}) {
    Net n;
    const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
    auto fn = [&](const torch::Tensor& t) {
      const torch::Tensor h = torch::tanh(n.a->forward(t));
      const torch::Tensor g = torch::autograd::grad({h.pow(3).sum()}, {t}, {}, true, /*create_graph=*/true)[0];
      return n.b->forward(h * g);
    };
    fn(x).pow(2).sum().backward();
    const auto plain = n.grads();
    const torch::Tensor gx = x.grad().clone();
    n.zero();
    x.mutable_grad().reset();
    checkpoint(fn, x, options).pow(2).sum().backward();
    EXPECT_TRUE(same(n.grads(), plain)) << "early_stop=" << options.early_stop;
    EXPECT_TRUE(torch::equal(x.grad(), gx)) << "early_stop=" << options.early_stop;
  }
}

// The forward's last saved tensor is one that a backward inside fn saves (create_graph): early stop must
// not end the recompute from inside that backward (the engine would be left a level deeper each time,
// and after some 60 times would run nested backwards on other threads). Many times over, on one thread.
TEST(Checkpoint, EarlyStopNeverFiresInsideABackwardThatFnRuns) {
  Net n;
  const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) {
    const torch::Tensor h = n.b->forward(t).sin();
    return h + torch::autograd::grad({h.sum()}, {t}, {}, true, /*create_graph=*/true)[0];  // add saves nothing
  };
  fn(x).pow(2).sum().backward();
  const auto plain = n.grads();
  for (int i = 0; i < 100; ++i) {
    n.zero();
    checkpoint(fn, x).pow(2).sum().backward();
    ASSERT_TRUE(same(n.grads(), plain)) << "iteration " << i;
  }
}

// Every nesting of checkpoints and backward-inside-fn, against the same functions without checkpoints.
TEST(Checkpoint, NestedCheckpointsWithBackwardInsideMatchThePlainRun) {
  Net n;
  const torch::Tensor x = torch::randn({2, 6}).requires_grad_(true);
  auto run = [&](bool ckpt, int form) {
    auto maybe = [&](const std::function<torch::Tensor(const torch::Tensor&)>& f, const torch::Tensor& t) {
      return ckpt ? checkpoint(f, t) : f(t);
    };
    auto with_grad = [&](const torch::Tensor& t) {  // a segment that differentiates itself
      const torch::Tensor h = n.b->forward(t).sin();
      return h + torch::autograd::grad({h.sum()}, {t}, {}, true, true)[0];
    };
    auto inner = [&](const torch::Tensor& t) { return torch::tanh(n.b->forward(t)); };
    std::function<torch::Tensor(const torch::Tensor&)> outer;
    switch (form) {
      case 0:  // checkpoint in checkpoint in checkpoint
        outer = [&](const torch::Tensor& t) {
          return maybe([&](const torch::Tensor& u) { return maybe(inner, n.a->forward(u)); }, t.exp());
        };
        break;
      case 1:  // backward inside a nested checkpoint
        outer = [&](const torch::Tensor& t) { return maybe(with_grad, n.a->forward(t)) * 2; };
        break;
      default:  // a checkpoint inside a function that runs backward over it
        outer = [&](const torch::Tensor& t) {
          const torch::Tensor h = maybe(inner, n.a->forward(t));
          return h * torch::autograd::grad({h.pow(2).sum()}, {t}, {}, true, true)[0];
        };
    }
    n.zero();
    x.mutable_grad().reset();
    const torch::Tensor loss = maybe(outer, x).pow(2).sum();
    const torch::Tensor g = torch::autograd::grad({loss}, {x}, {}, true, /*create_graph=*/true)[0];
    (loss + g.pow(2).sum()).backward();  // double backward through every level
    auto out = n.grads();
    out.push_back(x.grad().clone());
    return out;
  };
  for (int form = 0; form < 3; ++form) EXPECT_TRUE(same(run(true, form), run(false, form))) << "form " << form;
}

// What one backward call recomputed is not reused by a later one: the later call recomputes, and so
// sees that a parameter changed in place in between (plain LibTorch raises there too).
TEST(Checkpoint, ALaterBackwardCallRecomputesAndSeesAnInPlaceChange) {
  const torch::Tensor w = torch::randn({4}).requires_grad_(true);
  const torch::Tensor x = torch::randn({4}).requires_grad_(true);
  auto fn = [&](const std::vector<c10::IValue>& a) {
    const torch::Tensor p = a[0].toTensor() * w;
    return std::vector<torch::Tensor>{p, p.sin()};
  };
  const auto o = checkpoint(fn, {x});
  torch::autograd::grad({o[1].sum()}, {o[0]});  // recomputes, uses only p.sin()'s saved p
  {
    torch::NoGradGuard no_grad;
    w.add_(1);
  }
  EXPECT_THROW(o[0].sum().backward(), CheckpointError);
}

// Two backward calls through one checkpoint each get fresh recomputed tensors (retain_graph).
TEST(Checkpoint, EachBackwardCallRecomputesOnce) {
  Net n;
  int runs = 0;
  const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) {
    ++runs;
    return torch::tanh(n.a->forward(t));
  };
  const torch::Tensor loss = checkpoint(fn, x).pow(2).sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(runs, 2);
  loss.backward();
  EXPECT_EQ(runs, 3);
}

// A node that reads its saved tensors twice in one backward call gets an error, not a silent recompute.
struct ReadsTwice : torch::autograd::Function<ReadsTwice> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& t) {
    ctx->save_for_backward({t});
    return t * t;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const torch::Tensor t = ctx->get_saved_variables()[0];
    const torch::Tensor again = ctx->get_saved_variables()[0];
    return {2 * g[0] * t + 0 * again};
  }
};

TEST(Checkpoint, ASavedTensorUnpackedTwiceInOneBackwardIsAnError) {
  const torch::Tensor x = torch::randn({3}).requires_grad_(true);
  const torch::Tensor y = checkpoint([](const torch::Tensor& t) { return ReadsTwice::apply(t.sin()); }, x);
  try {
    y.sum().backward();
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("unpacked twice"), std::string::npos) << e.what();
  }
}

// A recompute that saves more tensors than the forward did is reported when it runs to the end (with
// early stop it never gets that far: it stops once it has what the forward saved).
TEST(Checkpoint, ARecomputeThatSavesMoreIsAnErrorWithoutEarlyStop) {
  for (const bool early : {true, false}) {
    Net n;
    const torch::Tensor x = torch::randn({2, 6}).requires_grad_(true);
    int calls = 0;
    auto fn = [&](const torch::Tensor& t) {
      const torch::Tensor h = n.a->forward(t).tanh();
      return ++calls == 1 ? h : h.exp().log();  // the recompute saves two tensors more, at the end
    };
    CheckpointOptions options;
    options.early_stop = early;
    const torch::Tensor out = checkpoint(fn, x, options);
    if (early) {
      EXPECT_NO_THROW(out.sum().backward());
      continue;
    }
    try {
      out.sum().backward();
      FAIL() << "no error";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("the recompute saved"), std::string::npos) << e.what();
    }
  }
}

// Saved-tensor hooks around a checkpoint see its tensor inputs (as torch saves them for backward), not
// the tensors saved inside fn; an offloading hook that replaces them still gives the plain gradients.
struct Offload : torch::autograd::SavedVariableHooks {
  Offload(std::vector<torch::Tensor>* seen, int* unpacked) : seen_(seen), unpacked_(unpacked) {}
  void call_pack_hook(const torch::Tensor& t) override {
    seen_->push_back(t);
    kept_ = t.detach().clone();  // a copy, as an offload to another device keeps one
  }
  torch::Tensor call_unpack_hook() override {
    ++*unpacked_;
    return kept_;
  }
  std::vector<torch::Tensor>* seen_;
  int* unpacked_;
  torch::Tensor kept_;
};

TEST(Checkpoint, SavedTensorHooksAroundACheckpointSeeItsInputs) {
  Net n;
  const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& t) { return n.b->forward(torch::tanh(n.a->forward(t))); };
  fn(x.exp()).pow(2).sum().backward();
  const auto plain = n.grads();
  const torch::Tensor gx = x.grad().clone();
  n.zero();
  x.mutable_grad().reset();
  std::vector<torch::Tensor> seen;
  int unpacked = 0;
  torch::Tensor out;
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> input;
  {
    SavedTensorHooksScope outer([&] { return std::make_unique<Offload>(&seen, &unpacked); });
    torch::Tensor h = x.exp();  // exp saves its result: the outer hook sees it too
    seen.clear();
    out = checkpoint(fn, h);
    ASSERT_EQ(seen.size(), 1u) << "the outer hook must see the checkpoint's input and nothing inside fn";
    EXPECT_TRUE(seen[0].is_same(h));
    input.emplace(h.getIntrusivePtr());
    seen.clear();
  }
  EXPECT_TRUE(input->expired()) << "the checkpoint must not keep its input when an outer hook holds it";
  out.pow(2).sum().backward();
  EXPECT_EQ(unpacked, 2) << "the recompute takes its input from the outer hook (and exp's backward its result)";
  EXPECT_TRUE(same(n.grads(), plain));
  EXPECT_TRUE(torch::equal(x.grad(), gx));
}

// Early stop: the recompute ends once every saved tensor is back, so what fn does after its last saving
// op does not run again; without early stop it does. Gradients are the same either way.
TEST(Checkpoint, EarlyStopEndsTheRecomputeAfterItsLastSavedTensor) {
  for (const bool early : {true, false}) {
    Net n;
    const torch::Tensor x = torch::randn({3, 6}).requires_grad_(true);
    int tail = 0;
    auto fn = [&](const torch::Tensor& t) {
      const torch::Tensor h = torch::tanh(n.a->forward(t));
      ++tail;          // after the last op that saves a tensor
      return h + 1.0;  // add saves nothing
    };
    fn(x).pow(2).sum().backward();
    const auto plain = n.grads();
    n.zero();
    tail = 0;
    CheckpointOptions options;
    options.early_stop = early;
    checkpoint(fn, x, options).pow(2).sum().backward();
    EXPECT_EQ(tail, early ? 1 : 2) << "early_stop=" << early;
    EXPECT_TRUE(same(n.grads(), plain)) << "early_stop=" << early;
  }
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
  checkpoint(fn, x).sum().backward();
  ASSERT_EQ(masks.size(), 2u);
  EXPECT_TRUE(torch::equal(masks[0], masks[1]));
}

// RngState compares generator states byte for byte and names each generator that differs.
TEST(RngState, DifferencesNameEachGeneratorThatMoved) {
  at::Generator extra = at::detail::createCPUGenerator(5);
  const RngState a = RngState::capture({extra});
  EXPECT_EQ(RngState::capture({extra}).differences(a), "");
  EXPECT_TRUE(RngState::capture({extra}) == a);
  torch::rand({3});  // the CPU default generator moves on
  EXPECT_EQ(RngState::capture({extra}).differences(a), "cpu");
  a.restore();
  EXPECT_EQ(RngState::capture({extra}).differences(a), "");
  torch::rand({3}, extra);
  EXPECT_EQ(RngState::capture({extra}).differences(a), "the calls' generator 0 (SegmentCall::generators)");
  EXPECT_EQ(RngState::capture().differences(a),
            "the calls' generator 0 (SegmentCall::generators)");  // one state has no extra generator
  EXPECT_TRUE(RngState::capture({extra}) != a);
}

}  // namespace
}  // namespace ckv
