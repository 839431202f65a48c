// reference/transformer.cpp: per-layer forward/backward pairs of the fp64 reference (llm.c style).
// Activations are (N, C) row-major matrices with N = B*T rows. Forward stores in a cache struct what
// backward needs; backward accumulates parameter gradients with +=. Model backward walks the layers
// in reverse.
#include "reference/transformer.hpp"

#include <Eigen/Dense>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace ckv {
namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowVec = Eigen::RowVectorXd;
using Vec = Eigen::VectorXd;
using CMatMap = Eigen::Map<const Mat>;
using MatMap = Eigen::Map<Mat>;

struct Ctx {
  const ModelConfig& c;
  const ParamSet& p;
  ParamSet* g;  // null in forward-only runs
  int B, T;
  const DropoutMasks& dm;
  const ReferenceFaults& f;
};

CMatMap weight(const ParamSet& p, const std::string& name) {
  const auto& a = p.at(name);
  return CMatMap(a.data.data(), a.shape[0], a.shape.size() > 1 ? a.shape[1] : 1);
}
Eigen::Map<const RowVec> vec(const ParamSet& p, const std::string& name) {
  const auto& a = p.at(name);
  return Eigen::Map<const RowVec>(a.data.data(), a.numel());
}
Eigen::Map<RowVec> gvec(ParamSet& g, const std::string& name) {
  auto& a = g.at(name);
  return Eigen::Map<RowVec>(a.data.data(), a.numel());
}

// ---- linear: out (N,OC) = inp (N,C) * W^T (W is (OC,C)) + b (OC) ----
Mat linear_forward(const Mat& inp, const Ctx& x, const std::string& pre) {
  Mat out = inp * weight(x.p, pre + ".weight").transpose();
  out.rowwise() += vec(x.p, pre + ".bias");
  return out;
}
// dinp (N,C) += dout (N,OC) * W; dW (OC,C) += dout^T inp; db += column sums of dout.
void linear_backward(Mat& dinp, const Mat& dout, const Mat& inp, const Ctx& x, const std::string& pre,
                     bool transposed_fault = false) {
  dinp += dout * weight(x.p, pre + ".weight");
  auto& gw = x.g->at(pre + ".weight");
  MatMap dw(gw.data.data(), gw.shape[0], gw.shape[1]);
  Mat d = dout.transpose() * inp;
  if (transposed_fault) d.transposeInPlace();
  dw += d;
  gvec(*x.g, pre + ".bias") += dout.colwise().sum();
}

// ---- norm: LayerNorm (x-mean)*rstd*w+b or RMSNorm x*rstd*w, per row ----
struct NormCache {
  Mat xhat;  // (N,C) normalised input
  Vec rstd;  // (N)
};
Mat norm_forward(NormCache& nc, const Mat& in, const Ctx& x, const std::string& pre) {
  const Eigen::Index n = in.rows(), c = in.cols();
  nc.xhat.resize(n, c);
  nc.rstd.resize(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const double mean = x.c.norm == NormKind::layer ? in.row(i).mean() : 0.0;
    const RowVec centred = in.row(i).array() - mean;
    const double var = centred.squaredNorm() / static_cast<double>(c);
    nc.rstd(i) = 1.0 / std::sqrt(var + kNormEps);
    nc.xhat.row(i) = centred * nc.rstd(i);
  }
  Mat out = nc.xhat.array().rowwise() * vec(x.p, pre + ".weight").array();
  if (x.c.norm == NormKind::layer) out.rowwise() += vec(x.p, pre + ".bias");
  return out;
}
void norm_backward(Mat& din, const Mat& dout, const NormCache& nc, const Ctx& x, const std::string& pre) {
  const auto w = vec(x.p, pre + ".weight");
  gvec(*x.g, pre + ".weight") += (dout.array() * nc.xhat.array()).colwise().sum().matrix();
  if (x.c.norm == NormKind::layer) gvec(*x.g, pre + ".bias") += dout.colwise().sum();
  const Mat dxhat = dout.array().rowwise() * w.array();
  for (Eigen::Index i = 0; i < dout.rows(); ++i) {
    const double mean_dxhat_xhat = dxhat.row(i).dot(nc.xhat.row(i)) / static_cast<double>(dout.cols());
    RowVec d = dxhat.row(i) - nc.xhat.row(i) * mean_dxhat_xhat;
    if (x.c.norm == NormKind::layer) d.array() -= dxhat.row(i).mean();
    din.row(i) += d * nc.rstd(i);
  }
}

// ---- dropout with a caller-given mask: out = in * mask / (1-p) ----
double dropout_scale(const Ctx& x, DropoutSite s, bool missing_scale) {
  return missing_scale ? 1.0 : 1.0 / (1.0 - x.dm.p[static_cast<int>(s)]);
}
const std::vector<double>* site_mask(const Ctx& x, int layer, DropoutSite s) {
  if (x.dm.masks.empty()) return nullptr;
  const auto& m = x.dm.masks.at(static_cast<size_t>(layer))[static_cast<size_t>(s)];
  return m.empty() ? nullptr : &m;
}
// Applies the site's mask to `m`, whose row-major data starts at flat offset `offset` of the mask.
void dropout_apply(Mat& m, const Ctx& x, int layer, DropoutSite s, bool backward, size_t offset = 0) {
  const auto* mask = site_mask(x, layer, s);
  if (!mask) return;
  const double scale =
      dropout_scale(x, s, backward ? x.f.missing_dropout_scale_backward : x.f.missing_dropout_scale_forward);
  if (offset + static_cast<size_t>(m.size()) > mask->size())
    throw std::invalid_argument("dropout mask at layer " + std::to_string(layer) + " site " +
                                std::string(to_string(s)) + " is smaller than its activation");
  Eigen::Map<const Mat> mk(mask->data() + offset, m.rows(), m.cols());
  m.array() *= mk.array() * scale;
}

// ---- attention ----
struct AttnCache {
  Mat in, q, k, v;           // (N,D)
  std::vector<Mat> probs;    // B*H matrices (T,T), softmax output before dropout
  std::vector<Mat> probs_d;  // after dropout
  Mat ctx;                   // (N,D) heads concatenated, before wo
};
Mat attn_forward(AttnCache& ac, const Mat& in, const Ctx& x, int layer) {
  const std::string L = "layer" + std::to_string(layer) + ".attn.";
  const int H = x.c.heads, hs = x.c.head_dim(), T = x.T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  ac.in = in;
  ac.q = linear_forward(in, x, L + "wq");
  ac.k = linear_forward(in, x, L + "wk");
  ac.v = linear_forward(in, x, L + "wv");
  ac.ctx = Mat::Zero(in.rows(), in.cols());
  ac.probs.assign(static_cast<size_t>(x.B * H), Mat());
  ac.probs_d.assign(static_cast<size_t>(x.B * H), Mat());
  const int visible_after = x.f.causal_mask_off_by_one ? 1 : 0;  // t sees j <= t + visible_after
  for (int b = 0; b < x.B; ++b)
    for (int h = 0; h < H; ++h) {
      const size_t bh = static_cast<size_t>(b * H + h);
      const auto Q = ac.q.block(b * T, h * hs, T, hs);
      const auto K = ac.k.block(b * T, h * hs, T, hs);
      const auto V = ac.v.block(b * T, h * hs, T, hs);
      Mat S = (Q * K.transpose()) * scale;
      Mat P = Mat::Zero(T, T);
      for (int t = 0; t < T; ++t) {
        const int last = x.c.causal ? std::min(T - 1, t + visible_after) : T - 1;
        const double mx = S.row(t).head(last + 1).maxCoeff();
        double sum = 0.0;
        for (int j = 0; j <= last; ++j) sum += (P(t, j) = std::exp(S(t, j) - mx));
        P.row(t).head(last + 1) /= sum;
      }
      ac.probs[bh] = P;
      dropout_apply(P, x, layer, DropoutSite::attn_probs, false, bh * static_cast<size_t>(T * T));
      ac.ctx.block(b * T, h * hs, T, hs) = P * V;
      ac.probs_d[bh] = std::move(P);
    }
  return linear_forward(ac.ctx, x, L + "wo");
}
void attn_backward(Mat& din, const Mat& dout, const AttnCache& ac, const Ctx& x, int layer) {
  const std::string L = "layer" + std::to_string(layer) + ".attn.";
  const int H = x.c.heads, hs = x.c.head_dim(), T = x.T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const bool tf = x.f.transposed_attn_weight_grad;
  Mat dctx = Mat::Zero(ac.ctx.rows(), ac.ctx.cols());
  linear_backward(dctx, dout, ac.ctx, x, L + "wo", tf);
  Mat dq = Mat::Zero(ac.q.rows(), ac.q.cols()), dk = dq, dv = dq;
  for (int b = 0; b < x.B; ++b)
    for (int h = 0; h < H; ++h) {
      const size_t bh = static_cast<size_t>(b * H + h);
      const auto Q = ac.q.block(b * T, h * hs, T, hs);
      const auto K = ac.k.block(b * T, h * hs, T, hs);
      const auto V = ac.v.block(b * T, h * hs, T, hs);
      const Mat dC = dctx.block(b * T, h * hs, T, hs);
      dv.block(b * T, h * hs, T, hs) += ac.probs_d[bh].transpose() * dC;
      Mat dP = dC * V.transpose();
      dropout_apply(dP, x, layer, DropoutSite::attn_probs, true, bh * static_cast<size_t>(T * T));
      const Mat& P = ac.probs[bh];
      Mat dS(T, T);
      if (x.f.wrong_softmax_backward) {
        dS = P.array() * dP.array();
      } else {
        const Vec rowdot = (P.array() * dP.array()).rowwise().sum();
        dS = P.array() * (dP.array().colwise() - rowdot.array());
      }
      dS *= scale;
      dq.block(b * T, h * hs, T, hs) += dS * K;
      dk.block(b * T, h * hs, T, hs) += dS.transpose() * Q;
    }
  linear_backward(din, dq, ac.in, x, L + "wq", tf);
  linear_backward(din, dk, ac.in, x, L + "wk", tf);
  linear_backward(din, dv, ac.in, x, L + "wv", tf);
}

// ---- FFN ----
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2*pi)
double sigmoid(double z) {
  return 1.0 / (1.0 + std::exp(-z));
}
double act_forward(Activation a, double z) {
  switch (a) {
    case Activation::relu:
      return z > 0.0 ? z : 0.0;
    case Activation::gelu_tanh:
      return 0.5 * z * (1.0 + std::tanh(kSqrt2OverPi * (z + 0.044715 * z * z * z)));
    case Activation::gelu_erf:
      return 0.5 * z * (1.0 + std::erf(z * kInvSqrt2));
    case Activation::swiglu:
      return z * sigmoid(z);  // silu, applied to the gate branch
  }
  return 0.0;
}
double act_derivative(Activation a, double z) {
  switch (a) {
    case Activation::relu:
      return z > 0.0 ? 1.0 : 0.0;
    case Activation::gelu_tanh: {
      const double u = kSqrt2OverPi * (z + 0.044715 * z * z * z);
      const double th = std::tanh(u);
      return 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * z * z);
    }
    case Activation::gelu_erf:
      return 0.5 * (1.0 + std::erf(z * kInvSqrt2)) + z * std::exp(-0.5 * z * z) * kInvSqrt2Pi;
    case Activation::swiglu: {
      const double s = sigmoid(z);
      return s * (1.0 + z * (1.0 - s));
    }
  }
  return 0.0;
}
struct FfnCache {
  Mat in;   // (N,D)
  Mat z1;   // (N,Dff) fc1 output
  Mat zg;   // (N,Dff) gate output (SwiGLU only)
  Mat a_d;  // (N,Dff) hidden after activation and dropout: the input of fc2
};
Mat ffn_forward(FfnCache& fc, const Mat& in, const Ctx& x, int layer) {
  const std::string L = "layer" + std::to_string(layer) + ".ffn.";
  const Activation act = x.c.activation;
  fc.in = in;
  fc.z1 = linear_forward(in, x, L + "fc1");
  Mat a;
  if (act == Activation::swiglu) {
    fc.zg = linear_forward(in, x, L + "gate");
    a = fc.zg.unaryExpr([](double z) { return act_forward(Activation::swiglu, z); }).cwiseProduct(fc.z1);
  } else {
    a = fc.z1.unaryExpr([act](double z) { return act_forward(act, z); });
  }
  dropout_apply(a, x, layer, DropoutSite::ffn_hidden, false);
  fc.a_d = std::move(a);
  return linear_forward(fc.a_d, x, L + "fc2");
}
void ffn_backward(Mat& din, const Mat& dout, const FfnCache& fc, const Ctx& x, int layer) {
  const std::string L = "layer" + std::to_string(layer) + ".ffn.";
  const Activation act = x.c.activation;
  Mat da = Mat::Zero(fc.a_d.rows(), fc.a_d.cols());
  linear_backward(da, dout, fc.a_d, x, L + "fc2");
  dropout_apply(da, x, layer, DropoutSite::ffn_hidden, true);
  if (act == Activation::swiglu) {
    const Mat silu = fc.zg.unaryExpr([](double z) { return act_forward(Activation::swiglu, z); });
    const Mat dsilu = fc.zg.unaryExpr([](double z) { return act_derivative(Activation::swiglu, z); });
    const Mat dz1 = da.cwiseProduct(silu);
    const Mat dzg = da.cwiseProduct(fc.z1).cwiseProduct(dsilu);
    linear_backward(din, dz1, fc.in, x, L + "fc1");
    linear_backward(din, dzg, fc.in, x, L + "gate");
  } else {
    const Mat dz1 = da.cwiseProduct(fc.z1.unaryExpr([act](double z) { return act_derivative(act, z); }));
    linear_backward(din, dz1, fc.in, x, L + "fc1");
  }
}

// ---- sub-block: norm + sublayer + dropout + residual, pre- or post-LN ----
enum class Sub { attn, ffn };
struct SubCache {
  NormCache norm;
  AttnCache attn;
  FfnCache ffn;
};
std::string norm_name(int layer, Sub s) {
  return "layer" + std::to_string(layer) + (s == Sub::attn ? ".norm1" : ".norm2");
}
DropoutSite residual_site(Sub s) {
  return s == Sub::attn ? DropoutSite::attn_out : DropoutSite::ffn_out;
}

Mat sublayer_forward(SubCache& sc, Sub s, const Mat& in, const Ctx& x, int layer) {
  Mat out = s == Sub::attn ? attn_forward(sc.attn, in, x, layer) : ffn_forward(sc.ffn, in, x, layer);
  dropout_apply(out, x, layer, residual_site(s), false);
  return out;
}
void sublayer_backward(Mat& din, Mat dout, const SubCache& sc, Sub s, const Ctx& x, int layer) {
  dropout_apply(dout, x, layer, residual_site(s), true);
  if (s == Sub::attn)
    attn_backward(din, dout, sc.attn, x, layer);
  else
    ffn_backward(din, dout, sc.ffn, x, layer);
}
Mat sub_forward(SubCache& sc, Sub s, const Mat& u, const Ctx& x, int layer) {
  const std::string nn = norm_name(layer, s);
  if (x.c.placement == NormPlacement::pre)
    return u + sublayer_forward(sc, s, norm_forward(sc.norm, u, x, nn), x, layer);
  return norm_forward(sc.norm, u + sublayer_forward(sc, s, u, x, layer), x, nn);
}
// Returns du given dout.
Mat sub_backward(const Mat& dout, const SubCache& sc, Sub s, const Ctx& x, int layer) {
  const std::string nn = norm_name(layer, s);
  if (x.c.placement == NormPlacement::pre) {
    Mat dnorm_out = Mat::Zero(dout.rows(), dout.cols());
    sublayer_backward(dnorm_out, dout, sc, s, x, layer);
    Mat du = dout;  // residual path
    norm_backward(du, dnorm_out, sc.norm, x, nn);
    return du;
  }
  Mat dr = Mat::Zero(dout.rows(), dout.cols());
  norm_backward(dr, dout, sc.norm, x, nn);
  Mat du = dr;  // residual path
  sublayer_backward(du, dr, sc, s, x, layer);
  return du;
}

struct LayerCache {
  SubCache attn, ffn;
};

struct Forward {
  std::vector<LayerCache> layers;
  std::vector<Mat> layer_out;
  NormCache final_norm;
  Mat final_in, head_in, logits;
  double loss = 0.0;
  Mat dlogits;  // gradient of the loss w.r.t. logits
};

void check_inputs(const ModelConfig& c, const ParamSet& p, const CaseData& d, const DropoutMasks& dm) {
  if (c.heads <= 0 || c.d_model % c.heads != 0) throw std::invalid_argument("reference: heads must divide d_model");
  if (d.x.size() != static_cast<size_t>(d.batch) * static_cast<size_t>(d.seq) * static_cast<size_t>(c.d_model))
    throw std::invalid_argument("reference: x has the wrong size for (batch, seq, d_model)");
  if (!dm.masks.empty() && dm.masks.size() != static_cast<size_t>(c.layers))
    throw std::invalid_argument("reference: dropout masks must be given for every layer or none");
  for (const auto& a : param_layout(c).items)
    if (!p.contains(a.name) || p.at(a.name).data.size() != a.data.size())
      throw std::invalid_argument("reference: parameter " + a.name + " is missing or has the wrong size");
}

Forward run_forward(const Ctx& x, const CaseData& d) {
  const ModelConfig& c = x.c;
  const Eigen::Index N = static_cast<Eigen::Index>(x.B) * x.T;
  Forward f;
  f.layers.resize(static_cast<size_t>(c.layers));
  Mat h = CMatMap(d.x.data(), N, c.d_model);
  for (int l = 0; l < c.layers; ++l) {
    auto& lc = f.layers[static_cast<size_t>(l)];
    if (c.attention) h = sub_forward(lc.attn, Sub::attn, h, x, l);
    h = sub_forward(lc.ffn, Sub::ffn, h, x, l);
    f.layer_out.push_back(h);
  }
  f.final_in = h;
  f.head_in = norm_forward(f.final_norm, h, x, "norm_f");
  f.logits = linear_forward(f.head_in, x, "head");
  const Eigen::Index V = c.vocab;
  f.dlogits.resize(N, V);
  if (c.loss == LossKind::cross_entropy) {
    double total = 0.0;
    for (Eigen::Index i = 0; i < N; ++i) {
      const double mx = f.logits.row(i).maxCoeff();
      const RowVec e = (f.logits.row(i).array() - mx).exp();
      const double sum = e.sum();
      const auto t = static_cast<Eigen::Index>(d.targets[static_cast<size_t>(i)]);
      total += std::log(sum) + mx - f.logits(i, t);
      f.dlogits.row(i) = e / sum;
      f.dlogits(i, t) -= 1.0;
    }
    f.loss = total / static_cast<double>(N);
    f.dlogits /= static_cast<double>(N);
  } else {
    const Mat diff = f.logits - CMatMap(d.y.data(), N, V);
    f.loss = diff.squaredNorm() / static_cast<double>(N * V);
    f.dlogits = diff * (2.0 / static_cast<double>(N * V));
  }
  return f;
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
                      const ReferenceFaults& faults) {
  check_inputs(cfg, params, data, masks);
  const Ctx x{cfg, params, nullptr, data.batch, data.seq, masks, faults};
  return run_forward(x, data).loss;
}

ReferenceResult reference_forward_backward(const ModelConfig& cfg, const ParamSet& params, const CaseData& data,
                                           const DropoutMasks& masks, const ReferenceFaults& faults) {
  check_inputs(cfg, params, data, masks);
  ReferenceResult r;
  r.grads = zeros_like(params);
  const Ctx x{cfg, params, &r.grads, data.batch, data.seq, masks, faults};
  const Forward f = run_forward(x, data);
  r.loss = f.loss;
  r.logits.assign(f.logits.data(), f.logits.data() + f.logits.size());
  for (const auto& lo : f.layer_out) r.layer_out.emplace_back(lo.data(), lo.data() + lo.size());

  Mat dhead_in = Mat::Zero(f.head_in.rows(), f.head_in.cols());
  linear_backward(dhead_in, f.dlogits, f.head_in, x, "head");
  Mat dh = Mat::Zero(f.final_in.rows(), f.final_in.cols());
  norm_backward(dh, dhead_in, f.final_norm, x, "norm_f");
  for (int l = cfg.layers - 1; l >= 0; --l) {
    const auto& lc = f.layers[static_cast<size_t>(l)];
    dh = sub_backward(dh, lc.ffn, Sub::ffn, x, l);
    if (cfg.attention) dh = sub_backward(dh, lc.attn, Sub::attn, x, l);
  }
  r.dx.assign(dh.data(), dh.data() + dh.size());
  return r;
}

}  // namespace ckv
