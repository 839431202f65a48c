// verifier/case.hpp: the Case, the one value that determines a run (DESIGN.md). It prints as one
// readable line and round-trips through JSON; everything ckverify does can be replayed from a Case
// file. Invalid cases are rejected with a CaseError whose message is one line naming the field and
// the allowed values. Torch-free, so tools and tests can use it without LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "reference/config.hpp"
#include "verifier/plan.hpp"

namespace ckv {

// How dropout draws its mask: an explicit bernoulli mask from the current generator (ckverify's own
// instrumented dropout), or LibTorch's native torch::dropout with the mask recovered from its output
// (see dropout_tap.hpp for the zero-input caveat).
enum class DropoutImpl { explicit_mask, native };
// fp32: everything in float32. bf16 / fp16: the forward runs under autocast to that dtype.
enum class Precision { fp32, bf16, fp16 };

std::string_view to_string(DropoutImpl v);
std::string_view to_string(Precision v);

class CaseError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Case {
  ModelConfig model;
  std::array<double, kNumDropoutSites> dropout{};  // rate per site, indexed by DropoutSite
  DropoutImpl dropout_impl = DropoutImpl::explicit_mask;
  uint64_t seed = 1;
  int batch = 2;
  int seq = 8;
  int steps = 1;
  double lr = 0.05;  // SGD learning rate of the multi-step runs
  Precision precision = Precision::fp32;
  std::string device = "cpu";  // "cpu", "cuda" or "cuda:N"
  Plan plan;
  std::string impl = "builtin";

  double p(DropoutSite s) const { return dropout[static_cast<size_t>(s)]; }
  bool operator==(const Case& o) const;
  bool operator!=(const Case& o) const { return !(*this == o); }
};

// Throws CaseError naming the first invalid field.
void validate(const Case& c);

// One readable line: "layers=2 d=16 heads=2 ffn=4 vocab=11 norm=layernorm pos=pre attn=causal ...".
std::string to_line(const Case& c);
// Parses the line form (any subset of keys, the rest default); throws CaseError.
Case case_from_line(const std::string& line);

std::string to_json(const Case& c);            // pretty-printed JSON
Case case_from_json(const std::string& text);  // throws CaseError (malformed JSON included)
Case load_case_file(const std::string& path);  // throws CaseError (unreadable file included)

}  // namespace ckv
