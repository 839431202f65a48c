// verifier/checkpoint/rng.hpp: the state of every random generator a segment can draw from (the CPU
// generator and the default generator of each CUDA device, and any further generators named, such as
// the streams of a model-parallel RNG tracker), captured and reinstalled as one value.
// The checkpoint library uses it to replay a segment's random draws in the recompute, and ckverify's
// run stage uses it to observe whether an implementation left the random stream as it found it.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace ckv {

class RngState {
 public:
  // Every device, not only those of a segment's inputs: fn may move work to a device of its own
  // choosing (a CPU input, a CUDA dropout).
  // `extra`: generators besides the devices' defaults, captured and reinstalled with them.
  static RngState capture(const std::vector<at::Generator>& extra = {});
  // Reinstalls the captured states. `cuda` false reinstalls only the CPU generator.
  void restore(bool cuda = true) const;
  bool operator==(const RngState& o) const;
  bool operator!=(const RngState& o) const { return !(*this == o); }
  // The generators whose state differs from `o`'s, for example "cpu, cuda:1, the calls' generator 0
  // (SegmentCall::generators)" (empty when
  // equal; "generator k" is the k-th extra generator).
  std::string differences(const RngState& o) const;
  bool empty() const { return !cpu_.defined(); }
  // The raw generator states (CPU first, then CUDA device 0, 1, ...), as bytes, for a state file. The
  // extra generators are objects of the run, not of the machine: they are not included.
  std::vector<std::vector<uint8_t>> bytes() const;
  // Throws std::invalid_argument when the states do not fit this machine's generators.
  static RngState from_bytes(const std::vector<std::vector<uint8_t>>& b);

 private:
  torch::Tensor cpu_;
  std::vector<torch::Tensor> cuda_;  // index = device index
  std::vector<std::pair<at::Generator, torch::Tensor>> extra_;
};

}  // namespace ckv
