// verifier/case/plan.hpp: checkpoint plans, as values. A plan says which parts of the block stack run
// inside a checkpoint; the runner (runner.hpp) turns it into segments and hands each checkpointed
// segment to the implementation under test. Spelling (the Case line and JSON use it):
//   none     no checkpointing (the baseline)
//   block    every block is its own checkpoint
//   everyN   block i is checkpointed when i % N == 0, the rest run normally (seed 001, experiment 1)
//   segK     K contiguous segments of near-equal size, each one checkpoint (seed 001, experiment 2)
//   sqrt     segK with K = ceil(sqrt(L)), the classic O(sqrt L) memory plan (seed 000, section 3)
//   attn     selective: inside each block only the attention sub-block is checkpointed
//   ffn      selective: inside each block only the FFN sub-block is checkpointed
//   fromI    hybrid: blocks I..L-1 are checkpointed one by one, earlier blocks run normally
#pragma once

#include <string>
#include <vector>

namespace ckv {

enum class PlanKind { none, every_block, every_n, segments, sqrt_segments, attn_only, ffn_only, from_layer };

inline constexpr int kMaxLayers = 64;  // the Case limit; plan parameters are bounded by it too

// One execution unit: a whole block, its attention or FFN sub-block, or the tied input projection
// (tie=head), which runs at the start of the first segment.
enum class BlockPart { whole, attn, ffn, embed };
struct Unit {
  int layer;
  BlockPart part;
};
struct Segment {
  std::vector<Unit> units;
  bool checkpointed = false;
};

struct Plan {
  PlanKind kind = PlanKind::none;
  int n = 0;  // N of everyN, K of segK, I of fromI

  std::string to_string() const;
  // Parses the spelling above; on failure returns false and sets `error` to one line.
  static bool parse(const std::string& s, Plan& out, std::string& error);
  // Checks the plan against a layer count; returns an empty string when valid.
  std::string invalid_for(int layers) const;
  // The segments, in forward order, for a stack of `layers` blocks; `embed` puts the input projection
  // unit first in the first segment.
  std::vector<Segment> segments(int layers, bool attention, bool embed = false) const;
  bool operator==(const Plan& o) const { return kind == o.kind && n == o.n; }
  bool operator!=(const Plan& o) const { return !(*this == o); }
};

inline const char* kPlanSpellings = "none|block|everyN|segK|sqrt|attn|ffn|fromI";

}  // namespace ckv
