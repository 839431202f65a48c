// example_strategy.cpp: a checkpointing *strategy* as a ckverify plugin, gated with
// `ckverify check --strategy ./libexample_strategy.so[:segments=N]`. A strategy decides which blocks to
// checkpoint and how to group them; the checkpoint itself is ckverify's own library (ckv::checkpoint,
// resolved from the ckverify executable that loads the plugin), so what the gate judges here is the
// grouping code, as in a training framework's "checkpoint every N layers" switch.
//
// The strategy: split the L blocks into `segments` contiguous groups of near-equal size (the first
// L % segments groups one block larger) and run each group as one checkpoint. Blocks come in a
// StackCall: one SegmentCall per block, fn(h) -> {h}.
//
// Built a second time with EXAMPLE_STRATEGY_BUG (libexample_strategy_buggy.so): ONE deliberate bug,
// an inclusive group end (`i <= stop` for `i < stop`), the off-by-one of hand-written segment loops: the
// last block of every group but the final one runs twice, once at the end of its group and again at the
// start of the next. The loss still goes down and nothing throws; ckverify's recompute-count names the
// block that ran twice in one forward.
#include <ckverify/plugin.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

class GroupedStrategy : public ckv::CheckpointImpl {
 public:
  explicit GroupedStrategy(const ckv::PluginOptions& o) {
    if (auto it = o.find("segments"); it != o.end()) {
      try {
        size_t used = 0;
        segments_ = std::stoi(it->second, &used);
        if (used != it->second.size()) throw std::invalid_argument("trailing text");
      } catch (const std::exception&) {
        throw std::invalid_argument("segments=" + it->second + " is not an integer");
      }
      if (segments_ < 1) throw std::invalid_argument("segments must be >= 1");
    }
    for (const auto& [k, v] : o)
      if (k != "segments") throw std::invalid_argument("unknown option " + k + " (known: segments)");
  }

  bool is_strategy() const override { return true; }

  std::vector<torch::Tensor> run(const ckv::SegmentCall& call) override { return call.fn(call.args); }

  torch::Tensor run_stack(const ckv::StackCall& call) override {
    const int n = static_cast<int>(call.blocks.size());
    const int k = std::max(1, std::min(segments_, n));
    torch::Tensor h = call.x;
    int start = 0;
    for (int s = 0; s < k; ++s) {
      const int stop = start + n / k + (s < n % k ? 1 : 0);
      // The group's function: its blocks in order. It copies the SegmentFunctions it runs (they stay
      // valid until the step ends, as the interface promises), so the recompute can call it again.
      std::vector<ckv::SegmentFunction> group;
#ifdef EXAMPLE_STRATEGY_BUG
      const int last = s + 1 < k ? stop : stop - 1;  // BUG: the group runs through block `stop` inclusive
      for (int i = start; i <= last; ++i) group.push_back(call.blocks[static_cast<size_t>(i)].fn);
#else
      for (int i = start; i < stop; ++i) group.push_back(call.blocks[static_cast<size_t>(i)].fn);
#endif
      auto fn = [group](const std::vector<c10::IValue>& args) {
        std::vector<torch::Tensor> out{args.at(0).toTensor()};
        for (const auto& block : group) out = block({out.at(0)});
        return out;
      };
      // The generators the blocks draw from besides the defaults (a tensor-parallel run's model-parallel
      // stream) are replayed with them: the recompute then draws the masks the forward drew.
      ckv::CheckpointOptions options;
      for (int i = start; i < stop; ++i)
        for (const at::Generator& g : call.blocks[static_cast<size_t>(i)].generators)
          if (std::none_of(options.generators.begin(), options.generators.end(),
                           [&](const at::Generator& o) { return o == g; }))
            options.generators.push_back(g);
      h = ckv::checkpoint(fn, {h}, options).at(0);
      start = stop;
    }
    return h;
  }

 private:
  int segments_ = 2;
};

}  // namespace

CKVERIFY_PLUGIN([](const ckv::PluginOptions& o) { return new GroupedStrategy(o); })
