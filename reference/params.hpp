// reference/params.hpp: named fp64 parameter arrays and the case data (input x, targets), born once
// from the case seed. Every value is rounded to the nearest float at birth, so the fp64 reference and
// the fp32 LibTorch model (verifier/model.hpp, which copies these arrays) hold *identical* parameters
// and inputs: any difference between them is arithmetic, never initialisation.
//
// Each array draws from its own stream, keyed by (seed, array name), so changing one size (for example
// while RapidCheck shrinks a Case) does not reshuffle unrelated arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/config.hpp"

namespace ckv {

struct NamedArray {
  std::string name;            // for example "layer1.attn.wq.weight"
  std::vector<int64_t> shape;  // torch layout: Linear weights are (out, in)
  std::vector<double> data;    // row-major
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  bool operator==(const NamedArray& o) const { return name == o.name && shape == o.shape && data == o.data; }
  bool operator!=(const NamedArray& o) const { return !(*this == o); }
};

// Ordered parameter list; the order is the model's registration order and never changes for a config.
class ParamSet {
 public:
  std::vector<NamedArray> items;
  const NamedArray& at(const std::string& name) const;
  NamedArray& at(const std::string& name);
  bool contains(const std::string& name) const;
  const double* ptr(const std::string& name) const { return at(name).data.data(); }
  double* ptr(const std::string& name) { return at(name).data.data(); }
};

// The parameter names and shapes of a config, in registration order (values zero). With tie=blocks
// only layer 0's block parameters exist; every block reads them.
ParamSet param_layout(const ModelConfig& cfg);
// The same names and shapes with no values (data empty): for code that only names or sizes them.
ParamSet param_shapes(const ModelConfig& cfg);
// The one place that says which parameters each part of the model reads (names as in the layout):
// the attention half of block `layer` (norm1, attn.*), its FFN half (norm2, ffn.*), the tied input
// projection (head.weight) and the head (norm_f, head).
enum class ModelPart { block_attn, block_ffn, input_projection, head };
std::vector<std::string> part_param_names(const ModelConfig& cfg, ModelPart part, int layer = 0);
// Parameters born from the seed (fp32-representable fp64 values).
ParamSet make_params(const ModelConfig& cfg, uint64_t seed);
ParamSet zeros_like(const ParamSet& p);

struct CaseData {
  int batch = 0, seq = 0;
  std::vector<double> x;         // (B,T,input_width) block-stack input, fp32-representable
  std::vector<int64_t> targets;  // (B,T) class ids in [0,vocab), used by cross-entropy
  std::vector<double> y;         // (B,T,V) regression targets, used by MSE
};
// The data of micro-batch `micro` (each micro-batch has its own inputs and targets).
CaseData make_case_data(const ModelConfig& cfg, int batch, int seq, uint64_t seed, int micro = 0);

// Deterministic generator used for every birth: splitmix64 with a Box-Muller normal. Spelled out
// here (not std::normal_distribution) because the standard leaves distributions implementation-
// defined, and a Case must replay bit-for-bit on every machine.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0,1) with 53 random bits
  double normal();

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};
uint64_t stream_seed(uint64_t seed, const std::string& name);

}  // namespace ckv
