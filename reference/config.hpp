// reference/config.hpp: the model configuration shared by the Eigen fp64 reference and the LibTorch
// model under test (verifier/model.hpp). It is the "config" part of a Case (verifier/case.hpp): both
// sides build the same Transformer from it, so it lives here, below both, with no LibTorch dependency.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckv {

enum class NormKind { layer, rms };
enum class NormPlacement { pre, post };
enum class Activation { relu, gelu_tanh, gelu_erf, swiglu };
enum class LossKind { cross_entropy, mse };
// Weight tying. blocks: every block uses layer 0's parameters (ALBERT-style), so one parameter is read
// by several layers and, under most plans, both inside and outside checkpointed segments. head: the
// head weight (vocab, d_model) is also the input projection, x (B,T,vocab) -> x @ head.weight (B,T,D),
// which runs at the start of the first segment (GPT-2's tied embedding, made differentiable).
enum class Tie { none, blocks, head };
// A tensor carried through every segment untouched: each segment receives the block-stack input x as
// one more argument and returns it as one more output, the same tensor (alias) or a view of it (view),
// and the stack's output is h + kSkipScale * x (a long skip from the stack input to the final norm).
// The values are plan independent; what it creates is a segment output that aliases a segment input,
// through which gradient reaches x (plain: none).
enum class SegOut { plain, alias, view };
inline constexpr double kSkipScale = 0.5;
// Random ops other than dropout inside a block. jitter: every block's FFN output y (before its ffn_out
// dropout) is scaled per token, y * (1 + kJitterScale * eps), eps ~ N(0,1) of shape (B,T,1) drawn from
// the device's default generator, as noisy gating and router jitter draw: B*T normals, an odd count
// where B*T is odd (the CPU generator then holds a cached normal that its state must carry).
enum class RandOp { none, jitter };
inline constexpr double kJitterScale = 0.1;

// The dropout sites of one block, in forward order. The reference never draws masks; the caller
// passes the mask drawn at each site (verifier/dropout_tap.hpp records them on the LibTorch side).
enum class DropoutSite : int { attn_probs = 0, attn_out = 1, ffn_hidden = 2, ffn_out = 3 };
inline constexpr int kNumDropoutSites = 4;
inline constexpr std::array<DropoutSite, kNumDropoutSites> kAllDropoutSites = {
    DropoutSite::attn_probs, DropoutSite::attn_out, DropoutSite::ffn_hidden, DropoutSite::ffn_out};

struct ModelConfig {
  int layers = 2;
  int d_model = 16;
  int heads = 2;
  int ffn_mult = 4;  // FFN hidden width = ffn_mult * d_model
  int vocab = 11;    // head output width (classes for cross-entropy, regression width for MSE)
  NormKind norm = NormKind::layer;
  NormPlacement placement = NormPlacement::pre;
  bool attention = true;  // false: the block is norm -> FFN -> residual only (seed 001's lab block)
  bool causal = true;
  Activation activation = Activation::gelu_tanh;
  LossKind loss = LossKind::cross_entropy;
  Tie tie = Tie::none;
  // Batch element b attends only to its first key_length(b, T) keys (a key padding mask).
  bool key_padding = false;
  // Auxiliary loss: aux_weight * mean(y^2) of every block output y, added to the loss (0: none).
  double aux_weight = 0.0;
  // Side-effecting modules after every block's FFN half (a bit set of Effect): they are what a
  // checkpoint must apply once although it runs the forward twice.
  unsigned effects = 0;
  SegOut segout = SegOut::plain;
  RandOp rand = RandOp::none;
  bool has(unsigned effect) const { return (effects & effect) != 0; }

  int head_dim() const { return d_model / heads; }
  int d_ff() const { return ffn_mult * d_model; }
  // Width of the block-stack input x: d_model, or vocab when the head is tied to the input projection.
  int input_width() const { return tie == Tie::head ? vocab : d_model; }
  // The layer whose parameters block `layer` uses.
  int param_layer(int layer) const { return tie == Tie::blocks ? 0 : layer; }
  bool operator==(const ModelConfig& o) const;
  bool operator!=(const ModelConfig& o) const { return !(*this == o); }
};

inline constexpr double kNormEps = 1e-5;

// The side-effecting modules. Applied in this order to a block's output y:
//   bn:     BatchNorm over the features in training mode (batch statistics over the B*T rows), with
//           running mean/var (momentum kBatchNormMomentum, unbiased variance) and a batch counter;
//   noise:  y + kNoiseScale * eps, eps ~ N(0,1) drawn from the device's default generator;
//   cache:  y * (1 + kCacheStep * k), k = how often this layer ran a forward earlier in the step (its
//           behaviour depends on state it updated earlier in the same step);
//   counter, log: count forwards / append a line per forward to a file (no effect on values);
//   external: a counter and a log line that do not know about checkpoints (must never be checkpointed).
enum Effect : unsigned { kCounter = 1, kLog = 2, kBatchNorm = 4, kNoise = 8, kCache = 16, kExternal = 32 };
inline constexpr double kBatchNormMomentum = 0.1;
inline constexpr double kNoiseScale = 0.01;
inline constexpr double kCacheStep = 0.01;

// Keys visible to batch element b of a sequence of length T under key padding (at least one).
inline int key_length(int b, int T) {
  return T - b > 1 ? T - b : 1;
}

// The one spelling of each enum (Case lines, JSON, messages); the Case's field table reads these rows.
template <class E, size_t N>
using EnumNames = std::array<std::pair<E, std::string_view>, N>;
inline constexpr EnumNames<NormKind, 2> kNormNames{{{NormKind::layer, "layernorm"}, {NormKind::rms, "rmsnorm"}}};
inline constexpr EnumNames<NormPlacement, 2> kPlacementNames{
    {{NormPlacement::pre, "pre"}, {NormPlacement::post, "post"}}};
inline constexpr EnumNames<Activation, 4> kActivationNames{{{Activation::relu, "relu"},
                                                            {Activation::gelu_tanh, "gelu_tanh"},
                                                            {Activation::gelu_erf, "gelu_erf"},
                                                            {Activation::swiglu, "swiglu"}}};
inline constexpr EnumNames<LossKind, 2> kLossNames{{{LossKind::cross_entropy, "ce"}, {LossKind::mse, "mse"}}};
inline constexpr EnumNames<Tie, 3> kTieNames{{{Tie::none, "none"}, {Tie::blocks, "blocks"}, {Tie::head, "head"}}};
inline constexpr EnumNames<SegOut, 3> kSegOutNames{
    {{SegOut::plain, "plain"}, {SegOut::alias, "alias"}, {SegOut::view, "view"}}};
inline constexpr EnumNames<RandOp, 2> kRandOpNames{{{RandOp::none, "none"}, {RandOp::jitter, "jitter"}}};

// Enum names: the only spelling used in Case lines, JSON and error messages.
std::string_view to_string(NormKind v);
std::string_view to_string(NormPlacement v);
std::string_view to_string(Activation v);
std::string_view to_string(LossKind v);
std::string_view to_string(Tie v);
std::string_view to_string(DropoutSite v);

// Parsing returns false on an unknown name; `allowed` lists the valid names ("a|b|c").
bool parse_enum(std::string_view s, NormKind& out);
bool parse_enum(std::string_view s, NormPlacement& out);
bool parse_enum(std::string_view s, Activation& out);
bool parse_enum(std::string_view s, LossKind& out);
bool parse_enum(std::string_view s, Tie& out);
bool parse_enum(std::string_view s, DropoutSite& out);
template <class E>
std::string allowed_names();

}  // namespace ckv
