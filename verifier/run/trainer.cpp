// verifier/run/trainer.cpp: the Trainer's inputs (trainer.hpp): which parameters train, where gradient
// flows, the prepared Case, the strategy Case check, the run's private directory.
#include "verifier/run/trainer.hpp"

namespace ckv::run_detail {

std::vector<bool> trainable_mask(const Case& c, const ParamSet& layout) {
  std::vector<bool> out;
  for (size_t i = 0; i < layout.items.size(); ++i) {
    const std::string& n = layout.items[i].name;
    bool frozen = false;
    if (c.freeze == Freeze::alt) frozen = i % 2 == 1;
    if (c.freeze == Freeze::blocks) frozen = n.rfind("layer", 0) == 0;
    out.push_back(!frozen);
  }
  return out;
}

std::vector<bool> gradient_flow(const Case& c, const std::vector<Segment>& segments,
                                const std::vector<bool>& trainable) {
  const ParamSet layout = param_layout(c.model);
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < layout.items.size(); ++i)
      if (layout.items[i].name == name) return i;
    return layout.items.size();
  };
  std::vector<bool> out;
  bool upstream = !c.input_frozen;
  for (const auto& seg : segments) {
    bool any = false;
    for (const Unit& u : seg.units) {
      std::vector<std::string> names;
      auto add = [&](ModelPart p) {
        for (auto& n : part_param_names(c.model, p, u.layer)) names.push_back(n);
      };
      if (u.part == BlockPart::embed) add(ModelPart::input_projection);
      if (u.part == BlockPart::whole || u.part == BlockPart::attn) add(ModelPart::block_attn);
      if (u.part == BlockPart::whole || u.part == BlockPart::ffn) add(ModelPart::block_ffn);
      for (const auto& n : names) any |= trainable.at(index_of(n));
    }
    out.push_back(upstream || any);
    upstream = upstream || any;
  }
  return out;
}

std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ckverify-run-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw EnvironmentError("cannot create a temporary directory in " + tmpl);
  return tmpl;
}

Observations prepare(const Case& c) {
  validate(c);
  Observations o;
  o.c = c;
  o.segments = c.plan.segments(c.model.layers, c.model.attention, c.model.tie == Tie::head);
  o.initial_params = make_params(c.model, c.seed);
  o.trainable = trainable_mask(c, o.initial_params);
  o.grad_flows = gradient_flow(c, o.segments, o.trainable);
  o.passes = c.gp > 0.0 ? 2 : 1;
  for (int m = 0; m < c.micro; ++m) o.data.push_back(make_case_data(c.model, c.batch, seq_of(c, m), c.seed, m));
  return o;
}

// A strategy's Case: blocks as whole units, each its own segment, taking and returning the hidden state.
void check_strategy_case(const Case& c) {
  std::string need;
  if (c.plan.kind != PlanKind::every_block)
    need = "plan=block (one segment per block)";
  else if (c.segio() != SegIO::single)
    need = "segio=single (blocks over the hidden state alone)";
  else if (c.model.segout != SegOut::plain)
    need = "segout=plain (blocks over the hidden state alone)";
  else if (c.model.tie == Tie::head)
    need = "tie=none or tie=blocks (the tied input projection is no block)";
  if (!need.empty())
    throw EnvironmentError("a strategy is gated on Cases whose blocks are whole units: this Case needs " + need);
}

}  // namespace ckv::run_detail
