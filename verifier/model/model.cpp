// verifier/model/model.cpp: see model.hpp. The equations mirror reference/transformer.hpp line by line.
#include "verifier/model/model.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "verifier/checkpoint/segment_scope.hpp"
#include "verifier/dist/collectives.hpp"
#include "verifier/dist/rng_tracker.hpp"

namespace ckv {

NormImpl::NormImpl(NormKind kind, int64_t d) : kind_(kind), d_(d) {
  weight_ = register_parameter("weight", torch::ones({d}));
  if (kind == NormKind::layer) bias_ = register_parameter("bias", torch::zeros({d}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  if (kind_ == NormKind::layer) return torch::layer_norm(x, {d_}, weight_, bias_, kNormEps);
  // RMSNorm in fp32 whatever autocast does, as LayerNorm is (autocast runs layer_norm in fp32).
  const torch::Tensor xf = x.to(torch::kFloat);
  return xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + kNormEps) * weight_;
}

BatchNormImpl::BatchNormImpl(int64_t d) {
  weight_ = register_parameter("weight", torch::ones({d}));
  bias_ = register_parameter("bias", torch::zeros({d}));
  running_mean = register_buffer("running_mean", torch::zeros({d}));
  running_var = register_buffer("running_var", torch::ones({d}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& x, bool update) {
  const torch::Tensor flat = x.to(torch::kFloat).reshape({-1, x.size(-1)});
  // Without the update (a recompute) the same op runs on copies of the running statistics: a
  // non-reentrant checkpoint needs the recompute to save the same tensors as the forward, and passing
  // no running statistics would change what batch_norm saves.
  torch::Tensor mean = running_mean, var = running_var;
  if (!update) mean = mean.clone(), var = var.clone();
  const torch::Tensor y = torch::batch_norm(flat, weight_, bias_, mean, var, /*training=*/true, kBatchNormMomentum,
                                            kNormEps, /*cudnn_enabled=*/false);
  if (update) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return y.reshape(x.sizes());
}

namespace {
// Where a replicated activation enters this rank's column-parallel layers: identity forward, the
// gradient all-reduced in backward (each rank's is a partial sum). Unsharded: x itself.
torch::Tensor enter_region(const TensorShard& s, const torch::Tensor& x, int layer, const char* part) {
  if (!s.sharded()) return x;
  return dist::enter_parallel(x, s.region, "layer" + std::to_string(layer) + "." + part + ".in");
}
// A row-parallel projection: this rank's partial product, summed over the ranks, then the bias (once).
torch::Tensor row_parallel(const TensorShard& s, torch::nn::Linear& lin, const torch::Tensor& x, int layer,
                           const char* part) {
  if (!s.sharded()) return lin->forward(x);
  const torch::Tensor sum = dist::leave_parallel(torch::linear(x, lin->weight), s.region,
                                                 "layer" + std::to_string(layer) + "." + part + ".out", s.keep_reduced);
  // In the product's dtype, as Linear adds it under autocast (an fp32 bias would promote the sum).
  return sum + lin->bias.to(sum.scalar_type());
}
// A dropout site inside a tensor-parallel region: drawn from the model-parallel stream when sharded.
torch::Tensor region_dropout(const TensorShard& s, SiteTap& tap, const torch::Tensor& x, int layer, DropoutSite site) {
  if (!s.sharded()) return tap.apply(x, layer, site);
  const auto fork = s.tracker->fork(kModelParallelStream);
  return tap.apply(x, layer, site);
}
// A dropout site outside the regions: the default generator, equal on every rank (the stream only
// under the fault that draws it from there).
torch::Tensor replicated_dropout(const TensorShard& s, SiteTap& tap, const torch::Tensor& x, int layer,
                                 DropoutSite site) {
  if (!s.sharded() || !s.replicated_from_stream) return tap.apply(x, layer, site);
  const auto fork = s.tracker->fork(kModelParallelStream);
  return tap.apply(x, layer, site);
}
void check_shard(const ModelConfig& c, const TensorShard& s) {
  if (!s.sharded()) return;
  const std::string why = tp_error(c, s.size);
  if (!why.empty()) throw std::invalid_argument("model: " + why);
  if (s.rank < 0 || s.rank >= s.size)
    throw std::invalid_argument("model: tensor-parallel rank " + std::to_string(s.rank) + " of " +
                                std::to_string(s.size));
  if (!s.region || !s.region->group || !s.tracker)
    throw std::logic_error("model: a sharded model needs its region's group and the RNG tracker");
  if (s.region->group->rank() != s.rank)
    throw std::logic_error("model: the shard says tensor-parallel rank " + std::to_string(s.rank) +
                           ", its group says " + std::to_string(s.region->group->rank()));
  if (s.region->group->size() != s.size)
    throw std::logic_error("model: the tensor-parallel group has " + std::to_string(s.region->group->size()) +
                           " ranks, the shard says " + std::to_string(s.size));
}
}  // namespace

AttentionImpl::AttentionImpl(const ModelConfig& c, TensorShard shard) : c_(c), shard_(std::move(shard)) {
  const int64_t local = c.d_model / shard_.size;  // this rank's heads times the head width
  wq_ = register_module("wq", torch::nn::Linear(c.d_model, local));
  wk_ = register_module("wk", torch::nn::Linear(c.d_model, local));
  wv_ = register_module("wv", torch::nn::Linear(c.d_model, local));
  wo_ = register_module("wo", torch::nn::Linear(local, c.d_model));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x_in, const torch::Tensor& key_valid, SiteTap& tap,
                                     int layer) {
  const torch::Tensor x = enter_region(shard_, x_in, layer, "attn");
  const int64_t B = x.size(0), T = x.size(1), H = c_.heads / shard_.size, hs = c_.head_dim();
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hs}).transpose(1, 2); };  // (B,H,T,hs)
  const torch::Tensor q = heads(wq_->forward(x)), k = heads(wk_->forward(x)), v = heads(wv_->forward(x));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hs)));
  torch::Tensor blocked;  // (T,T) or (B,1,T,T), true where a query must not see a key
  if (c_.causal) blocked = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  if (key_valid.defined()) {
    const torch::Tensor padded = key_valid.logical_not().view({B, 1, 1, T});
    blocked = blocked.defined() ? (blocked | padded) : padded;
  }
  if (blocked.defined()) scores = scores.masked_fill(blocked, -std::numeric_limits<double>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1);
  probs = region_dropout(shard_, tap, probs, layer, DropoutSite::attn_probs);
  const torch::Tensor ctx =
      torch::matmul(probs.to(v.scalar_type()), v).transpose(1, 2).contiguous().view({B, T, H * hs});
  return row_parallel(shard_, wo_, ctx, layer, "attn");
}

FeedForwardImpl::FeedForwardImpl(const ModelConfig& c, TensorShard shard) : c_(c), shard_(std::move(shard)) {
  const int64_t local = c.d_ff() / shard_.size;  // this rank's hidden units
  fc1_ = register_module("fc1", torch::nn::Linear(c.d_model, local));
  if (c.activation == Activation::swiglu) gate_ = register_module("gate", torch::nn::Linear(c.d_model, local));
  fc2_ = register_module("fc2", torch::nn::Linear(local, c.d_model));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x_in, SiteTap& tap, int layer) {
  const torch::Tensor x = enter_region(shard_, x_in, layer, "ffn");
  const torch::Tensor z1 = fc1_->forward(x);
  torch::Tensor a;
  switch (c_.activation) {
    case Activation::relu:
      a = tap.relu(z1, layer);
      break;
    case Activation::gelu_tanh:
      a = torch::gelu(z1, "tanh");
      break;
    case Activation::gelu_erf:
      a = torch::gelu(z1, "none");
      break;
    case Activation::swiglu:
      a = torch::silu(gate_->forward(x)) * z1;
      break;
  }
  a = region_dropout(shard_, tap, a, layer, DropoutSite::ffn_hidden);
  return row_parallel(shard_, fc2_, a, layer, "ffn");
}

TransformerImpl::TransformerImpl(const ModelConfig& c, SiteTap* tap, EffectState* effects, TensorShard shard)
    : c_(c), tap_(tap), effects_(effects), shard_(std::move(shard)) {
  if (c.effects && !effects) throw std::logic_error("model: side-effecting modules need an EffectState");
  check_shard(c, shard_);
  for (int l = 0; l < c.layers; ++l) {
    if (c.param_layer(l) != l) {  // tied: layer 0's modules, registered once
      blocks_.push_back(blocks_.front());
      continue;
    }
    auto sub = register_module("layer" + std::to_string(l), std::make_shared<torch::nn::Module>());
    BlockModules b;
    if (c.attention) {
      b.norm1 = sub->register_module("norm1", std::make_shared<NormImpl>(c.norm, c.d_model));
      b.attn = sub->register_module("attn", std::make_shared<AttentionImpl>(c, shard_));
    }
    b.norm2 = sub->register_module("norm2", std::make_shared<NormImpl>(c.norm, c.d_model));
    b.ffn = sub->register_module("ffn", std::make_shared<FeedForwardImpl>(c, shard_));
    if (c.has(kBatchNorm)) b.bn = sub->register_module("bn", std::make_shared<BatchNormImpl>(c.d_model));
    blocks_.push_back(b);
  }
  norm_f_ = register_module("norm_f", std::make_shared<NormImpl>(c.norm, c.d_model));
  head_ = register_module("head", torch::nn::Linear(c.d_model, c.vocab));
  named_ = named_parameters().pairs();
}

torch::Tensor TransformerImpl::attn_half(int l, const torch::Tensor& x, const torch::Tensor& key_valid) {
  const BlockModules& b = blocks_.at(static_cast<size_t>(l));
  if (c_.placement == NormPlacement::pre)
    return x + replicated_dropout(shard_, *tap_, b.attn->forward(b.norm1->forward(x), key_valid, *tap_, l), l,
                                  DropoutSite::attn_out);
  return b.norm1->forward(
      x + replicated_dropout(shard_, *tap_, b.attn->forward(x, key_valid, *tap_, l), l, DropoutSite::attn_out));
}
torch::Tensor TransformerImpl::ffn_half(int l, const torch::Tensor& x) {
  const BlockModules& b = blocks_.at(static_cast<size_t>(l));
  // The FFN's output, jittered (rand=jitter), through the ffn_out dropout site.
  auto out = [&](torch::Tensor y) {
    if (c_.rand == RandOp::jitter) y = tap_->jitter(y, l);
    return replicated_dropout(shard_, *tap_, y, l, DropoutSite::ffn_out);
  };
  if (c_.placement == NormPlacement::pre) return x + out(b.ffn->forward(b.norm2->forward(x), *tap_, l));
  return b.norm2->forward(x + out(b.ffn->forward(x, *tap_, l)));
}

// The side-effecting modules (reference/config.hpp) after block `l`'s FFN half. Each asks whether it runs
// in a recompute (segment_scope.hpp) and applies its effect once; the cache reads back in the recompute
// the value it read in the first forward. `external` does not ask: it must never be checkpointed.
torch::Tensor TransformerImpl::effects(int l, const torch::Tensor& y_in) {
  if (!c_.effects) return y_in;
  const size_t li = static_cast<size_t>(l);
  const bool recomputing = is_recomputing();
  SegmentState* segment = current_segment();
  torch::Tensor y = y_in;
  if (c_.has(kBatchNorm)) y = blocks_.at(li).bn->forward(y, /*update=*/!recomputing);
  if (c_.has(kNoise)) y = tap_->noise(y, l);
  if (c_.has(kCache)) {
    const std::string key = "cache.layer" + std::to_string(l);
    int64_t k;
    if (recomputing && segment && segment->stash.count(key)) {
      k = segment->stash.at(key).toInt();
    } else {
      k = effects_->cache_calls.at(li)++;
      if (segment) segment->stash[key] = k;
    }
    y = y * (1.0 + kCacheStep * static_cast<double>(k));
  }
  auto log = [&](const char* who) {
    std::ofstream out(effects_->log_path, std::ios::app);
    out << who << " step " << tap_->step() << " micro " << tap_->micro() << " layer " << l << "\n";
  };
  if (c_.has(kCounter) && !recomputing) ++effects_->counter.at(li);
  if (c_.has(kLog) && !recomputing) log("log");
  if (c_.has(kExternal)) {
    ++effects_->external.at(li);
    log("external");
  }
  return y;
}

torch::Tensor TransformerImpl::run_unit(const Unit& u, const torch::Tensor& h, const torch::Tensor& key_valid,
                                        torch::Tensor* sq_mean) {
  torch::Tensor out;
  switch (u.part) {
    case BlockPart::embed:
      return torch::matmul(h.to(torch::kFloat), head_->weight);  // x (B,T,V) @ head.weight (V,D)
    case BlockPart::attn:
      return c_.attention ? attn_half(u.layer, h, key_valid) : h;
    case BlockPart::whole:
      out = effects(u.layer, ffn_half(u.layer, c_.attention ? attn_half(u.layer, h, key_valid) : h));
      break;
    case BlockPart::ffn:
      out = effects(u.layer, ffn_half(u.layer, h));
      break;
  }
  if (sq_mean) {
    const torch::Tensor term = out.to(torch::kFloat).pow(2).mean();
    *sq_mean = sq_mean->defined() ? *sq_mean + term : term;
  }
  return out;
}

torch::Tensor TransformerImpl::head_loss(const torch::Tensor& h, const torch::Tensor& targets, const torch::Tensor& y) {
  // logits = h W^T + b, written with the weight as matmul's own argument (not a transposed view), as a
  // tied embedding/head often is: under autocast the cast of the weight is then cached and shared with
  // the input projection's (tie=head), exactly the situation whose gradients a checkpoint can break.
  const torch::Tensor hn = norm_f_->forward(h);
  const torch::Tensor logits =
      (torch::matmul(head_->weight, hn.to(torch::kFloat).transpose(-1, -2)).transpose(-1, -2) + head_->bias)
          .to(torch::kFloat);
  if (c_.loss == LossKind::cross_entropy)
    return torch::nn::functional::cross_entropy(logits.reshape({-1, c_.vocab}), targets.reshape({-1}));
  return torch::nn::functional::mse_loss(logits, y);
}

std::vector<torch::Tensor> TransformerImpl::unit_params(const Unit& u) {
  std::vector<std::string> names;
  auto add = [&](ModelPart part) {
    for (auto& n : part_param_names(c_, part, u.layer)) names.push_back(std::move(n));
  };
  if (u.part == BlockPart::embed) add(ModelPart::input_projection);
  if (u.part == BlockPart::whole || u.part == BlockPart::attn) add(ModelPart::block_attn);
  if (u.part == BlockPart::whole || u.part == BlockPart::ffn) add(ModelPart::block_ffn);
  std::vector<torch::Tensor> out;
  for (const auto& n : names) {
    const auto it = std::find_if(named_.begin(), named_.end(), [&](const auto& kv) { return kv.first == n; });
    if (it == named_.end()) throw std::logic_error("model: no parameter " + n);
    out.push_back(it->second);
  }
  return out;
}

void TransformerImpl::load(const ParamSet& full, bool shard_values) {
  torch::NoGradGuard no_grad;
  const bool slice = shard_.sharded() && !shard_values;
  const ParamSet sharded = slice ? shard_params(full, shard_.rank, shard_.size) : ParamSet{};
  const ParamSet& p = slice ? sharded : full;
  const auto& params = named_;
  if (params.size() != p.items.size())
    throw std::logic_error("model: " + std::to_string(params.size()) + " parameters but the layout has " +
                           std::to_string(p.items.size()));
  for (size_t i = 0; i < p.items.size(); ++i) {
    const NamedArray& a = p.items[i];
    const auto& kv = params[i];
    if (kv.first != a.name) throw std::logic_error("model: parameter " + kv.first + " is not layout's " + a.name);
    const torch::Tensor src = torch::from_blob(const_cast<double*>(a.data.data()), a.shape, torch::kDouble);
    if (src.sizes() != kv.second.sizes()) throw std::logic_error("model: parameter " + a.name + " has the wrong shape");
    kv.second.copy_(src);
  }
}

namespace {
// Layout entry `i`, which names the i-th registered parameter; looked up by name only if it does not.
NamedArray& layout_slot(ParamSet& p, size_t i, const std::string& name) {
  return i < p.items.size() && p.items[i].name == name ? p.items[i] : p.at(name);
}
}  // namespace

ParamSet TransformerImpl::values() const {
  if (shard_.sharded()) {  // the shard's own shapes
    ParamSet out;
    for (const auto& [name, value] : named_) out.items.push_back({name, value.sizes().vec(), to_doubles(value)});
    return out;
  }
  ParamSet out = param_shapes(c_);
  size_t i = 0;  // the module registers its parameters in the layout's order (load() relies on it too)
  for (const auto& [name, value] : named_) layout_slot(out, i++, name).data = to_doubles(value);
  return out;
}

ParamSet TransformerImpl::grads() const {
  if (shard_.sharded()) {  // the shard's own shapes; an undefined gradient reads as zeros
    ParamSet out;
    for (const auto& [name, value] : named_) {
      const torch::Tensor& g = value.grad();
      out.items.push_back({name, value.sizes().vec(),
                           g.defined() ? to_doubles(g) : std::vector<double>(static_cast<size_t>(value.numel()))});
    }
    return out;
  }
  ParamSet out = param_shapes(c_);  // an undefined gradient reads as zeros (grads_defined() tells)
  size_t i = 0;
  for (const auto& [name, value] : named_) {
    const torch::Tensor& g = value.grad();
    layout_slot(out, i++, name).data =
        g.defined() ? to_doubles(g) : std::vector<double>(static_cast<size_t>(value.numel()));
  }
  return out;
}

ParamSet TransformerImpl::batchnorm_state() const {
  ParamSet out;
  for (int l = 0; l < c_.layers; ++l) {
    if (c_.param_layer(l) != l || !blocks_[static_cast<size_t>(l)].bn) continue;
    const auto& bn = *blocks_[static_cast<size_t>(l)].bn;
    const std::string L = "layer" + std::to_string(l) + ".bn.";
    out.items.push_back({L + "running_mean", {c_.d_model}, to_doubles(bn.running_mean)});
    out.items.push_back({L + "running_var", {c_.d_model}, to_doubles(bn.running_var)});
    out.items.push_back({L + "num_batches_tracked", {1}, to_doubles(bn.num_batches_tracked)});
  }
  return out;
}

void TransformerImpl::load_batchnorm_state(const ParamSet& s) {
  torch::NoGradGuard no_grad;
  for (int l = 0; l < c_.layers; ++l) {
    if (c_.param_layer(l) != l || !blocks_[static_cast<size_t>(l)].bn) continue;
    auto& bn = *blocks_[static_cast<size_t>(l)].bn;
    const std::string L = "layer" + std::to_string(l) + ".bn.";
    auto put = [&](torch::Tensor& t, const std::string& name) {
      const NamedArray& a = s.at(L + name);
      t.copy_(torch::tensor(a.data, torch::kDouble).reshape(t.sizes()));
    };
    put(bn.running_mean, "running_mean");
    put(bn.running_var, "running_var");
    put(bn.num_batches_tracked, "num_batches_tracked");
  }
}

std::vector<bool> TransformerImpl::grads_defined() const {
  std::vector<bool> out;
  for (const auto& kv : named_) out.push_back(kv.second.grad().defined());
  return out;
}

std::vector<double> to_doubles(const torch::Tensor& t) {
  // A dense contiguous fp32 or fp64 CPU tensor (every parameter and gradient of a CPU run) is read in
  // place: no dispatch, no temporary tensor. The gate reads every parameter and gradient of both runs,
  // so this is a measurable share of a verified case.
  if (t.device().is_cpu() && t.layout() == torch::kStrided && t.has_storage() && !t._is_zerotensor() && !t.is_neg() &&
      t.is_contiguous()) {
    const auto n = static_cast<size_t>(t.numel());
    if (t.scalar_type() == torch::kFloat) {
      const float* p = t.data_ptr<float>();
      return std::vector<double>(p, p + n);
    }
    if (t.scalar_type() == torch::kDouble) {
      const double* p = t.data_ptr<double>();
      return std::vector<double>(p, p + n);
    }
  }
  const torch::Tensor c = t.detach().to(torch::kCPU).to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

c10::ScalarType autocast_dtype(Precision p) {
  return p == Precision::fp16 ? torch::kHalf : p == Precision::bf16 ? torch::kBFloat16 : torch::kFloat;
}

}  // namespace ckv
