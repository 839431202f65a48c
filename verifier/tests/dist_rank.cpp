// verifier/tests/dist_rank.cpp: the rank program dist_tests starts through run_ranks (ranks.hpp), as the
// program dist_rank (dist_rank_main.cpp) or, through a rank fork server, forked from dist_tests itself.
// argv[1] names the scenario; the rank writes what it found to <store dir>/result<rank>.txt and exits
// 0, or exits nonzero with the reason on standard error.
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include "reference/transformer.hpp"
#include "verifier/checkpoint/checkpoint.hpp"
#include "verifier/dist/collectives.hpp"
#include "verifier/dist/proc.hpp"
#include "verifier/dist/ranks.hpp"
#include "verifier/dist/reducer.hpp"
#include "verifier/dist/rng_tracker.hpp"
#include "verifier/model/memory.hpp"
#include "verifier/model/model.hpp"
#include "verifier/model/shard.hpp"
#include "verifier/tests/dist_rank.hpp"

using namespace ckv;
using namespace ckv::dist;

namespace {
std::string dir_of(const std::string& path) {
  return path.substr(0, path.rfind('/'));
}

bool close(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::allclose(a, b, 1e-5, 1e-6);
}

// A tensor-parallel MLP over the group's ranks (column-parallel fc1, row-parallel fc2) against the same
// MLP unsharded on every rank: outputs, input gradient and each shard's parameter gradients must match
// the unsharded ones' slices. With `mode` checkpoint (or checkpoint-full: no early stop) the region
// runs inside the builtin checkpoint. Writes the ledger's counts per pass.
int tp_mlp(const RankEnv& env, const std::string& mode) {
  const int64_t N = 4, D = 8, F = 16;
  const int tp = env.world;
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
  auto region = std::make_shared<ParallelRegion>();
  region->group = world->subgroup("tp", [&] {
    std::vector<int> r;
    for (int i = 0; i < tp; ++i) r.push_back(i);
    return r;
  }());
  region->ledger = std::make_shared<CollectiveLedger>();
  torch::manual_seed(0);
  const torch::Tensor w1 = torch::randn({F, D}), w2 = torch::randn({D, F}), x0 = torch::randn({N, D}),
                      target = torch::randn({N, D});
  // Unsharded.
  torch::Tensor xu = x0.clone().requires_grad_(), w1u = w1.clone().requires_grad_(), w2u = w2.clone().requires_grad_();
  const torch::Tensor outu = torch::gelu(xu.matmul(w1u.t())).matmul(w2u.t());
  (outu * target).sum().backward();
  // Sharded: rank r holds rows [r F/tp, (r+1) F/tp) of fc1 and the same columns of fc2.
  const int64_t lo = env.rank * F / tp, hi = (env.rank + 1) * F / tp;
  torch::Tensor x = x0.clone().requires_grad_(), w1s = w1.slice(0, lo, hi).clone().requires_grad_(),
                w2s = w2.slice(1, lo, hi).clone().requires_grad_();
  auto region_fn = [&](const torch::Tensor& in) {
    const torch::Tensor h = torch::gelu(enter_parallel(in, region, "mlp.in").matmul(w1s.t()));
    return leave_parallel(h.matmul(w2s.t()), region, "mlp.out");
  };
  torch::Tensor out;
  if (mode == "plain") {
    out = region_fn(x);
  } else {
    CheckpointOptions options;
    options.early_stop = mode != "checkpoint-full";
    out = ckv::checkpoint(region_fn, x, options);
  }
  (out * target).sum().backward();
  std::string bad;
  if (!close(out, outu)) bad += " output";
  if (!close(x.grad(), xu.grad())) bad += " x.grad";
  if (!close(w1s.grad(), w1u.grad().slice(0, lo, hi))) bad += " fc1.grad";
  if (!close(w2s.grad(), w2u.grad().slice(1, lo, hi))) bad += " fc2.grad";
  if (!bad.empty()) {
    std::cerr << "rank " << env.rank << " (" << mode << "): differs from the unsharded MLP in" << bad << "\n";
    return 1;
  }
  std::ofstream result(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt");
  result << region->ledger->count(Pass::forward) << " " << region->ledger->count(Pass::recompute) << " "
         << region->ledger->count(Pass::backward) << " " << region->ledger->bytes(Pass::backward) << " |";
  for (const CollectiveRecord& r : region->ledger->records())
    result << " " << to_string(r.kind) << "/" << to_string(r.pass) << "/" << r.where;
  result << "\n";
  world->barrier();
  return 0;
}

// Dropout in a tensor-parallel MLP as model-parallel training draws it: inside the region from the
// tracker's "model-parallel" stream (seeded per rank), after it from the default generator (seeded
// equally). Writes "<model-parallel masks> <replicated masks>" (each "differ" or "equal" across the
// ranks) for `plain`; for the checkpoint modes, whether the gradients "match" those of the plain run
// with the same seeds: `checkpoint` shows the builtin the tracker's generators, `checkpoint-unshown`
// does not (the recompute then draws other model-parallel masks).
int tp_dropout(const RankEnv& env, const std::string& mode) {
  const int64_t N = 4, D = 8, F = 16;
  const int tp = env.world;
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
  auto region = std::make_shared<ParallelRegion>();
  region->group = world;
  torch::manual_seed(0);
  const torch::Tensor w1 = torch::randn({F, D}), w2 = torch::randn({D, F}), x0 = torch::randn({N, D}),
                      target = torch::randn({N, D});
  const int64_t lo = env.rank * F / tp, hi = (env.rank + 1) * F / tp;
  struct Run {
    torch::Tensor x, w1s, w2s, mask_mp, mask_rep;
  };
  auto run = [&](const std::string& how) {
    torch::manual_seed(1);  // the default generator: equal on every rank
    RngTracker tracker;
    tracker.add("model-parallel", 1000 + static_cast<uint64_t>(env.rank));
    Run r{x0.clone().requires_grad_(),
          w1.slice(0, lo, hi).clone().requires_grad_(),
          w2.slice(1, lo, hi).clone().requires_grad_(),
          {},
          {}};
    auto fn = [&](const torch::Tensor& in) {
      torch::Tensor h = torch::gelu(enter_parallel(in, region, "mlp.in").matmul(r.w1s.t()));
      torch::Tensor keep_mp;
      {
        const auto fork = tracker.fork("model-parallel");
        keep_mp = torch::empty_like(h).bernoulli_(0.5);
      }
      const torch::Tensor y = leave_parallel((h * keep_mp * 2.0).matmul(r.w2s.t()), region, "mlp.out");
      const torch::Tensor keep_rep = torch::empty_like(y).bernoulli_(0.5);
      if (!r.mask_mp.defined()) r.mask_mp = keep_mp, r.mask_rep = keep_rep;  // the first forward's
      return y * keep_rep * 2.0;
    };
    torch::Tensor out;
    if (how == "plain") {
      out = fn(r.x);
    } else {
      CheckpointOptions options;
      if (how == "checkpoint") options.generators = tracker.generators();
      out = ckv::checkpoint(fn, r.x, options);
    }
    (out * target).sum().backward();
    return r;
  };
  const Run plain = run("plain");
  std::string result;
  if (mode == "plain") {
    auto across = [&](const torch::Tensor& m) {
      const auto all = world->all_gather(m);
      return torch::equal(all[0], all[1]) ? "equal" : "differ";
    };
    result = std::string(across(plain.mask_mp)) + " " + across(plain.mask_rep);
  } else {
    const Run r = run(mode);
    const bool match = close(r.x.grad(), plain.x.grad()) && close(r.w1s.grad(), plain.w1s.grad()) &&
                       close(r.w2s.grad(), plain.w2s.grad());
    result = match ? "match" : "differ";
  }
  std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt") << result << "\n";
  world->barrier();
  return 0;
}

// The sharded Transformer (verifier/model/shard.hpp) on the group's ranks, each tensor-parallel rank
// running its shard of three models that differ in activation, norm and placement, with dropout at every
// site, side-effecting modules and an auxiliary loss. Every rank gathers the masks and ReLU sides all
// ranks drew, feeds them to the unsharded fp64 reference, and compares its loss, its input gradient and
// each of its parameters' gradients with the reference's (the slice it holds). Also checked: masks
// inside the tensor-parallel regions differ across the ranks and the others do not; the replicated
// parameters' gradients are bit-identical on every rank; under a checkpoint every recompute draws its
// forward's masks again.
// Modes: plain; checkpoint (every block in the builtin checkpoint, shown the tracker's generators);
// checkpoint-selective (the same, the model keeping each forward all-reduce's output for the recompute);
// checkpoint-unshown (the builtin shown only the default generator: the recompute draws other
// model-parallel masks, so the result line says where it differs instead of "held"); wrong-slice (every
// rank loads the next rank's slice: the reference comparison must catch it); same-seed and
// rank-seeded-default (the tracker's stream seeded equally on every rank, the default generator per
// rank: parallel consistency must say so).
// Writes per model "held" or "differs:<what>", and the ledger's counts per pass.
int tp_transformer(const RankEnv& env, const std::string& mode) {
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(30)});
  struct Variant {
    Activation act;
    NormKind norm;
    NormPlacement placement;
    DropoutImpl impl;
    unsigned effects;
    double aux;
  };
  const Variant variants[] = {
      {Activation::relu, NormKind::layer, NormPlacement::pre, DropoutImpl::explicit_mask, 0, 0},
      {Activation::swiglu, NormKind::rms, NormPlacement::post, DropoutImpl::native, 0, 0.3},
      {Activation::gelu_tanh, NormKind::layer, NormPlacement::pre, DropoutImpl::explicit_mask, kBatchNorm | kNoise, 0}};
  const int B = 2, T = 5;
  std::string line;
  for (const Variant& v : variants) {
    ModelConfig cfg;
    cfg.layers = 2, cfg.d_model = 8, cfg.heads = 2 * env.world, cfg.ffn_mult = 2;
    cfg.activation = v.act, cfg.norm = v.norm, cfg.placement = v.placement;
    cfg.effects = v.effects, cfg.aux_weight = v.aux;
    const std::array<double, kNumDropoutSites> p = {0.3, 0.2, 0.25, 0.15};
    const ParamSet params = make_params(cfg, 5);
    const CaseData data = make_case_data(cfg, B, T, 5);

    // The default generator: equal on every rank (rank-seeded-default: the bug of replicated dropout
    // drawn from a per-rank stream); the model-parallel stream: per rank (same-seed: the bug of a tracker
    // seeded equally on every tensor-parallel rank).
    torch::manual_seed(mode == "rank-seeded-default" ? 11 + static_cast<uint64_t>(env.rank) : 11);
    RngTracker tracker;
    tracker.add(kModelParallelStream, mode == "same-seed" ? 1000 : 1000 + static_cast<uint64_t>(env.rank));
    TensorShard shard;
    shard.rank = env.rank, shard.size = env.world, shard.tracker = &tracker;
    shard.keep_reduced = mode == "checkpoint-selective";
    shard.region = std::make_shared<ParallelRegion>();
    shard.region->group = world;
    shard.region->ledger = std::make_shared<CollectiveLedger>();
    SiteTap tap(v.impl, p);
    EffectState effects;
    effects.counter.assign(2, 0), effects.external.assign(2, 0), effects.cache_calls.assign(2, 0);
    TransformerImpl model(cfg, &tap, &effects, shard);
    if (mode == "wrong-slice") {  // the next rank's slice, loaded as if it were this rank's
      const ParamSet theirs = shard_params(params, (env.rank + 1) % env.world, env.world);
      torch::NoGradGuard no_grad;
      auto named = model.named_parameters();
      for (const NamedArray& a : theirs.items)
        named[a.name].copy_(torch::tensor(a.data, torch::kDouble).reshape(a.shape));
    } else {
      model.load(params);
    }

    const torch::Tensor x =
        torch::tensor(data.x, torch::kDouble).reshape({B, T, cfg.input_width()}).to(torch::kFloat).requires_grad_();
    torch::Tensor h = x, sq;
    for (int l = 0; l < cfg.layers; ++l) {
      const Unit u{l, BlockPart::whole};
      // Called again in backward (the recompute): captures nothing of this loop by reference.
      auto block = [&model, u](const torch::Tensor& in) {
        torch::Tensor s;
        torch::Tensor out = model.run_unit(u, in, {}, &s);
        return std::vector<torch::Tensor>{out, s};
      };
      std::vector<torch::Tensor> outs;
      if (mode == "checkpoint" || mode == "checkpoint-unshown" || mode == "checkpoint-selective") {
        CheckpointOptions options;
        if (mode != "checkpoint-unshown") options.generators = tracker.generators();
        outs = ckv::checkpoint([block](const std::vector<c10::IValue>& in) { return block(in.at(0).toTensor()); }, {h},
                               options);
      } else {
        outs = block(h);
      }
      h = outs[0];
      sq = sq.defined() ? sq + outs[1] : outs[1];
    }
    const torch::Tensor targets = torch::tensor(data.targets, torch::kLong).reshape({B, T});
    torch::Tensor loss = model.head_loss(h, targets, {});
    if (cfg.aux_weight != 0.0) loss = loss + cfg.aux_weight * sq;
    tap.set_context(0, 0, 1);
    loss.backward();

    std::vector<SiteCall> gathered = tap.calls();
    std::vector<ReluCall> relu = tap.relu_calls();
    gather_calls(*world, gathered, relu);
    const DropoutMasks masks = reference_masks(gathered, relu, tap.noise_calls(), tap.jitter_calls(), cfg, p, 0, 0);
    const ReferenceResult ref = reference_forward_backward(cfg, params, data, masks);

    std::string bad;
    auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
      if (got.size() != want.size()) return false;
      double scale = 0.0;
      for (double w : want) scale = std::max(scale, std::abs(w));
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::abs(got[i] - want[i]) <= 1e-4 * scale + 1e-6)) return false;
      return true;
    };
    if (!near({loss.item<double>()}, {ref.loss})) bad += " loss";
    if (!near(to_doubles(x.grad()), ref.dx)) bad += " x.grad";
    const ParamSet mine = model.grads(), want = shard_params(ref.grads, env.rank, env.world);
    for (size_t i = 0; i < want.items.size(); ++i)
      if (mine.items.at(i).name != want.items[i].name || !near(mine.items[i].data, want.items[i].data))
        bad += " " + want.items[i].name;
    // Every recompute's mask is its forward's.
    int replay_differ = 0;
    for (const SiteCall& c : tap.calls())
      if (c.mask.defined() && c.call > 0)
        for (const SiteCall& f : tap.calls())
          if (f.call == 0 && f.layer == c.layer && f.site == c.site && !torch::equal(f.mask, c.mask)) ++replay_differ;
    if (replay_differ) bad += " recompute-masks";
    // Parallel consistency: model-parallel masks differ across the ranks, replicated ones and the
    // replicated parameters and gradients do not (shard.hpp).
    const std::vector<std::string> consistency = parallel_consistency(*world, tap.calls(), p, model);
    if (!consistency.empty()) {
      const bool mp = consistency.front().find("model-parallel masks") != std::string::npos;
      const bool rep = consistency.front().find("replicated masks") != std::string::npos;
      bad += mp ? " model-parallel-masks-equal" : rep ? " replicated-masks-differ" : " replicated-values";
    }
    const auto& ledger = *shard.region->ledger;
    line += (line.empty() ? "" : " ; ") + (bad.empty() ? std::string("held") : "differs:" + bad.substr(1)) + " " +
            std::to_string(ledger.count(Pass::forward)) + "/" + std::to_string(ledger.count(Pass::recompute)) + "/" +
            std::to_string(ledger.count(Pass::backward));
  }
  std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt") << line << "\n";
  world->barrier();
  return 0;
}

// The two reentrant designs below share their forward and their recompute: a block of this model,
// run under no_grad in the forward with only its input saved, and again with grad from a detached copy
// of the input in backward.
TransformerImpl* reentrant_model = nullptr;
struct ReentrantBlock {
  static torch::Tensor block(const torch::Tensor& x, int64_t layer) {
    return reentrant_model->run_unit(Unit{static_cast<int>(layer), BlockPart::whole}, x, {});
  }
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t layer) {
    ctx->save_for_backward({x});
    ctx->saved_data["layer"] = layer;
    torch::NoGradGuard no_grad;
    return block(x, layer);
  }
  // The detached input (requires grad) and the block's output recomputed from it.
  static std::pair<torch::Tensor, torch::Tensor> recompute(torch::autograd::AutogradContext* ctx) {
    const torch::Tensor x = ctx->get_saved_variables().at(0).detach().requires_grad_();
    torch::AutoGradMode grad(true);
    return {x, block(x, ctx->saved_data["layer"].toInt())};
  }
};

// A reentrant checkpoint of the oldest kind: its backward runs a nested backward through the recomputed
// graph, which accumulates straight into the parameters' .grad (torch.utils.checkpoint(use_reentrant=
// True) does this). Each nested backward runs the parameters' AccumulateGrad, so a parameter read by two
// such segments is accumulated twice.
struct NestedBackwardCheckpoint : torch::autograd::Function<NestedBackwardCheckpoint>, ReentrantBlock {
  using ReentrantBlock::forward;
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto [x, out] = recompute(ctx);
    torch::autograd::backward({out}, {grads.at(0)});
    return {x.grad(), torch::Tensor()};
  }
};

// A reentrant checkpoint that differentiates its recompute in two passes, one for the input's gradient
// and one for the parameters' (as designs do that treat them separately): each pass runs the backward
// of every tensor-parallel region on its path, so the backward all-reduces are issued twice. The
// gradients are right; only the ledger shows it.
struct TwoPassCheckpoint : torch::autograd::Function<TwoPassCheckpoint>, ReentrantBlock {
  using ReentrantBlock::forward;
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto [x, out] = recompute(ctx);
    const torch::Tensor dx = torch::autograd::grad({out}, {x}, {grads.at(0)}, /*retain_graph=*/true)[0];
    const int layer = static_cast<int>(ctx->saved_data["layer"].toInt());
    const std::vector<torch::Tensor> params = reentrant_model->unit_params(Unit{layer, BlockPart::whole});
    const auto dp = torch::autograd::grad({out}, params, {grads.at(0)}, /*retain_graph=*/false, false, true);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!dp[i].defined()) continue;
      torch::Tensor& g = const_cast<torch::Tensor&>(params[i]).mutable_grad();
      g = g.defined() ? g + dp[i] : dp[i].clone();
    }
    return {dx, torch::Tensor()};
  }
};

// The block stack of `model` on x, every block run as `how` says: the builtin checkpoint ("checkpoint",
// "kept": the model's shard decides whether all-reduce outputs are kept), NestedBackwardCheckpoint
// ("nested"), TwoPassCheckpoint ("two-pass"), or plainly. The reentrant designs run reentrant_model.
torch::Tensor run_blocks(TransformerImpl& model, const torch::Tensor& x, const std::string& how) {
  torch::Tensor h = x;
  for (int l = 0; l < model.config().layers; ++l) {
    const Unit u{l, BlockPart::whole};
    auto block = [&model, u](const torch::Tensor& in) { return model.run_unit(u, in, {}); };
    if (how == "checkpoint" || how == "kept")
      h = ckv::checkpoint(block, h);
    else if (how == "nested")
      h = NestedBackwardCheckpoint::apply(h, static_cast<int64_t>(l));
    else if (how == "two-pass")
      h = TwoPassCheckpoint::apply(h, static_cast<int64_t>(l));
    else
      h = block(h);
  }
  return h;
}
// A micro-batch's block-stack input, requiring grad (a reentrant checkpoint's output requires grad only
// through its tensor inputs).
torch::Tensor input_of(const CaseData& data, const ModelConfig& cfg) {
  return torch::tensor(data.x, torch::kDouble)
      .reshape({data.batch, data.seq, cfg.input_width()})
      .to(torch::kFloat)
      .requires_grad_();
}

// Data parallelism: every rank a replica of the whole Transformer (blocks tied to layer 0, so one
// parameter is read by both blocks) on its own data, two micro-batches, the DDP-style reducer averaging
// each parameter's gradient. Every rank checks its gradients against the mean over replicas and
// micro-batches of the fp64 reference's, and counts the reducer's hook fires per backward.
// Modes: plain; checkpoint (each block in the builtin); nested (each block in NestedBackwardCheckpoint,
// whose nested backwards accumulate the tied parameters twice: the hook fires twice).
// Every mode runs after a plain run on the same ranks, whose ledger the ledger rule compares with.
// Writes "held" or "differs:<what>", then "fires=<most fires of a parameter in one backward>", the
// backward all-reduces, and "rule=<violations of the ledger rule>" with the first one.
int dp_transformer(const RankEnv& env, const std::string& mode) {
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(30)});
  ModelConfig cfg;
  cfg.layers = 2, cfg.d_model = 8, cfg.heads = 2, cfg.ffn_mult = 2, cfg.tie = Tie::blocks;
  const int B = 2, T = 4, micro = 2;
  const ParamSet params = make_params(cfg, 5);
  struct Run {
    ParamSet grads;
    int most = 0;  // most fires of one parameter's hook in one backward
    std::vector<CollectiveRecord> ledger;
  };
  auto run = [&](const std::string& how) {
    torch::manual_seed(3);
    SiteTap tap(DropoutImpl::explicit_mask, {0.0, 0.0, 0.0, 0.0});
    TransformerImpl model(cfg, &tap);
    model.load(params);
    reentrant_model = &model;
    auto ledger = std::make_shared<CollectiveLedger>();
    GradReducer reducer(world, model.parameters(), ledger);
    Run r;
    for (int m = 0; m < micro; ++m) {
      const CaseData data = make_case_data(cfg, B, T, 5, env.rank * micro + m);  // every replica its own data
      const torch::Tensor h = run_blocks(model, input_of(data, cfg), how);
      const torch::Tensor loss = model.head_loss(h, torch::tensor(data.targets, torch::kLong).reshape({B, T}), {});
      reducer.begin_backward();
      loss.backward();
      for (int f : reducer.fires()) r.most = std::max(r.most, f);
    }
    r.grads = model.grads();
    r.ledger = ledger->records();
    return r;
  };
  const Run plain = run("plain"), test = run(mode);
  // The mean over the replicas of each one's summed micro-batch gradients.
  ParamSet want = zeros_like(params);
  for (int r = 0; r < env.world; ++r)
    for (int m = 0; m < micro; ++m) {
      const ReferenceResult ref = reference_forward_backward(cfg, params, make_case_data(cfg, B, T, 5, r * micro + m),
                                                             DropoutMasks::none(cfg.layers));
      for (size_t i = 0; i < want.items.size(); ++i)
        for (size_t k = 0; k < want.items[i].data.size(); ++k)
          want.items[i].data[k] += ref.grads.items[i].data[k] / env.world;
    }
  std::string bad;
  for (size_t i = 0; i < want.items.size(); ++i) {
    double scale = 0.0;
    for (double w : want.items[i].data) scale = std::max(scale, std::abs(w));
    for (size_t k = 0; k < want.items[i].data.size(); ++k)
      if (!(std::abs(test.grads.items[i].data[k] - want.items[i].data[k]) <= 1e-4 * scale + 1e-6)) {
        bad += " " + want.items[i].name;
        break;
      }
  }
  const std::vector<std::string> rule = ledger_violations(plain.ledger, test.ledger);
  int backward = 0;
  for (const auto& r : test.ledger) backward += r.pass == Pass::backward;
  std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt")
      << (bad.empty() ? std::string("held") : "differs:" + bad.substr(1)) << " fires=" << test.most << " " << backward
      << " rule=" << rule.size() << (rule.empty() ? "" : " " + rule.front()) << "\n";
  world->barrier();
  return 0;
}

// The ledger rule on the sharded Transformer (2 layers, no dropout): a plain run, then the same under
// `mode` on the same ranks; writes "rule=<labels violating it>" with the first, and whether the
// gradients match the plain run's ("match" / "differ"). Modes: checkpoint (the builtin, which repeats
// forward all-reduces only), kept (the same with the all-reduce outputs kept), two-pass
// (TwoPassCheckpoint, which issues every backward all-reduce twice).
int tp_ledger(const RankEnv& env, const std::string& mode) {
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(30)});
  ModelConfig cfg;
  cfg.layers = 2, cfg.d_model = 8, cfg.heads = 2 * env.world, cfg.ffn_mult = 2;
  const int B = 2, T = 4;
  const ParamSet params = make_params(cfg, 5);
  const CaseData data = make_case_data(cfg, B, T, 5);
  struct Run {
    std::vector<CollectiveRecord> ledger;
    ParamSet grads;
  };
  auto run = [&](const std::string& how) {
    torch::manual_seed(11);
    RngTracker tracker;
    tracker.add(kModelParallelStream, 1000 + static_cast<uint64_t>(env.rank));
    TensorShard shard;
    shard.rank = env.rank, shard.size = env.world, shard.tracker = &tracker, shard.keep_reduced = how == "kept";
    shard.region = std::make_shared<ParallelRegion>();
    shard.region->group = world;
    shard.region->ledger = std::make_shared<CollectiveLedger>();
    SiteTap tap(DropoutImpl::explicit_mask, {0.0, 0.0, 0.0, 0.0});
    TransformerImpl model(cfg, &tap, nullptr, shard);
    model.load(params);
    reentrant_model = &model;
    const torch::Tensor h = run_blocks(model, input_of(data, cfg), how);
    model.head_loss(h, torch::tensor(data.targets, torch::kLong).reshape({B, T}), {}).backward();
    return Run{shard.region->ledger->records(), model.grads()};
  };
  const Run plain = run("plain"), test = run(mode);
  bool match = true;
  for (size_t i = 0; i < plain.grads.items.size(); ++i)
    for (size_t k = 0; k < plain.grads.items[i].data.size(); ++k)
      match = match && std::abs(plain.grads.items[i].data[k] - test.grads.items[i].data[k]) <= 1e-5;
  const std::vector<std::string> rule = ledger_violations(plain.ledger, test.ledger);
  std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt")
      << "rule=" << rule.size() << (rule.empty() ? "" : " " + rule.front()) << " " << (match ? "match" : "differ")
      << "\n";
  world->barrier();
  return 0;
}

// A function whose backward gives its input no gradient (an undefined one), as a custom function may.
struct NoGradient : torch::autograd::Function<NoGradient> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x * 1.0; }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    return {torch::Tensor()};
  }
};

// The reducer's edges, one parameter p = ones(3) on every rank:
//   undefined: rank 0's backward gives p the gradient 2 per element, rank 1's an undefined one (its
//     accumulator runs without a gradient): both must reduce, and hold 1 (writes "fires=<n> grad=<p.grad>");
//   set_data: p moved to double after the reducer was built (a new accumulator): begin_backward refuses;
//   create_graph: a backward with create_graph through the hook is refused;
//   keep_twice: a checkpointed call leaving one region label twice with keep_in_checkpoint is refused.
int dp_edge(const RankEnv& env, const std::string& mode) {
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(30)});
  // Every rank past its connections before any refuses and ends: on a loaded machine a rank that ended
  // first made its peer fail in Gloo's set-up ("connection closed"), not with the refusal the test reads.
  world->barrier();
  if (mode == "keep_twice") {
    auto region = std::make_shared<ParallelRegion>();
    region->group = world;
    const torch::Tensor x = torch::ones({2, 2}).requires_grad_();
    auto fn = [region](const torch::Tensor& in) {
      const torch::Tensor a = leave_parallel(torch::tanh(in), region, "r", true);
      return leave_parallel(torch::tanh(a), region, "r", true);
    };
    ckv::checkpoint(fn, x).sum().backward();
    return 0;
  }
  torch::Tensor p = torch::ones({3}).requires_grad_();
  GradReducer reducer(world, {p});
  if (mode == "set_data") {
    torch::NoGradGuard no_grad;
    p.set_data(p.to(torch::kDouble));
  }
  reducer.begin_backward();
  if (mode == "create_graph") {
    const torch::Tensor g = torch::autograd::grad({(p * p).sum()}, {p}, {}, /*retain_graph=*/true,
                                                  /*create_graph=*/true)[0];
    g.sum().backward({}, /*retain_graph=*/true, /*create_graph=*/true);
  } else if (env.rank == 0) {
    (p * 2).sum().backward();
  } else {
    NoGradient::apply(p).sum().backward();
  }
  std::ostringstream out;
  out << "fires=" << reducer.fires().at(0) << " grad=";
  const torch::Tensor g = p.grad();
  for (int64_t i = 0; g.defined() && i < g.numel(); ++i) out << (i ? "," : "") << g[i].item<double>();
  std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt") << out.str() << "\n";
  world->barrier();
  return 0;
}

int all_reduce_ranks(const RankEnv& env) {
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
  torch::Tensor t = torch::full({3}, static_cast<float>(env.rank + 1));
  world->all_reduce_sum_(t);
  const float want = static_cast<float>(env.world * (env.world + 1) / 2);
  const auto gathered = world->all_gather(torch::full({2}, static_cast<float>(env.rank)));
  for (int r = 0; r < env.world; ++r)
    if (gathered[static_cast<size_t>(r)][0].item<float>() != static_cast<float>(r)) {
      std::cerr << "all_gather: slot " << r << " holds another rank's tensor\n";
      return 1;
    }
  if (t[0].item<float>() != want) {
    std::cerr << "all_reduce gave " << t[0].item<float>() << ", want " << want << "\n";
    return 1;
  }
  std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt") << t[0].item<float>() << "\n";
  return 0;
}
}  // namespace

int dist_rank_main(int argc, char** argv) {
  try {
    if (argc < 2) throw std::runtime_error("usage: dist_rank SCENARIO [MODE]");
    const std::string scenario = argv[1];
    const RankEnv env = RankEnv::from_environment();
    torch::set_num_threads(1);
    if (scenario == "all_reduce") return all_reduce_ranks(env);
    if (scenario == "tp_mlp") return tp_mlp(env, argc > 2 ? argv[2] : "plain");
    if (scenario == "tp_dropout") return tp_dropout(env, argc > 2 ? argv[2] : "plain");
    if (scenario == "tp_ledger") return tp_ledger(env, argc > 2 ? argv[2] : "checkpoint");
    if (scenario == "dp_edge") return dp_edge(env, argc > 2 ? argv[2] : "undefined");
    if (scenario == "dp_transformer") return dp_transformer(env, argc > 2 ? argv[2] : "plain");
    if (scenario == "tp_transformer") return tp_transformer(env, argc > 2 ? argv[2] : "plain");
    if (scenario == "hang") {  // rank 1 never finishes (and ignores SIGTERM); the others do
      if (env.rank == 1) {
        std::signal(SIGTERM, SIG_IGN);
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      return 0;
    }
    if (scenario == "crash") {  // rank 1 aborts before the collective rank 0 waits in
      if (env.rank == 1) std::abort();
      auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(60)});
      torch::Tensor t = torch::ones({1});
      world->all_reduce_sum_(t);
      return 0;
    }
    if (scenario == "fail") {
      if (env.rank == 1) {
        std::cerr << "rank 1: planted failure\n";
        return 3;
      }
      return 0;
    }
    auto write_result = [&](const std::string& text) {
      std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt") << text << "\n";
    };
    // Rank 1 stops itself (SIGSTOP, as a user or a debugger would stop it); rank 0 fails once it sees rank
    // 1 stopped: the launcher must report rank 1 as seen stopped, and rank 0 not.
    if (scenario == "self_stop") {
      if (env.rank == 1) {
        write_result(std::to_string(::getpid()));
        ::raise(SIGSTOP);
        return 0;
      }
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      std::string peer;
      while (std::chrono::steady_clock::now() < until) {
        std::ifstream in(dir_of(env.store) + "/result1.txt");
        if (std::getline(in, peer) && !peer.empty() && process_stopped(std::stoi(peer))) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::cerr << "rank 0: gave up on rank 1\n";
      return 1;
    }
    if (scenario == "sleep_pid") {  // every rank: its pid, then sleeps, deaf to SIGTERM
      std::signal(SIGTERM, SIG_IGN);
      write_result(std::to_string(::getpid()));
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (scenario == "escape") {  // rank 1 leaves the ranks' process group and sleeps
      if (env.rank == 1) {
        ::setsid();
        write_result(std::to_string(::getpid()));
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      return 0;
    }
    if (scenario == "ordered_failure") {  // rank 1 fails first; rank 0 fails 2 s later
      if (env.rank == 1) {
        std::cerr << "the real cause\n";
        return 1;
      }
      // 2 s, not 300 ms: on a loaded machine rank 1's process can start more than 300 ms after rank 0's
      // (seen in CI on the floor build), and the test would then judge the launch order, not first_failure.
      std::this_thread::sleep_for(std::chrono::milliseconds(2000));
      std::cerr << "a consequence\n";
      return 2;
    }
    if (scenario == "flood") {  // rank 0 writes 5 MB on one line, then one short line, and fails
      if (env.rank == 0) {
        std::cerr << std::string(5 << 20, 'x') << "\nthe end\n";
        return 1;
      }
      return 0;
    }
    if (scenario == "same_name") {  // ranks {0,1} and {2,3} each form a subgroup named "tp"
      auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
      const int base = env.rank / 2 * 2;
      auto tp = world->subgroup("tp", {base, base + 1});
      torch::Tensor t = torch::full({1}, static_cast<float>(env.rank + 1));
      tp->all_reduce_sum_(t);
      write_result(std::to_string(static_cast<int>(t.item<float>())));
      return 0;
    }
    if (scenario == "shape_mismatch") {  // rank r all-reduces r + 2 elements
      auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
      torch::Tensor t = torch::ones({2 + env.rank});
      try {
        world->all_reduce_sum_(t);
        write_result("reduced");
      } catch (const std::invalid_argument& e) {
        write_result(std::string(e.what()).find("elements") != std::string::npos ? "refused" : e.what());
      }
      return 0;
    }
    // How collectives travel (group.hpp): a tensor small enough goes with its size check and is summed on
    // every rank, a larger one goes to Gloo after the check, messages longer than a block take a second
    // collective. Modes:
    // - "sums": fp32, fp64, bf16 and int64 tensors on both paths hold the ranks' sum, the same bytes on
    //   every rank; on two ranks the inline sum equals Gloo's bit for bit (a + b either way). Writes
    //   "summed <hash of the results>".
    // - "bytes": messages of 0, 10 and 40000 bytes come back as sent ("gathered").
    // - "large_mismatch" (rank r passes 5000 + r floats), "straddle" (rank 0 passes 3, the others 5000),
    //   "kinds" (rank 0 all-reduces, the others all-gather): refused on every rank, naming the sizes or
    //   the collectives ("refused").
    if (scenario == "exchange") {
      const std::string mode = argc > 2 ? argv[2] : "sums";
      auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
      // Rank r's contribution: irrational-ish values whose sum rounds, so that the order shows.
      auto part = [](int r, int64_t n, torch::ScalarType type) {
        const torch::Tensor x = torch::arange(n, torch::kDouble);
        torch::Tensor v = torch::sin(x * (0.37 + r)) * (1.0 + r / 3.0) + 1.0 / (3.0 + r);
        if (type == torch::kLong) v = (v * 1000).round();
        return v.to(type);
      };
      try {
        if (mode == "sums") {
          std::string hashes, wrong;
          auto expect = [&](bool ok, const std::string& what, torch::ScalarType type, int64_t n) {
            if (!ok) wrong += what + "(" + std::string(c10::toString(type)) + "," + std::to_string(n) + ") ";
          };
          for (const auto type : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kLong}) {
            for (const int64_t n : {int64_t{3}, int64_t{5000}}) {
              torch::Tensor t = part(env.rank, n, type);
              world->all_reduce_sum_(t);
              torch::Tensor want = part(0, n, type).to(torch::kDouble);
              for (int r = 1; r < env.world; ++r) want += part(r, n, type).to(torch::kDouble);
              const double tol = type == torch::kBFloat16 ? 0.05 : type == torch::kFloat ? 1e-5 : 1e-12;
              expect(t.scalar_type() == type && t.to(torch::kDouble).sub(want).abs().max().item<double>() <=
                                                    tol * (1 + want.abs().max().item<double>()),
                     "sum", type, n);
              if (n == 3) {
                // The inline sum in rank order, as group.cpp documents it.
                const bool narrow = type == torch::kBFloat16;
                torch::Tensor order = part(0, n, type).to(narrow ? torch::kFloat : type);
                for (int r = 1; r < env.world; ++r) order.add_(part(r, n, type).to(narrow ? torch::kFloat : type));
                expect(torch::equal(order.to(type), t), "order", type, n);
                // On two ranks, Gloo's own sum of the same values (the head of a large tensor) is the same.
                if (env.world == 2) {
                  torch::Tensor big = part(env.rank, 5000, type);
                  big.narrow(0, 0, 3).copy_(part(env.rank, 3, type));
                  world->all_reduce_sum_(big);
                  expect(torch::equal(big.narrow(0, 0, 3), t), "gloo", type, n);
                }
              }
              const torch::Tensor bytes = t.contiguous().view(torch::kUInt8);
              hashes += std::to_string(std::hash<std::string>{}(std::string(static_cast<const char*>(bytes.data_ptr()),
                                                                            static_cast<size_t>(bytes.numel())))) +
                        ",";
            }
          }
          write_result(wrong.empty() ? "summed " + hashes : "wrong: " + wrong);
        } else if (mode == "bytes") {
          const std::vector<size_t> lengths{0, 10, 40000};
          auto message = [&](int r) {
            std::string m(lengths[static_cast<size_t>(r) % lengths.size()], '\0');
            for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<char>((i * 7 + static_cast<size_t>(r)) % 256);
            return m;
          };
          const std::vector<std::string> all = world->all_gather_bytes(message(env.rank));
          bool same = static_cast<int>(all.size()) == env.world;
          for (int r = 0; same && r < env.world; ++r) same = all[static_cast<size_t>(r)] == message(r);
          write_result(same ? "gathered" : "wrong");
        } else {
          torch::Tensor t = torch::ones({mode == "large_mismatch"              ? 5000 + env.rank
                                         : mode == "straddle" && env.rank == 0 ? 3
                                                                               : 5000});
          if (mode == "kinds" && env.rank != 0)
            world->all_gather(t);
          else
            world->all_reduce_sum_(t);
          write_result("reduced");
        }
      } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        const bool named =
            what.find(mode == "kinds" ? "is in all_reduce, rank" : "elements") != std::string::npos ||
            (mode == "kinds" && what.find("is in all_gather, rank 0 in all_reduce") != std::string::npos);
        write_result(named ? "refused" : what);
      }
      return 0;
    }
    // Collectives charge no LibTorch memory to the run whose step is current (model/memory.hpp): the
    // memory properties compare runs whose own tensors are a few hundred bytes. Writes "uncharged", or
    // the bytes charged per collective.
    if (scenario == "exchange_memory") {
      auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
      torch::Tensor small = torch::ones({6, 8}), large = torch::ones({5000}),
                    half = torch::ones({6, 8}, torch::kBFloat16);
      world->all_reduce_sum_(small);  // the first collective sets up Gloo's own state
      const MemoryReporting reporting;
      MemoryAccount account(c10::DeviceType::CPU);
      std::string charged;
      auto measure = [&](const std::string& what, const std::function<void()>& collective) {
        const ChargeTo to(&account);
        account.reset_peak();
        const int64_t before = account.live();
        collective();
        if (account.peak() > before) charged += what + ": " + std::to_string(account.peak() - before) + " ";
      };
      measure("all_reduce small", [&] { world->all_reduce_sum_(small); });
      measure("all_reduce bf16", [&] { world->all_reduce_sum_(half); });
      measure("all_reduce large", [&] { world->all_reduce_sum_(large); });
      measure("all_gather_bytes", [&] { world->all_gather_bytes(std::string(40000, 'x')); });
      write_result(charged.empty() ? "uncharged" : charged);
      return 0;
    }
    // A list of tensors of several dtypes and shapes (an empty one, bools, bf16) gathered at once; with
    // "mismatch", rank r's second tensor has r + 2 elements; with "length", rank 1 passes one more.
    if (scenario == "gather_many") {
      const std::string mode = argc > 2 ? argv[2] : "equal";
      auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
      auto list = [&](int r) {
        std::vector<torch::Tensor> ts{torch::full({2, 3}, 1.5 + r, torch::kDouble),
                                      torch::arange(5, torch::kInt) + r,
                                      torch::empty({0}),
                                      torch::tensor({r % 2 == 0, true, false}),
                                      torch::full({4}, 0.25 * r, torch::kBFloat16),
                                      torch::tensor(static_cast<int64_t>(r) << 40)};
        if (mode == "mismatch") ts[1] = torch::arange(2 + r, torch::kInt);
        if (mode == "length" && r == 1) ts.push_back(torch::ones({1}));
        return ts;
      };
      try {
        const auto all = world->all_gather_many(list(env.rank));
        bool same = static_cast<int>(all.size()) == env.world;
        for (int r = 0; same && r < env.world; ++r) {
          const auto want = list(r);
          same = all[static_cast<size_t>(r)].size() == want.size();
          for (size_t i = 0; same && i < want.size(); ++i) {
            const torch::Tensor& got = all[static_cast<size_t>(r)][i];
            same = got.scalar_type() == want[i].scalar_type() && got.sizes() == want[i].sizes() &&
                   torch::equal(got, want[i]);
          }
        }
        write_result(same ? "gathered" : "wrong");
      } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        const bool named = what.find(mode == "length" ? "a list of" : "tensor 1:") != std::string::npos;
        write_result(named ? "refused" : what);
      }
      return 0;
    }
    if (scenario == "create_graph") {  // a gradient penalty through enter_parallel
      auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(20)});
      auto region = std::make_shared<ParallelRegion>();
      region->group = world;
      const torch::Tensor x = torch::ones({3}).requires_grad_();
      const torch::Tensor y = enter_parallel(x, region, "in").pow(3).sum();
      try {
        torch::autograd::grad({y}, {x}, {}, true, true);
        write_result("differentiated");
      } catch (const std::exception& e) {
        write_result(std::string(e.what()).find("create_graph") != std::string::npos ? "refused" : e.what());
      }
      return 0;
    }
    if (scenario == "orphan") {  // rank 0 leaves a child of its own behind (in the ranks' group)
      pid_t child = 0;
      if (env.rank == 0 && (child = ::fork()) == 0) {
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      std::ofstream(dir_of(env.store) + "/result" + std::to_string(env.rank) + ".txt") << child << "\n";
      return 0;
    }
    throw std::runtime_error("unknown scenario " + scenario);
  } catch (const std::exception& e) {
    std::cerr << "rank: " << e.what() << "\n";
    return 2;
  }
}
