// verifier/dist/rng_tracker.hpp: named random streams as model-parallel training keeps them (Megatron's
// RNG tracker). Dropout inside a tensor-parallel region draws from a stream seeded per tensor-parallel
// rank (each rank holds another shard of the activation); dropout in replicated regions draws from the
// default generator, seeded equally on every tensor-parallel rank. A stream is drawn from by forking it:
// while the fork lives, the default CPU generator runs the stream (its state swapped in), and the stream
// keeps what it advanced when the fork ends.
//
// A checkpoint must replay the streams as it replays the default generator: generators() are what it
// captures and restores (CheckpointOptions::generators for the builtin). One that restores only the
// default generator recomputes from the stream's advanced state: other masks than the forward drew.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ckv::dist {

class RngTracker {
 public:
  // A new stream; throws when `name` exists.
  void add(const std::string& name, uint64_t seed);

  class Fork {
   public:
    ~Fork();
    Fork(const Fork&) = delete;
    Fork& operator=(const Fork&) = delete;
    Fork(Fork&& o) noexcept;
    Fork& operator=(Fork&&) = delete;

   private:
    friend class RngTracker;
    Fork(at::Generator stream, bool* forked);
    at::Generator stream_;
    torch::Tensor saved_default_;
    bool* forked_ = nullptr;
  };
  // Draws from the default CPU generator run `name`'s stream until the returned scope ends. A stream
  // is forked once at a time: a nested fork of the same stream throws (it would draw the same numbers
  // again and lose what the inner fork advanced).
  Fork fork(const std::string& name);

  // The streams' generators, in name order: what a checkpoint must capture and replay.
  std::vector<at::Generator> generators() const;

  // Every stream's state, in name order: what a training state must carry, so that a resumed run draws
  // the masks the uninterrupted one drew (a tracker left out of the state restarts its streams).
  std::vector<std::pair<std::string, torch::Tensor>> states() const;
  // Sets the streams to saved states. Throws unless `saved` names exactly this tracker's streams, and
  // while a stream is forked (the default generator holds its state then).
  void set_states(const std::vector<std::pair<std::string, torch::Tensor>>& saved);

 private:
  struct Stream {
    at::Generator generator;
    std::unique_ptr<bool> forked = std::make_unique<bool>(false);
  };
  std::map<std::string, Stream> streams_;
};

}  // namespace ckv::dist
