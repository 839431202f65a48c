// verifier/model.hpp: the LibTorch model under test, built from the same ModelConfig as the
// reference (reference/transformer.hpp documents the block equations both follow) and loading exactly
// the same fp64-born parameters. Parameter names from named_parameters() equal the reference's names
// ("layer0.attn.wq.weight", ...), so gradients are compared name by name.
//
// The model exposes its execution units (a whole block, or its attention / FFN sub-block) so that the
// runner can group them into the segments of a checkpoint plan (plan.hpp, runner.hpp).
#pragma once

#include <torch/torch.h>

#include <memory>

#include "reference/params.hpp"
#include "verifier/case.hpp"
#include "verifier/dropout_tap.hpp"
#include "verifier/plan.hpp"

namespace ckv {

class NormImpl : public torch::nn::Module {
 public:
  NormImpl(NormKind kind, int64_t d);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  NormKind kind_;
  int64_t d_;
  torch::Tensor weight_, bias_;
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& c, int layer, DropoutTap* tap);
  torch::Tensor forward(const torch::Tensor& x);  // x (B,T,D) -> (B,T,D), before the attn_out dropout

 private:
  ModelConfig c_;
  int layer_;
  DropoutTap* tap_;
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
};

class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(const ModelConfig& c, int layer, DropoutTap* tap);
  torch::Tensor forward(const torch::Tensor& x);  // before the ffn_out dropout

 private:
  ModelConfig c_;
  int layer_;
  DropoutTap* tap_;
  torch::nn::Linear fc1_{nullptr}, gate_{nullptr}, fc2_{nullptr};
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& c, int layer, DropoutTap* tap);
  torch::Tensor attn_sub(const torch::Tensor& x);  // x + drop(Attn(N1 x)) or N1(x + drop(Attn x))
  torch::Tensor ffn_sub(const torch::Tensor& x);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  ModelConfig c_;
  int layer_;
  DropoutTap* tap_;
  std::shared_ptr<NormImpl> norm1_, norm2_;
  std::shared_ptr<AttentionImpl> attn_;
  std::shared_ptr<FeedForwardImpl> ffn_;
};

class TransformerImpl : public torch::nn::Module {
 public:
  // The model draws dropout masks through `tap`, which must outlive it.
  TransformerImpl(const ModelConfig& c, DropoutTap* tap);
  torch::Tensor run_unit(const Unit& u, const torch::Tensor& h);
  // Final norm, head and loss (fp32) for the block-stack output h.
  torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& targets, const torch::Tensor& y);
  BlockImpl& block(int l) { return *blocks_.at(static_cast<size_t>(l)); }
  const ModelConfig& config() const { return c_; }

  void load(const ParamSet& p);  // copies values (fp64 -> parameter dtype) by name
  ParamSet values() const;       // current parameters, as fp64, in layout order
  ParamSet grads() const;        // gradients (zeros where undefined), as fp64

 private:
  ModelConfig c_;
  std::vector<std::shared_ptr<BlockImpl>> blocks_;
  std::shared_ptr<NormImpl> norm_f_;
  torch::nn::Linear head_{nullptr};
};

// Copies a tensor of any dtype/device to fp64 host values (row-major).
std::vector<double> to_doubles(const torch::Tensor& t);
torch::Device parse_device(const std::string& device);
c10::ScalarType autocast_dtype(Precision p);

}  // namespace ckv
