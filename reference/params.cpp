// reference/params.cpp: parameter layout and deterministic birth (see params.hpp).
#include "reference/params.hpp"

#include <cmath>
#include <stdexcept>

namespace ckv {

const NamedArray& ParamSet::at(const std::string& name) const {
  for (const auto& a : items)
    if (a.name == name) return a;
  throw std::out_of_range("no parameter named " + name);
}
NamedArray& ParamSet::at(const std::string& name) {
  return const_cast<NamedArray&>(static_cast<const ParamSet&>(*this).at(name));
}
bool ParamSet::contains(const std::string& name) const {
  for (const auto& a : items)
    if (a.name == name) return true;
  return false;
}

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double SplitMix64::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}
double SplitMix64::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = 0.0;
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double th = 2.0 * M_PI * u2;
  spare_ = r * std::sin(th);
  has_spare_ = true;
  return r * std::cos(th);
}
uint64_t stream_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the name, mixed with the case seed
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  SplitMix64 mix(seed ^ h);
  return mix.next();
}

namespace {
void add(ParamSet& p, std::string name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  p.items.push_back({std::move(name), std::move(shape), std::vector<double>(static_cast<size_t>(n), 0.0)});
}
void add_norm(ParamSet& p, const ModelConfig& c, const std::string& prefix) {
  add(p, prefix + ".weight", {c.d_model});
  if (c.norm == NormKind::layer) add(p, prefix + ".bias", {c.d_model});
}
void add_linear(ParamSet& p, const std::string& prefix, int64_t out, int64_t in) {
  add(p, prefix + ".weight", {out, in});
  add(p, prefix + ".bias", {out});
}
double to_float_precision(double v) {
  return static_cast<double>(static_cast<float>(v));
}
}  // namespace

ParamSet param_layout(const ModelConfig& c) {
  ParamSet p;
  for (int l = 0; l < (c.tie == Tie::blocks ? 1 : c.layers); ++l) {
    const std::string L = "layer" + std::to_string(l);
    if (c.attention) {
      add_norm(p, c, L + ".norm1");
      for (const char* w : {"wq", "wk", "wv", "wo"}) add_linear(p, L + ".attn." + w, c.d_model, c.d_model);
    }
    add_norm(p, c, L + ".norm2");
    add_linear(p, L + ".ffn.fc1", c.d_ff(), c.d_model);
    if (c.activation == Activation::swiglu) add_linear(p, L + ".ffn.gate", c.d_ff(), c.d_model);
    add_linear(p, L + ".ffn.fc2", c.d_model, c.d_ff());
    if (c.has(kBatchNorm)) {
      add(p, L + ".bn.weight", {c.d_model});
      add(p, L + ".bn.bias", {c.d_model});
    }
  }
  add_norm(p, c, "norm_f");
  add_linear(p, "head", c.vocab, c.d_model);
  return p;
}

std::vector<std::string> part_param_names(const ModelConfig& c, ModelPart part, int layer) {
  std::vector<std::string> out;
  const ParamSet layout = param_layout(c);
  auto with_prefix = [&](const std::vector<std::string>& prefixes) {
    for (const auto& a : layout.items)
      for (const auto& pre : prefixes)
        if (a.name.rfind(pre, 0) == 0) out.push_back(a.name);
  };
  const std::string L = "layer" + std::to_string(c.param_layer(layer)) + ".";
  switch (part) {
    case ModelPart::block_attn:
      if (c.attention) with_prefix({L + "norm1.", L + "attn."});
      break;
    case ModelPart::block_ffn:
      with_prefix({L + "norm2.", L + "ffn.", L + "bn."});
      break;
    case ModelPart::input_projection:
      if (c.tie == Tie::head) out.push_back("head.weight");
      break;
    case ModelPart::head:
      with_prefix({"norm_f.", "head."});
      break;
  }
  return out;
}

ParamSet make_params(const ModelConfig& c, uint64_t seed) {
  ParamSet p = param_layout(c);
  for (auto& a : p.items) {
    SplitMix64 rng(stream_seed(seed, a.name));
    const bool is_norm = a.name.find("norm") != std::string::npos || a.name.find(".bn.") != std::string::npos;
    const bool is_weight = a.name.size() > 7 && a.name.compare(a.name.size() - 7, 7, ".weight") == 0;
    for (auto& v : a.data) {
      double x;
      if (is_norm && is_weight)
        x = 1.0 + 0.1 * rng.normal();  // near 1, but not 1, so a dropped gain shows in gradients
      else if (is_norm)
        x = 0.1 * rng.normal();
      else if (is_weight)
        x = rng.normal() / std::sqrt(static_cast<double>(a.shape[1]));  // fan-in scaling
      else
        x = 0.05 * rng.normal();
      v = to_float_precision(x);
    }
  }
  return p;
}

ParamSet zeros_like(const ParamSet& src) {
  ParamSet p = src;
  for (auto& a : p.items) std::fill(a.data.begin(), a.data.end(), 0.0);
  return p;
}

CaseData make_case_data(const ModelConfig& c, int batch, int seq, uint64_t seed, int micro) {
  CaseData d;
  d.batch = batch;
  d.seq = seq;
  const size_t bt = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  // Micro-batch 0 keeps the stream names it always had, so single-batch Cases replay as before.
  const std::string m = micro == 0 ? "" : ".micro" + std::to_string(micro);
  SplitMix64 rx(stream_seed(seed, "input.x" + m));
  d.x.resize(bt * static_cast<size_t>(c.input_width()));
  for (auto& v : d.x) v = to_float_precision(rx.normal());
  SplitMix64 rt(stream_seed(seed, "input.targets" + m));
  d.targets.resize(bt);
  for (auto& t : d.targets) t = static_cast<int64_t>(rt.next() % static_cast<uint64_t>(c.vocab));
  SplitMix64 ry(stream_seed(seed, "input.y" + m));
  d.y.resize(bt * static_cast<size_t>(c.vocab));
  for (auto& v : d.y) v = to_float_precision(ry.normal());
  return d;
}

}  // namespace ckv
