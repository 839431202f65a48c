// reference/transformer.hpp: the independent CPU reference. A Transformer block stack, final norm,
// linear head and loss, with forward and hand-written backward per layer in llm.c style
// (transformer.cpp). It never draws randomness: the caller passes every dropout mask, so the
// reference replays exactly the function LibTorch computed in its first forward (DESIGN.md, "Dropout
// sites are instrumented"). It evaluates in fp64 (the oracle) or, with the same code, in fp32: the
// fp32 evaluation measures how much fp32 rounding alone moves *this* Case's gradients, which is what
// the grad-reference tolerance is built from (properties/tolerance.hpp).
//
// Input:  x (B,T,D), or with tie=head x (B,T,V) and h0 = x @ head.weight (the tied input projection).
// Block (pre-LN):  h = x + drop_ao(Attn(N1(x)));   y = h + drop_fo(FFN(N2(h)))
// Block (post-LN): h = N1(x + drop_ao(Attn(x)));   y = N2(h + drop_fo(FFN(h)))
// Attn: per head softmax(q k^T / sqrt(hs) [causal] [key padding]) with drop_ap on the probabilities,
//       then wo. Key padding: batch element b sees keys j < key_length(b, T) only.
// FFN:  fc2(drop_fh(act(fc1(u))))  or, for SwiGLU, fc2(drop_fh(silu(gate(u)) * fc1(u))).
// Dropout at rate p: out = in * mask * (1 / (1 - p)), mask in {0,1}.
// Effects: after each block's FFN half, the side-effecting modules of config.hpp that change values
//        (BatchNorm, noise with caller-given eps, the cache's scale).
// Loss:  head loss (cross-entropy or MSE, mean) + sum over blocks of aux_weight * mean(y^2), all times
//        loss_scale (1/M for M accumulated micro-batches).
#pragma once

#include <array>
#include <vector>

#include "reference/config.hpp"
#include "reference/params.hpp"

namespace ckv {

// Shape of each site's mask, row-major: attn_probs (B,H,T,T), attn_out (B,T,D), ffn_hidden (B,T,Dff),
// ffn_out (B,T,D).
std::vector<int64_t> dropout_site_shape(const ModelConfig& c, int batch, int seq, DropoutSite s);

// The discrete decisions of the forward being replayed: which elements each dropout site kept, and on
// which side of ReLU's kink each FFN pre-activation fell. ReLU's derivative jumps at 0, so where fp32 and
// fp64 put a pre-activation within rounding of 0 on different sides, the gradients differ by a whole
// term; replaying LibTorch's side (as the masks are replayed) keeps the comparison about arithmetic.
struct DropoutMasks {
  std::array<double, kNumDropoutSites> p{};  // rate per site
  // masks[layer][site]: 0/1 values in the site's shape; empty means identity (no dropout there).
  std::vector<std::array<std::vector<double>, kNumDropoutSites>> masks;
  // relu[layer]: (B,T,Dff) 1 where fc1's output was positive; empty: decided from the value itself.
  std::vector<std::vector<double>> relu;
  // noise[layer]: (B,T,D) the eps the noise module drew (Effect kNoise); empty: no noise there.
  std::vector<std::vector<double>> noise;
  // jitter[layer]: (B,T) the eps rand=jitter drew for the layer's FFN output; empty: no jitter there.
  std::vector<std::vector<double>> jitter;
  static DropoutMasks none(int layers);
};

// Planted errors. They exist only so the tests can prove that the finite-difference self-check and
// the reference-vs-LibTorch comparison catch them (reference/tests, verifier/tests).
struct ReferenceFaults {
  bool transposed_attn_weight_grad = false;     // backward: dW^T for the square attention weights
  bool missing_dropout_scale_backward = false;  // backward: mask without 1/(1-p)
  bool missing_dropout_scale_forward = false;   // forward: mask without 1/(1-p)
  bool wrong_softmax_backward = false;          // backward: dS = P * dP (drops the row-sum term)
  bool causal_mask_off_by_one = false;          // forward: position t also sees t+1
};

enum class RefScalar { fp64, fp32 };
struct ReferenceOptions {
  ReferenceFaults faults;
  RefScalar scalar = RefScalar::fp64;
  double loss_scale = 1.0;
  int earlier_forwards = 0;  // forwards each layer ran earlier in the step (the cache module's k)
};

struct ReferenceResult {
  double loss = 0.0;
  ParamSet grads;                              // same names and shapes as the parameters
  std::vector<double> dx;                      // (B,T,input_width) gradient of the loss w.r.t. x
  std::vector<double> logits;                  // (B,T,V)
  std::vector<std::vector<double>> layer_out;  // per layer, (B,T,D) block outputs
  // Per layer, with Effect kBatchNorm: the batch mean and unbiased variance BatchNorm saw (D each), from
  // which the caller models the running statistics.
  std::vector<std::vector<double>> bn_mean, bn_var;
};

// Forward only (for finite differences).
double reference_loss(const ModelConfig& cfg, const ParamSet& params, const CaseData& data, const DropoutMasks& masks,
                      const ReferenceOptions& options = {});
// Forward and backward.
ReferenceResult reference_forward_backward(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                                           const DropoutMasks& masks, const ReferenceOptions& options = {});

}  // namespace ckv
