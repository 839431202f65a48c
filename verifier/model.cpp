// verifier/model.cpp: see model.hpp. The equations mirror reference/transformer.hpp line by line.
#include "verifier/model.hpp"

#include <cmath>

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

AttentionImpl::AttentionImpl(const ModelConfig& c, int layer, DropoutTap* tap) : c_(c), layer_(layer), tap_(tap) {
  wq_ = register_module("wq", torch::nn::Linear(c.d_model, c.d_model));
  wk_ = register_module("wk", torch::nn::Linear(c.d_model, c.d_model));
  wv_ = register_module("wv", torch::nn::Linear(c.d_model, c.d_model));
  wo_ = register_module("wo", torch::nn::Linear(c.d_model, c.d_model));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = c_.heads, hs = c_.head_dim();
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hs}).transpose(1, 2); };  // (B,H,T,hs)
  const torch::Tensor q = heads(wq_->forward(x)), k = heads(wk_->forward(x)), v = heads(wv_->forward(x));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hs)));
  if (c_.causal) {
    const torch::Tensor future =
        torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  torch::Tensor probs = torch::softmax(scores, -1);
  probs = tap_->apply(probs, layer_, DropoutSite::attn_probs);
  const torch::Tensor ctx =
      torch::matmul(probs.to(v.scalar_type()), v).transpose(1, 2).contiguous().view({B, T, c_.d_model});
  return wo_->forward(ctx);
}

FeedForwardImpl::FeedForwardImpl(const ModelConfig& c, int layer, DropoutTap* tap) : c_(c), layer_(layer), tap_(tap) {
  fc1_ = register_module("fc1", torch::nn::Linear(c.d_model, c.d_ff()));
  if (c.activation == Activation::swiglu) gate_ = register_module("gate", torch::nn::Linear(c.d_model, c.d_ff()));
  fc2_ = register_module("fc2", torch::nn::Linear(c.d_ff(), c.d_model));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  const torch::Tensor z1 = fc1_->forward(x);
  torch::Tensor a;
  switch (c_.activation) {
    case Activation::relu:
      a = torch::relu(z1);
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
  a = tap_->apply(a, layer_, DropoutSite::ffn_hidden);
  return fc2_->forward(a);
}

BlockImpl::BlockImpl(const ModelConfig& c, int layer, DropoutTap* tap) : c_(c), layer_(layer), tap_(tap) {
  if (c.attention) {
    norm1_ = register_module("norm1", std::make_shared<NormImpl>(c.norm, c.d_model));
    attn_ = register_module("attn", std::make_shared<AttentionImpl>(c, layer, tap));
  }
  norm2_ = register_module("norm2", std::make_shared<NormImpl>(c.norm, c.d_model));
  ffn_ = register_module("ffn", std::make_shared<FeedForwardImpl>(c, layer, tap));
}

torch::Tensor BlockImpl::attn_sub(const torch::Tensor& x) {
  if (c_.placement == NormPlacement::pre)
    return x + tap_->apply(attn_->forward(norm1_->forward(x)), layer_, DropoutSite::attn_out);
  return norm1_->forward(x + tap_->apply(attn_->forward(x), layer_, DropoutSite::attn_out));
}
torch::Tensor BlockImpl::ffn_sub(const torch::Tensor& x) {
  if (c_.placement == NormPlacement::pre)
    return x + tap_->apply(ffn_->forward(norm2_->forward(x)), layer_, DropoutSite::ffn_out);
  return norm2_->forward(x + tap_->apply(ffn_->forward(x), layer_, DropoutSite::ffn_out));
}
torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  return ffn_sub(c_.attention ? attn_sub(x) : x);
}

TransformerImpl::TransformerImpl(const ModelConfig& c, DropoutTap* tap) : c_(c) {
  for (int l = 0; l < c.layers; ++l)
    blocks_.push_back(register_module("layer" + std::to_string(l), std::make_shared<BlockImpl>(c, l, tap)));
  norm_f_ = register_module("norm_f", std::make_shared<NormImpl>(c.norm, c.d_model));
  head_ = register_module("head", torch::nn::Linear(c.d_model, c.vocab));
}

torch::Tensor TransformerImpl::run_unit(const Unit& u, const torch::Tensor& h) {
  BlockImpl& b = block(u.layer);
  switch (u.part) {
    case BlockPart::whole:
      return b.forward(h);
    case BlockPart::attn:
      return b.attn_sub(h);
    case BlockPart::ffn:
      return b.ffn_sub(h);
  }
  return h;
}

torch::Tensor TransformerImpl::head_loss(const torch::Tensor& h, const torch::Tensor& targets, const torch::Tensor& y) {
  const torch::Tensor logits = head_->forward(norm_f_->forward(h)).to(torch::kFloat);
  if (c_.loss == LossKind::cross_entropy)
    return torch::nn::functional::cross_entropy(logits.reshape({-1, c_.vocab}), targets.reshape({-1}));
  return torch::nn::functional::mse_loss(logits, y);
}

void TransformerImpl::load(const ParamSet& p) {
  torch::NoGradGuard no_grad;
  for (auto& kv : named_parameters()) {
    const NamedArray& a = p.at(kv.key());
    torch::Tensor src = torch::from_blob(const_cast<double*>(a.data.data()), a.shape, torch::kDouble);
    if (src.sizes() != kv.value().sizes())
      throw std::invalid_argument("model: parameter " + kv.key() + " has the wrong shape");
    kv.value().copy_(src);
  }
}

ParamSet TransformerImpl::values() const {
  ParamSet out = param_layout(c_);
  for (const auto& kv : named_parameters()) out.at(kv.key()).data = to_doubles(kv.value());
  return out;
}

ParamSet TransformerImpl::grads() const {
  ParamSet out = param_layout(c_);
  for (const auto& kv : named_parameters())
    if (kv.value().grad().defined()) out.at(kv.key()).data = to_doubles(kv.value().grad());
  return out;
}

std::vector<double> to_doubles(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU).to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

torch::Device parse_device(const std::string& device) {
  return torch::Device(device);
}

c10::ScalarType autocast_dtype(Precision p) {
  return p == Precision::fp16 ? torch::kHalf : p == Precision::bf16 ? torch::kBFloat16 : torch::kFloat;
}

}  // namespace ckv
