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
// Builds a layout: every parameter's name and shape, and its zero values where `values` (the names
// alone serve part_param_names, which the run stage and the properties call per unit).
struct LayoutBuilder {
  ParamSet p;
  bool values = true;
  void add(std::string name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    p.items.push_back(
        {std::move(name), std::move(shape), std::vector<double>(values ? static_cast<size_t>(n) : 0, 0.0)});
  }
  void add_norm(const ModelConfig& c, const std::string& prefix) {
    add(prefix + ".weight", {c.d_model});
    if (c.norm == NormKind::layer) add(prefix + ".bias", {c.d_model});
  }
  void add_linear(const std::string& prefix, int64_t out, int64_t in) {
    add(prefix + ".weight", {out, in});
    add(prefix + ".bias", {out});
  }
};
// The parameters one part of the model reads, in layout order: the one place that names them.
void add_part(LayoutBuilder& b, const ModelConfig& c, ModelPart part, int layer) {
  const std::string L = "layer" + std::to_string(c.param_layer(layer));
  switch (part) {
    case ModelPart::block_attn:
      if (!c.attention) return;
      b.add_norm(c, L + ".norm1");
      for (const char* w : {"wq", "wk", "wv", "wo"}) b.add_linear(L + ".attn." + w, c.d_model, c.d_model);
      return;
    case ModelPart::block_ffn:
      b.add_norm(c, L + ".norm2");
      b.add_linear(L + ".ffn.fc1", c.d_ff(), c.d_model);
      if (c.activation == Activation::swiglu) b.add_linear(L + ".ffn.gate", c.d_ff(), c.d_model);
      b.add_linear(L + ".ffn.fc2", c.d_model, c.d_ff());
      if (c.has(kBatchNorm)) {
        b.add(L + ".bn.weight", {c.d_model});
        b.add(L + ".bn.bias", {c.d_model});
      }
      return;
    case ModelPart::input_projection:  // the head's weight, read again as the input projection (tie=head)
      if (c.tie == Tie::head) b.add("head.weight", {c.vocab, c.d_model});
      return;
    case ModelPart::head:
      b.add_norm(c, "norm_f");
      b.add_linear("head", c.vocab, c.d_model);
      return;
  }
}
double to_float_precision(double v) {
  return static_cast<double>(static_cast<float>(v));
}
}  // namespace

namespace {
ParamSet layout(const ModelConfig& c, bool values) {
  LayoutBuilder b;
  b.values = values;
  for (int l = 0; l < (c.tie == Tie::blocks ? 1 : c.layers); ++l) {
    add_part(b, c, ModelPart::block_attn, l);
    add_part(b, c, ModelPart::block_ffn, l);
  }
  add_part(b, c, ModelPart::head, 0);
  return std::move(b.p);
}
}  // namespace

ParamSet param_layout(const ModelConfig& c) {
  return layout(c, true);
}
ParamSet param_shapes(const ModelConfig& c) {
  return layout(c, false);
}

std::vector<std::string> part_param_names(const ModelConfig& c, ModelPart part, int layer) {
  LayoutBuilder b;
  b.values = false;
  add_part(b, c, part, layer);
  std::vector<std::string> out;
  for (auto& a : b.p.items) out.push_back(std::move(a.name));
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
