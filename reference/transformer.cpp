// reference/transformer.cpp: per-layer forward/backward pairs of the reference (llm.c style), written
// once for a scalar type S and instantiated for double (the oracle) and float (the conditioning probe).
// Activations are (N, C) row-major matrices with N = B*T rows. Forward stores in a cache struct what
// backward needs; backward accumulates parameter gradients with +=. Model backward walks the layers
// in reverse.
#include "reference/transformer.hpp"

#include <Eigen/Dense>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

namespace ckv {
namespace {

template <class S>
struct Types {
  using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
};

// The parameters (or their gradients) as matrices of S, by name. Vectors are (1, n) matrices.
template <class S>
struct Tensors {
  using Mat = typename Types<S>::Mat;
  std::map<std::string, Mat> m;
  static Tensors from(const ParamSet& p, bool zero) {
    Tensors t;
    for (const auto& a : p.items) {
      const Eigen::Index rows = a.shape.size() > 1 ? a.shape[0] : 1;
      const Eigen::Index cols = a.shape.size() > 1 ? a.shape[1] : a.shape[0];
      if (zero) {
        t.m.emplace(a.name, Mat::Zero(rows, cols));
        continue;
      }
      t.m.emplace(a.name, Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                              a.data.data(), rows, cols)
                              .template cast<S>());
    }
    return t;
  }
  const Mat& at(const std::string& name) const {
    const auto it = m.find(name);
    if (it == m.end()) throw std::invalid_argument("reference: no parameter named " + name);
    return it->second;
  }
  Mat& at(const std::string& name) { return const_cast<Mat&>(static_cast<const Tensors&>(*this).at(name)); }
};

template <class S>
struct Model {
  using Mat = typename Types<S>::Mat;
  using RowVec = typename Types<S>::RowVec;
  using Vec = typename Types<S>::Vec;

  const ModelConfig& c;
  Tensors<S> p;
  Tensors<S>* g;  // null in forward-only runs
  int B, T;
  const DropoutMasks& dm;
  const ReferenceFaults& f;
  int earlier_forwards;

  std::string block(int layer) const { return "layer" + std::to_string(c.param_layer(layer)) + "."; }

  // ---- linear: out (N,OC) = inp (N,C) * W^T (W is (OC,C)) + b (OC) ----
  Mat linear_forward(const Mat& inp, const std::string& pre) const {
    Mat out = inp * p.at(pre + ".weight").transpose();
    out.rowwise() += p.at(pre + ".bias").row(0);
    return out;
  }
  // dinp (N,C) += dout (N,OC) * W; dW (OC,C) += dout^T inp; db += column sums of dout.
  void linear_backward(Mat& dinp, const Mat& dout, const Mat& inp, const std::string& pre,
                       bool transposed_fault = false) {
    dinp += dout * p.at(pre + ".weight");
    Mat d = dout.transpose() * inp;
    if (transposed_fault) d.transposeInPlace();
    g->at(pre + ".weight") += d;
    g->at(pre + ".bias") += dout.colwise().sum();
  }

  // ---- norm: LayerNorm (x-mean)*rstd*w+b or RMSNorm x*rstd*w, per row ----
  struct NormCache {
    Mat xhat;  // (N,C) normalised input
    Vec rstd;  // (N)
  };
  Mat norm_forward(NormCache& nc, const Mat& in, const std::string& pre) const {
    const Eigen::Index n = in.rows(), cols = in.cols();
    nc.xhat.resize(n, cols);
    nc.rstd.resize(n);
    for (Eigen::Index i = 0; i < n; ++i) {
      const S mean = c.norm == NormKind::layer ? in.row(i).mean() : S(0);
      const RowVec centred = in.row(i).array() - mean;
      const S var = centred.squaredNorm() / static_cast<S>(cols);
      nc.rstd(i) = S(1) / std::sqrt(var + static_cast<S>(kNormEps));
      nc.xhat.row(i) = centred * nc.rstd(i);
    }
    Mat out = nc.xhat.array().rowwise() * p.at(pre + ".weight").row(0).array();
    if (c.norm == NormKind::layer) out.rowwise() += p.at(pre + ".bias").row(0);
    return out;
  }
  void norm_backward(Mat& din, const Mat& dout, const NormCache& nc, const std::string& pre) {
    const RowVec w = p.at(pre + ".weight").row(0);
    g->at(pre + ".weight") += (dout.array() * nc.xhat.array()).colwise().sum().matrix();
    if (c.norm == NormKind::layer) g->at(pre + ".bias") += dout.colwise().sum();
    const Mat dxhat = dout.array().rowwise() * w.array();
    for (Eigen::Index i = 0; i < dout.rows(); ++i) {
      const S mean_dxhat_xhat = dxhat.row(i).dot(nc.xhat.row(i)) / static_cast<S>(dout.cols());
      RowVec d = dxhat.row(i) - nc.xhat.row(i) * mean_dxhat_xhat;
      if (c.norm == NormKind::layer) d.array() -= dxhat.row(i).mean();
      din.row(i) += d * nc.rstd(i);
    }
  }

  // ---- BatchNorm over the rows (batch statistics), per feature: (x-mean)*rstd*w+b ----
  struct BnCache {
    Mat xhat;  // (N,C)
    RowVec rstd, mean, var_unbiased;
  };
  Mat bn_forward(BnCache& bc, const Mat& in, const std::string& pre) const {
    const Eigen::Index n = in.rows();
    bc.mean = in.colwise().mean();
    const Mat centred = in.rowwise() - bc.mean;
    const RowVec var = centred.colwise().squaredNorm() / static_cast<S>(n);
    bc.var_unbiased = n > 1 ? RowVec(centred.colwise().squaredNorm() / static_cast<S>(n - 1)) : var;
    bc.rstd = (var.array() + static_cast<S>(kNormEps)).rsqrt();
    bc.xhat = centred.array().rowwise() * bc.rstd.array();
    Mat out = bc.xhat.array().rowwise() * p.at(pre + ".weight").row(0).array();
    out.rowwise() += p.at(pre + ".bias").row(0);
    return out;
  }
  // Returns din given dout.
  Mat bn_backward(const Mat& dout, const BnCache& bc, const std::string& pre) {
    const S n = static_cast<S>(dout.rows());
    g->at(pre + ".weight") += (dout.array() * bc.xhat.array()).colwise().sum().matrix();
    g->at(pre + ".bias") += dout.colwise().sum();
    const Mat dxhat = dout.array().rowwise() * p.at(pre + ".weight").row(0).array();
    const RowVec sum_d = dxhat.colwise().sum();
    const RowVec sum_dx = (dxhat.array() * bc.xhat.array()).colwise().sum();
    Mat din = (dxhat * n).rowwise() - sum_d;
    din -= Mat(bc.xhat.array().rowwise() * sum_dx.array());
    return din.array().rowwise() * (bc.rstd.array() / n);
  }

  // ---- dropout with a caller-given mask: out = in * mask / (1-p) ----
  const std::vector<double>* site_mask(int layer, DropoutSite s) const {
    if (dm.masks.empty()) return nullptr;
    const auto& m = dm.masks.at(static_cast<size_t>(layer))[static_cast<size_t>(s)];
    return m.empty() ? nullptr : &m;
  }
  // Applies the site's mask to `m`, whose row-major data starts at flat offset `offset` of the mask.
  void dropout_apply(Mat& m, int layer, DropoutSite s, bool backward, size_t offset = 0) const {
    const auto* mask = site_mask(layer, s);
    if (!mask) return;
    const bool missing = backward ? f.missing_dropout_scale_backward : f.missing_dropout_scale_forward;
    const S scale = missing ? S(1) : static_cast<S>(1.0 / (1.0 - dm.p[static_cast<size_t>(s)]));
    if (offset + static_cast<size_t>(m.size()) > mask->size())
      throw std::invalid_argument("dropout mask at layer " + std::to_string(layer) + " site " +
                                  std::string(to_string(s)) + " is smaller than its activation");
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index j = 0; j < m.cols(); ++j)
        m(i, j) *= static_cast<S>((*mask)[offset + static_cast<size_t>(i * m.cols() + j)]) * scale;
  }

  // ---- attention ----
  struct AttnCache {
    Mat in, q, k, v;           // (N,D)
    std::vector<Mat> probs;    // B*H matrices (T,T), softmax output before dropout
    std::vector<Mat> probs_d;  // after dropout
    Mat ctx;                   // (N,D) heads concatenated, before wo
  };
  // Keys j visible to query t of batch element b.
  int last_key(int b, int t) const {
    const int visible_after = f.causal_mask_off_by_one ? 1 : 0;  // t sees j <= t + visible_after
    int last = c.causal ? std::min(T - 1, t + visible_after) : T - 1;
    if (c.key_padding) last = std::min(last, key_length(b, T) - 1);
    return last;
  }
  Mat attn_forward(AttnCache& ac, const Mat& in, int layer) const {
    const std::string L = block(layer) + "attn.";
    const int H = c.heads, hs = c.head_dim();
    const S scale = S(1) / std::sqrt(static_cast<S>(hs));
    ac.in = in;
    ac.q = linear_forward(in, L + "wq");
    ac.k = linear_forward(in, L + "wk");
    ac.v = linear_forward(in, L + "wv");
    ac.ctx = Mat::Zero(in.rows(), in.cols());
    ac.probs.assign(static_cast<size_t>(B * H), Mat());
    ac.probs_d.assign(static_cast<size_t>(B * H), Mat());
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const size_t bh = static_cast<size_t>(b * H + h);
        const auto Q = ac.q.block(b * T, h * hs, T, hs);
        const auto K = ac.k.block(b * T, h * hs, T, hs);
        const auto V = ac.v.block(b * T, h * hs, T, hs);
        Mat Sc = (Q * K.transpose()) * scale;
        Mat P = Mat::Zero(T, T);
        for (int t = 0; t < T; ++t) {
          const int last = last_key(b, t);
          const S mx = Sc.row(t).head(last + 1).maxCoeff();
          S sum = 0;
          for (int j = 0; j <= last; ++j) sum += (P(t, j) = std::exp(Sc(t, j) - mx));
          P.row(t).head(last + 1) /= sum;
        }
        ac.probs[bh] = P;
        dropout_apply(P, layer, DropoutSite::attn_probs, false, bh * static_cast<size_t>(T * T));
        ac.ctx.block(b * T, h * hs, T, hs) = P * V;
        ac.probs_d[bh] = std::move(P);
      }
    return linear_forward(ac.ctx, L + "wo");
  }
  void attn_backward(Mat& din, const Mat& dout, const AttnCache& ac, int layer) {
    const std::string L = block(layer) + "attn.";
    const int H = c.heads, hs = c.head_dim();
    const S scale = S(1) / std::sqrt(static_cast<S>(hs));
    const bool tf = f.transposed_attn_weight_grad;
    Mat dctx = Mat::Zero(ac.ctx.rows(), ac.ctx.cols());
    linear_backward(dctx, dout, ac.ctx, L + "wo", tf);
    Mat dq = Mat::Zero(ac.q.rows(), ac.q.cols()), dk = dq, dv = dq;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const size_t bh = static_cast<size_t>(b * H + h);
        const auto Q = ac.q.block(b * T, h * hs, T, hs);
        const auto K = ac.k.block(b * T, h * hs, T, hs);
        const auto V = ac.v.block(b * T, h * hs, T, hs);
        const Mat dC = dctx.block(b * T, h * hs, T, hs);
        dv.block(b * T, h * hs, T, hs) += ac.probs_d[bh].transpose() * dC;
        Mat dP = dC * V.transpose();
        dropout_apply(dP, layer, DropoutSite::attn_probs, true, bh * static_cast<size_t>(T * T));
        const Mat& P = ac.probs[bh];
        Mat dS(T, T);
        if (f.wrong_softmax_backward) {
          dS = P.array() * dP.array();
        } else {
          const Vec rowdot = (P.array() * dP.array()).rowwise().sum();
          dS = P.array() * (dP.array().colwise() - rowdot.array());
        }
        dS *= scale;
        dq.block(b * T, h * hs, T, hs) += dS * K;
        dk.block(b * T, h * hs, T, hs) += dS.transpose() * Q;
      }
    linear_backward(din, dq, ac.in, L + "wq", tf);
    linear_backward(din, dk, ac.in, L + "wk", tf);
    linear_backward(din, dv, ac.in, L + "wv", tf);
  }

  // ---- FFN ----
  static S sigmoid(S z) { return S(1) / (S(1) + std::exp(-z)); }
  static S gelu_tanh_inner(S z) {  // tanh(sqrt(2/pi) (z + 0.044715 z^3))
    return std::tanh(static_cast<S>(0.79788456080286535588) * (z + static_cast<S>(0.044715) * z * z * z));
  }
  static S act_forward(Activation a, S z) {
    const S inv_sqrt2 = static_cast<S>(0.70710678118654752440);
    switch (a) {
      case Activation::relu:
        return z > S(0) ? z : S(0);
      case Activation::gelu_tanh:
        return S(0.5) * z * (S(1) + gelu_tanh_inner(z));
      case Activation::gelu_erf:
        return S(0.5) * z * (S(1) + std::erf(z * inv_sqrt2));
      case Activation::swiglu:
        return z * sigmoid(z);  // silu, applied to the gate branch
    }
    return S(0);
  }
  // gelu_tanh's derivative at z from th = gelu_tanh_inner(z), which its forward has already taken.
  static S gelu_tanh_derivative(S z, S th) {
    const S k0 = static_cast<S>(0.79788456080286535588);
    const S c3 = static_cast<S>(0.044715);
    return S(0.5) * (S(1) + th) + S(0.5) * z * (S(1) - th * th) * k0 * (S(1) + S(3) * c3 * z * z);
  }
  static S act_derivative(Activation a, S z) {
    const S inv_sqrt2 = static_cast<S>(0.70710678118654752440);
    const S inv_sqrt2pi = static_cast<S>(0.39894228040143267794);  // 1/sqrt(2*pi)
    switch (a) {
      case Activation::relu:
        return z > S(0) ? S(1) : S(0);
      case Activation::gelu_tanh:
        return gelu_tanh_derivative(z, gelu_tanh_inner(z));
      case Activation::gelu_erf:
        return S(0.5) * (S(1) + std::erf(z * inv_sqrt2)) + z * std::exp(S(-0.5) * z * z) * inv_sqrt2pi;
      case Activation::swiglu: {
        const S s = sigmoid(z);
        return s * (S(1) + z * (S(1) - s));
      }
    }
    return S(0);
  }
  struct FfnCache {
    Mat in;   // (N,D)
    Mat z1;   // (N,Dff) fc1 output
    Mat zg;   // (N,Dff) gate output (SwiGLU only)
    Mat a_d;  // (N,Dff) hidden after activation and dropout: the input of fc2
    // Kept by forwards that backward follows (not ReLU): the activation's derivative at its input, and
    // under SwiGLU silu(zg); each made where the forward computes the values it is made from.
    Mat dact, silu;
  };
  // The replayed ReLU side of each FFN pre-activation of `layer`, or null.
  const std::vector<double>* relu_pattern(int layer) const {
    if (c.activation != Activation::relu || dm.relu.empty()) return nullptr;
    const auto& r = dm.relu.at(static_cast<size_t>(layer));
    return r.empty() ? nullptr : &r;
  }
  Mat relu_derivative(const Mat& z, int layer) const {
    const auto* pattern = relu_pattern(layer);
    if (!pattern) return z.unaryExpr([](S v) { return act_derivative(Activation::relu, v); });
    if (pattern->size() != static_cast<size_t>(z.size()))
      throw std::invalid_argument("relu pattern at layer " + std::to_string(layer) + " has the wrong size");
    Mat d(z.rows(), z.cols());
    for (Eigen::Index i = 0; i < z.size(); ++i) d.data()[i] = static_cast<S>((*pattern)[static_cast<size_t>(i)]);
    return d;
  }
  Mat ffn_forward(FfnCache& fc, const Mat& in, int layer) const {
    const std::string L = block(layer) + "ffn.";
    const Activation act = c.activation;
    fc.in = in;
    fc.z1 = linear_forward(in, L + "fc1");
    Mat a;
    if (act == Activation::relu) {
      a = fc.z1.cwiseProduct(relu_derivative(fc.z1, layer));
    } else if (act == Activation::swiglu) {
      fc.zg = linear_forward(in, L + "gate");
      Mat silu = fc.zg.unaryExpr([](S z) { return act_forward(Activation::swiglu, z); });
      a = silu.cwiseProduct(fc.z1);
      if (g) {
        fc.dact = fc.zg.unaryExpr([](S z) { return act_derivative(Activation::swiglu, z); });
        fc.silu = std::move(silu);
      }
    } else if (act == Activation::gelu_tanh && g) {
      a.resize(fc.z1.rows(), fc.z1.cols());
      fc.dact.resize(fc.z1.rows(), fc.z1.cols());
      for (Eigen::Index i = 0; i < fc.z1.size(); ++i) {
        const S z = fc.z1.data()[i], th = gelu_tanh_inner(z);
        a.data()[i] = S(0.5) * z * (S(1) + th);
        fc.dact.data()[i] = gelu_tanh_derivative(z, th);
      }
    } else {
      a = fc.z1.unaryExpr([act](S z) { return act_forward(act, z); });
      if (g) fc.dact = fc.z1.unaryExpr([act](S z) { return act_derivative(act, z); });
    }
    dropout_apply(a, layer, DropoutSite::ffn_hidden, false);
    fc.a_d = std::move(a);
    Mat y = linear_forward(fc.a_d, L + "fc2");
    jitter_apply(y, layer);
    return y;
  }
  // rand=jitter (config.hpp): each row (token) of the FFN output scaled by 1 + kJitterScale * eps, with the
  // eps the forward drew; its backward scales the incoming gradient the same way.
  void jitter_apply(Mat& m, int layer) const {
    if (c.rand != RandOp::jitter || dm.jitter.empty() || dm.jitter.at(static_cast<size_t>(layer)).empty()) return;
    const auto& eps = dm.jitter[static_cast<size_t>(layer)];
    if (eps.size() != static_cast<size_t>(m.rows()))
      throw std::invalid_argument("jitter at layer " + std::to_string(layer) + " has the wrong size");
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      m.row(i) *= S(1) + static_cast<S>(kJitterScale) * static_cast<S>(eps[static_cast<size_t>(i)]);
  }
  void ffn_backward(Mat& din, const Mat& dout_in, const FfnCache& fc, int layer) {
    const std::string L = block(layer) + "ffn.";
    const Activation act = c.activation;
    Mat dout = dout_in;
    jitter_apply(dout, layer);
    Mat da = Mat::Zero(fc.a_d.rows(), fc.a_d.cols());
    linear_backward(da, dout, fc.a_d, L + "fc2");
    dropout_apply(da, layer, DropoutSite::ffn_hidden, true);
    if (act == Activation::swiglu) {
      const Mat dz1 = da.cwiseProduct(fc.silu);
      const Mat dzg = da.cwiseProduct(fc.z1).cwiseProduct(fc.dact);
      linear_backward(din, dz1, fc.in, L + "fc1");
      linear_backward(din, dzg, fc.in, L + "gate");
    } else if (act == Activation::relu) {
      linear_backward(din, Mat(da.cwiseProduct(relu_derivative(fc.z1, layer))), fc.in, L + "fc1");
    } else {
      const Mat dz1 = da.cwiseProduct(fc.dact);
      linear_backward(din, dz1, fc.in, L + "fc1");
    }
  }

  // ---- sub-block: norm + sublayer + dropout + residual, pre- or post-LN ----
  enum class Sub { attn, ffn };
  struct SubCache {
    NormCache norm;
    AttnCache attn;
    FfnCache ffn;
  };
  std::string norm_name(int layer, Sub s) const { return block(layer) + (s == Sub::attn ? "norm1" : "norm2"); }
  static DropoutSite residual_site(Sub s) { return s == Sub::attn ? DropoutSite::attn_out : DropoutSite::ffn_out; }

  Mat sublayer_forward(SubCache& sc, Sub s, const Mat& in, int layer) const {
    Mat out = s == Sub::attn ? attn_forward(sc.attn, in, layer) : ffn_forward(sc.ffn, in, layer);
    dropout_apply(out, layer, residual_site(s), false);
    return out;
  }
  void sublayer_backward(Mat& din, Mat dout, const SubCache& sc, Sub s, int layer) {
    dropout_apply(dout, layer, residual_site(s), true);
    if (s == Sub::attn)
      attn_backward(din, dout, sc.attn, layer);
    else
      ffn_backward(din, dout, sc.ffn, layer);
  }
  Mat sub_forward(SubCache& sc, Sub s, const Mat& u, int layer) const {
    const std::string nn = norm_name(layer, s);
    if (c.placement == NormPlacement::pre) return u + sublayer_forward(sc, s, norm_forward(sc.norm, u, nn), layer);
    return norm_forward(sc.norm, u + sublayer_forward(sc, s, u, layer), nn);
  }
  // Returns du given dout.
  Mat sub_backward(const Mat& dout, const SubCache& sc, Sub s, int layer) {
    const std::string nn = norm_name(layer, s);
    if (c.placement == NormPlacement::pre) {
      Mat dnorm_out = Mat::Zero(dout.rows(), dout.cols());
      sublayer_backward(dnorm_out, dout, sc, s, layer);
      Mat du = dout;  // residual path
      norm_backward(du, dnorm_out, sc.norm, nn);
      return du;
    }
    Mat dr = Mat::Zero(dout.rows(), dout.cols());
    norm_backward(dr, dout, sc.norm, nn);
    Mat du = dr;  // residual path
    sublayer_backward(du, dr, sc, s, layer);
    return du;
  }

  struct LayerCache {
    SubCache attn, ffn;
    BnCache bn;
  };
  S cache_scale() const { return S(1) + static_cast<S>(kCacheStep) * static_cast<S>(earlier_forwards); }
  // The value-changing effects after a block's FFN half (config.hpp: BatchNorm, noise, cache).
  Mat effects_forward(LayerCache& lc, Mat y, int layer) const {
    if (c.has(kBatchNorm)) y = bn_forward(lc.bn, y, block(layer) + "bn");
    if (c.has(kNoise) && !dm.noise.empty() && !dm.noise.at(static_cast<size_t>(layer)).empty()) {
      const auto& eps = dm.noise[static_cast<size_t>(layer)];
      if (eps.size() != static_cast<size_t>(y.size()))
        throw std::invalid_argument("noise at layer " + std::to_string(layer) + " has the wrong size");
      for (Eigen::Index i = 0; i < y.size(); ++i)
        y.data()[i] += static_cast<S>(kNoiseScale) * static_cast<S>(eps[static_cast<size_t>(i)]);
    }
    if (c.has(kCache)) y *= cache_scale();
    return y;
  }
  Mat effects_backward(const LayerCache& lc, Mat dy, int layer) {
    if (c.has(kCache)) dy *= cache_scale();
    if (c.has(kBatchNorm)) dy = bn_backward(dy, lc.bn, block(layer) + "bn");
    return dy;
  }
  struct Forward {
    Mat x;  // (N, input_width)
    std::vector<LayerCache> layers;
    std::vector<Mat> layer_out;
    NormCache final_norm;
    Mat final_in, head_in, logits;
    S loss = 0;
    Mat dlogits;  // gradient of the loss w.r.t. logits
  };

  Forward run_forward(const CaseData& d, S loss_scale) const {
    const Eigen::Index N = static_cast<Eigen::Index>(B) * T;
    Forward fw;
    fw.layers.resize(static_cast<size_t>(c.layers));
    fw.x = Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(d.x.data(), N,
                                                                                                    c.input_width())
               .template cast<S>();
    // The tied input projection: h0 = x @ head.weight, head.weight being (V, D).
    Mat h = c.tie == Tie::head ? Mat(fw.x * p.at("head.weight")) : fw.x;
    S aux = 0;
    const S aux_coeff = static_cast<S>(c.aux_weight) / static_cast<S>(N * c.d_model);
    for (int l = 0; l < c.layers; ++l) {
      auto& lc = fw.layers[static_cast<size_t>(l)];
      if (c.attention) h = sub_forward(lc.attn, Sub::attn, h, l);
      h = effects_forward(lc, sub_forward(lc.ffn, Sub::ffn, h, l), l);
      if (c.aux_weight != 0.0) aux += aux_coeff * h.squaredNorm();
      fw.layer_out.push_back(h);
    }
    if (c.segout != SegOut::plain) h += static_cast<S>(kSkipScale) * fw.x;  // the carried skip (config.hpp)
    fw.final_in = h;
    fw.head_in = norm_forward(fw.final_norm, h, "norm_f");
    fw.logits = linear_forward(fw.head_in, "head");
    const Eigen::Index V = c.vocab;
    fw.dlogits.resize(N, V);
    if (c.loss == LossKind::cross_entropy) {
      S total = 0;
      for (Eigen::Index i = 0; i < N; ++i) {
        const S mx = fw.logits.row(i).maxCoeff();
        const RowVec e = (fw.logits.row(i).array() - mx).exp();
        const S sum = e.sum();
        const auto t = static_cast<Eigen::Index>(d.targets[static_cast<size_t>(i)]);
        total += std::log(sum) + mx - fw.logits(i, t);
        fw.dlogits.row(i) = e / sum;
        fw.dlogits(i, t) -= S(1);
      }
      fw.loss = total / static_cast<S>(N);
      fw.dlogits /= static_cast<S>(N);
    } else {
      const Mat y =
          Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(d.y.data(), N, V)
              .template cast<S>();
      const Mat diff = fw.logits - y;
      fw.loss = diff.squaredNorm() / static_cast<S>(N * V);
      fw.dlogits = diff * (S(2) / static_cast<S>(N * V));
    }
    fw.loss = (fw.loss + aux) * loss_scale;
    fw.dlogits *= loss_scale;
    return fw;
  }

  // Backward through everything; returns dL/dx.
  Mat run_backward(const Forward& fw, S loss_scale) {
    const Eigen::Index N = static_cast<Eigen::Index>(B) * T;
    Mat dhead_in = Mat::Zero(fw.head_in.rows(), fw.head_in.cols());
    linear_backward(dhead_in, fw.dlogits, fw.head_in, "head");
    Mat dh = Mat::Zero(fw.final_in.rows(), fw.final_in.cols());
    norm_backward(dh, dhead_in, fw.final_norm, "norm_f");
    const S aux_grad = S(2) * static_cast<S>(c.aux_weight) / static_cast<S>(N * c.d_model) * loss_scale;
    const Mat dskip = c.segout != SegOut::plain ? Mat(static_cast<S>(kSkipScale) * dh) : Mat();
    for (int l = c.layers - 1; l >= 0; --l) {
      const auto& lc = fw.layers[static_cast<size_t>(l)];
      if (c.aux_weight != 0.0) dh += aux_grad * fw.layer_out[static_cast<size_t>(l)];
      dh = sub_backward(effects_backward(lc, dh, l), lc.ffn, Sub::ffn, l);
      if (c.attention) dh = sub_backward(dh, lc.attn, Sub::attn, l);
    }
    if (c.segout != SegOut::plain) dh += dskip;  // the skip reaches x as it is (tie=head has none)
    if (c.tie != Tie::head) return dh;
    const Mat& W = p.at("head.weight");  // (V, D); h0 = x W
    g->at("head.weight") += fw.x.transpose() * dh;
    return dh * W.transpose();
  }
};

void check_inputs(const ModelConfig& c, const ParamSet& p, const CaseData& d, const DropoutMasks& dm) {
  if (c.heads <= 0 || c.d_model % c.heads != 0) throw std::invalid_argument("reference: heads must divide d_model");
  if (d.x.size() != static_cast<size_t>(d.batch) * static_cast<size_t>(d.seq) * static_cast<size_t>(c.input_width()))
    throw std::invalid_argument("reference: x has the wrong size for (batch, seq, input width)");
  if (c.segout != SegOut::plain && c.tie == Tie::head)
    throw std::invalid_argument("reference: a carried skip needs the stack input at d_model (not tie=head)");
  if (!dm.masks.empty() && dm.masks.size() != static_cast<size_t>(c.layers))
    throw std::invalid_argument("reference: dropout masks must be given for every layer or none");
  if (!dm.relu.empty() && dm.relu.size() != static_cast<size_t>(c.layers))
    throw std::invalid_argument("reference: relu patterns must be given for every layer or none");
  if (!dm.noise.empty() && dm.noise.size() != static_cast<size_t>(c.layers))
    throw std::invalid_argument("reference: noise must be given for every layer or none");
  if (!dm.jitter.empty() && dm.jitter.size() != static_cast<size_t>(c.layers))
    throw std::invalid_argument("reference: jitter must be given for every layer or none");
  for (const auto& a : param_shapes(c).items) {
    int64_t n = 1;
    for (int64_t s : a.shape) n *= s;
    if (!p.contains(a.name) || p.at(a.name).data.size() != static_cast<size_t>(n))
      throw std::invalid_argument("reference: parameter " + a.name + " is missing or has the wrong size");
  }
}

template <class S, class M>
std::vector<double> flat(const M& m) {
  std::vector<double> out(static_cast<size_t>(m.size()));
  for (Eigen::Index i = 0; i < m.size(); ++i) out[static_cast<size_t>(i)] = static_cast<double>(m.data()[i]);
  return out;
}

template <class S>
ReferenceResult forward_backward(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                                 const DropoutMasks& masks, const ReferenceOptions& o, bool with_backward) {
  check_inputs(cfg, params, data, masks);
  Tensors<S> grads = Tensors<S>::from(params, /*zero=*/true);
  Model<S> m{cfg,
             Tensors<S>::from(params, false),
             with_backward ? &grads : nullptr,
             data.batch,
             data.seq,
             masks,
             o.faults,
             o.earlier_forwards};
  const S scale = static_cast<S>(o.loss_scale);
  const auto fw = m.run_forward(data, scale);
  ReferenceResult r;
  r.loss = static_cast<double>(fw.loss);
  if (!with_backward) return r;
  r.logits = flat<S>(fw.logits);
  for (const auto& lo : fw.layer_out) r.layer_out.push_back(flat<S>(lo));
  if (cfg.has(kBatchNorm))
    for (const auto& lc : fw.layers) {
      r.bn_mean.push_back(flat<S>(lc.bn.mean));
      r.bn_var.push_back(flat<S>(lc.bn.var_unbiased));
    }
  r.dx = flat<S>(m.run_backward(fw, scale));
  for (const auto& a : params.items) r.grads.items.push_back({a.name, a.shape, flat<S>(grads.at(a.name))});
  return r;
}

ReferenceResult dispatch(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                         const DropoutMasks& masks, const ReferenceOptions& o, bool with_backward) {
  return o.scalar == RefScalar::fp32 ? forward_backward<float>(cfg, params, data, masks, o, with_backward)
                                     : forward_backward<double>(cfg, params, data, masks, o, with_backward);
}

}  // namespace

std::vector<int64_t> dropout_site_shape(const ModelConfig& c, int batch, int seq, DropoutSite s) {
  switch (s) {
    case DropoutSite::attn_probs:
      return {batch, c.heads, seq, seq};
    case DropoutSite::attn_out:
    case DropoutSite::ffn_out:
      return {batch, seq, c.d_model};
    case DropoutSite::ffn_hidden:
      return {batch, seq, c.d_ff()};
  }
  return {};
}

DropoutMasks DropoutMasks::none(int layers) {
  DropoutMasks m;
  m.masks.resize(static_cast<size_t>(layers));
  return m;
}

double reference_loss(const ModelConfig& cfg, const ParamSet& params, const CaseData& data, const DropoutMasks& masks,
                      const ReferenceOptions& options) {
  return dispatch(cfg, params, data, masks, options, false).loss;
}

ReferenceResult reference_forward_backward(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                                           const DropoutMasks& masks, const ReferenceOptions& options) {
  return dispatch(cfg, params, data, masks, options, true);
}

}  // namespace ckv
