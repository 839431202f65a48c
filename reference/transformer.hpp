// reference/transformer.hpp: the independent fp64 CPU reference. A Transformer block stack, final
// norm, linear head and loss, with forward and hand-written backward per layer in llm.c style
// (transformer.cpp). It never draws randomness: the caller passes every dropout mask, so the
// reference replays exactly the function LibTorch computed in its first forward (DESIGN.md, "Dropout
// sites are instrumented").
//
// Block (pre-LN):  h = x + drop_ao(Attn(N1(x)));   y = h + drop_fo(FFN(N2(h)))
// Block (post-LN): h = N1(x + drop_ao(Attn(x)));   y = N2(h + drop_fo(FFN(h)))
// Attn: per head softmax(q k^T / sqrt(hs) [causal]) with drop_ap on the probabilities, then wo.
// FFN:  fc2(drop_fh(act(fc1(u))))  or, for SwiGLU, fc2(drop_fh(silu(gate(u)) * fc1(u))).
// Dropout at rate p: out = in * mask * (1 / (1 - p)), mask in {0,1}.
#pragma once

#include <array>
#include <vector>

#include "reference/config.hpp"
#include "reference/params.hpp"

namespace ckv {

// Shape of each site's mask, row-major: attn_probs (B,H,T,T), attn_out (B,T,D), ffn_hidden (B,T,Dff),
// ffn_out (B,T,D).
std::vector<int64_t> dropout_site_shape(const ModelConfig& c, int batch, int seq, DropoutSite s);

struct DropoutMasks {
  std::array<double, kNumDropoutSites> p{};  // rate per site
  // masks[layer][site]: 0/1 values in the site's shape; empty means identity (no dropout there).
  std::vector<std::array<std::vector<double>, kNumDropoutSites>> masks;
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

struct ReferenceResult {
  double loss = 0.0;
  ParamSet grads;                              // same names and shapes as the parameters
  std::vector<double> dx;                      // (B,T,D) gradient of the loss w.r.t. x
  std::vector<double> logits;                  // (B,T,V)
  std::vector<std::vector<double>> layer_out;  // per layer, (B,T,D) block outputs
};

// Forward only (for finite differences).
double reference_loss(const ModelConfig& cfg, const ParamSet& params, const CaseData& data, const DropoutMasks& masks,
                      const ReferenceFaults& faults = {});
// Forward and backward.
ReferenceResult reference_forward_backward(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                                           const DropoutMasks& masks, const ReferenceFaults& faults = {});

}  // namespace ckv
