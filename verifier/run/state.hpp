// verifier/run/state.hpp: the training state a resume needs, and its file format.
//
// What a run must carry across a save and a load to continue bitwise as if never interrupted:
// parameters; optimizer state (Adam's moments and per-parameter step counts); the state of every
// generator (CPU and each CUDA device) as it is at the save; side-effect state (BatchNorm running
// statistics, counters, the log, the cache's per-step counts); the position in micro-batches, with the
// gradients accumulated so far in the step and the hook calls counted so far.
//
// File format (version 1): the line "ckverify-state", a one-line JSON header (format version, the Case
// key the state belongs to, the position, and the name, type and length of every array in payload
// order), the payload (little-endian float64, int64 and raw bytes), and the FNV-1a 64-bit checksum of
// everything before it as 8 bytes. A file that is truncated, corrupted, of another format version, or
// saved from another model or data is refused with a StateError naming what is wrong, before anything
// is loaded.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/params.hpp"
#include "verifier/case/case.hpp"
#include "verifier/impls/state_fault.hpp"

namespace ckv {

inline constexpr int kStateFormatVersion = 1;

class StateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainingState {
  std::string case_key;  // state_key(Case) of the run that saved it
  int position = 0;      // micro-batches completed
  ParamSet params;
  ParamSet grads;                                       // accumulated in the current step (empty at a step boundary)
  std::vector<int64_t> grad_defined;                    // per parameter, 0/1
  std::vector<int64_t> hook_calls;                      // per parameter, in the current step
  ParamSet adam_m, adam_v;                              // empty for SGD or when not saved
  std::vector<int64_t> adam_steps;                      // per parameter
  ParamSet batchnorm;                                   // running mean, var, num_batches_tracked per BatchNorm
  std::vector<int64_t> counter, external, cache_calls;  // per layer
  std::string log;
  std::vector<std::vector<uint8_t>> rng;  // empty when not saved
  // tp > 1: the model-parallel RNG tracker's streams (name, generator state), this rank's; empty when
  // not saved.
  std::vector<std::pair<std::string, std::vector<uint8_t>>> streams;
};

// What a state belongs to: the Case without what may change across a resume (steps, the save
// position, the plan, the implementation, the device).
std::string state_key(const Case& c);

// Reads and verifies a state file for Case `c`; throws StateError with one line naming the problem.
// A file larger than any state of `c` can be (state_bytes_bound) is refused before it is read.
TrainingState load_state_file(const std::string& path, const Case& c);
// The most bytes a state file of Case `c` can take: float64 parameters, gradients and both Adam
// moments (with biases and norms well inside an 8x margin), BatchNorm statistics, generator states,
// the side-effect ledger and the header in a fixed allowance.
size_t state_bytes_bound(const Case& c);

// FNV-1a 64-bit hash (the file's checksum, and TrainingRun::digest).
uint64_t fnv1a(const char* p, size_t n);

// The file's bytes (written by the CLI's atomic writer), and their verified decoding.
std::string encode_state(const TrainingState& s);
TrainingState decode_state(const std::string& bytes, const Case& c);

}  // namespace ckv
