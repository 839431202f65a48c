// verifier/model/model.hpp: the LibTorch model under test, built from the same ModelConfig as the
// reference (reference/transformer.hpp documents the equations both follow) and loading exactly the
// same fp64-born parameters. Parameter names from named_parameters() equal the reference's layout
// names ("layer0.attn.wq.weight", ...), in layout order, so gradients are compared name by name; which
// parameters a unit reads comes from the layout too (part_param_names).
//
// The model exposes its execution units (a whole block, its attention / FFN half, the tied input
// projection) so that the run stage can group them into the segments of a checkpoint plan.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "reference/params.hpp"
#include "verifier/case/case.hpp"
#include "verifier/case/plan.hpp"
#include "verifier/model/shard.hpp"
#include "verifier/model/site_tap.hpp"

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
  // Under a sharded `shard` (shard.hpp): this rank's heads, a tensor-parallel region.
  AttentionImpl(const ModelConfig& c, TensorShard shard);
  // x (B,T,D) -> (B,T,D), before the attn_out dropout. key_valid: (B,T) bool, or undefined for no padding.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_valid, SiteTap& tap, int layer);

 private:
  ModelConfig c_;
  TensorShard shard_;
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
};

class FeedForwardImpl : public torch::nn::Module {
 public:
  // Under a sharded `shard` (shard.hpp): this rank's hidden units, a tensor-parallel region.
  FeedForwardImpl(const ModelConfig& c, TensorShard shard);
  torch::Tensor forward(const torch::Tensor& x, SiteTap& tap, int layer);  // before the ffn_out dropout

 private:
  ModelConfig c_;
  TensorShard shard_;
  torch::nn::Linear fc1_{nullptr}, gate_{nullptr}, fc2_{nullptr};
};

// BatchNorm over the features of (B,T,D) in training mode, computed in fp32. `update` false (in a
// recompute) normalises with the batch statistics without touching the running ones.
class BatchNormImpl : public torch::nn::Module {
 public:
  explicit BatchNormImpl(int64_t d);
  torch::Tensor forward(const torch::Tensor& x, bool update);
  torch::Tensor running_mean, running_var, num_batches_tracked;

 private:
  torch::Tensor weight_, bias_;
};

// The state of the side-effecting modules outside the parameters (reference/config.hpp, Effect), per
// run. The run stage owns it and reads it as the side-effect ledger.
struct EffectState {
  std::vector<int64_t> counter, external;  // per layer: forwards counted (aware / unaware of recompute)
  std::vector<int64_t> cache_calls;        // per layer: forwards earlier in this step (reset per step)
  std::string log_path;                    // the run's log file
};

// One block's modules. With tie=blocks every block holds layer 0's modules (registered only by layer 0).
struct BlockModules {
  std::shared_ptr<NormImpl> norm1, norm2;
  std::shared_ptr<AttentionImpl> attn;
  std::shared_ptr<FeedForwardImpl> ffn;
  std::shared_ptr<BatchNormImpl> bn;
};

class TransformerImpl : public torch::nn::Module {
 public:
  // The model draws dropout masks through `tap`, and its side-effecting modules keep their state in
  // `effects` (may be null when the config has none); both must outlive it. A sharded `shard` makes it
  // that tensor-parallel rank's shard (shard.hpp): parameters, values() and grads() are then the shard's
  // (load() takes the full set and keeps the rank's slice); the caller seeds the default generator
  // equally on every rank of the shard's group.
  TransformerImpl(const ModelConfig& c, SiteTap* tap, EffectState* effects = nullptr, TensorShard shard = {});
  // One unit on hidden state h. key_valid: (B,T) bool or undefined. sq_mean: when given, whole blocks
  // and FFN halves add mean(y^2) of their output y to it (the auxiliary loss before its weight).
  torch::Tensor run_unit(const Unit& u, const torch::Tensor& h, const torch::Tensor& key_valid,
                         torch::Tensor* sq_mean = nullptr);
  // Final norm, head and loss (fp32) for the block-stack output h.
  torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& targets, const torch::Tensor& y);
  // The parameters a unit reads (layout order; shared parameters included).
  std::vector<torch::Tensor> unit_params(const Unit& u);
  const ModelConfig& config() const { return c_; }
  // named_parameters(), taken once when the constructor has registered every parameter: walking the
  // module tree cost more than a small Case's matrix products, and the gate reads the parameters of
  // every run several times a step. Module::to() keeps each parameter's tensor, so these stay valid.
  const std::vector<std::pair<std::string, torch::Tensor>>& named_params() const { return named_; }

  // Copies values (fp64 -> parameter dtype) by name: the unsharded model's parameters (a sharded model
  // keeps its slice), or with `shard_values` this shard's own (values() of the same rank).
  void load(const ParamSet& p, bool shard_values = false);
  ParamSet values() const;  // current parameters, as fp64, in layout order (the shard's, sharded)
  ParamSet grads() const;   // gradients (zeros where undefined), as fp64 (the shard's, sharded)
  const TensorShard& shard() const { return shard_; }
  std::vector<bool> grads_defined() const;
  // BatchNorm running statistics ("layer0.bn.running_mean", ".running_var", ".num_batches_tracked"),
  // as fp64, and loading them back.
  ParamSet batchnorm_state() const;
  void load_batchnorm_state(const ParamSet& s);

 private:
  torch::Tensor attn_half(int layer, const torch::Tensor& x, const torch::Tensor& key_valid);
  torch::Tensor ffn_half(int layer, const torch::Tensor& x);
  torch::Tensor effects(int layer, const torch::Tensor& y);

  ModelConfig c_;
  SiteTap* tap_;
  EffectState* effects_;
  TensorShard shard_;
  std::vector<BlockModules> blocks_;
  std::shared_ptr<NormImpl> norm_f_;
  torch::nn::Linear head_{nullptr};
  std::vector<std::pair<std::string, torch::Tensor>> named_;
};

// Copies a tensor of any dtype/device to fp64 host values (row-major).
std::vector<double> to_doubles(const torch::Tensor& t);
c10::ScalarType autocast_dtype(Precision p);

}  // namespace ckv
