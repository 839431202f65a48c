// verifier/case/plan.cpp: plan spelling and segmentation (see plan.hpp).
#include "verifier/case/plan.hpp"

#include <cmath>
#include <cstdlib>

namespace ckv {
namespace {
bool parse_suffix(const std::string& s, size_t prefix_len, int& out) {
  const std::string digits = s.substr(prefix_len);
  if (digits.empty() || digits.size() > 6) return false;
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  out = std::atoi(digits.c_str());
  return true;
}
}  // namespace

std::string Plan::to_string() const {
  switch (kind) {
    case PlanKind::none:
      return "none";
    case PlanKind::every_block:
      return "block";
    case PlanKind::every_n:
      return "every" + std::to_string(n);
    case PlanKind::segments:
      return "seg" + std::to_string(n);
    case PlanKind::sqrt_segments:
      return "sqrt";
    case PlanKind::attn_only:
      return "attn";
    case PlanKind::ffn_only:
      return "ffn";
    case PlanKind::from_layer:
      return "from" + std::to_string(n);
  }
  return "?";
}

bool Plan::parse(const std::string& s, Plan& out, std::string& error) {
  Plan p;
  if (s == "none")
    p.kind = PlanKind::none;
  else if (s == "block")
    p.kind = PlanKind::every_block;
  else if (s == "sqrt")
    p.kind = PlanKind::sqrt_segments;
  else if (s == "attn")
    p.kind = PlanKind::attn_only;
  else if (s == "ffn")
    p.kind = PlanKind::ffn_only;
  else if (s.rfind("every", 0) == 0 && parse_suffix(s, 5, p.n) && p.n >= 1)
    p.kind = PlanKind::every_n;
  else if (s.rfind("seg", 0) == 0 && parse_suffix(s, 3, p.n) && p.n >= 1)
    p.kind = PlanKind::segments;
  else if (s.rfind("from", 0) == 0 && parse_suffix(s, 4, p.n))
    p.kind = PlanKind::from_layer;
  else {
    error = "plan \"" + s + "\" is not one of " + kPlanSpellings + " (N, K >= 1; I >= 0)";
    return false;
  }
  if (p.n > kMaxLayers || (p.kind == PlanKind::from_layer && p.n >= kMaxLayers)) {
    error = "plan " + s + ": N and K must be at most " + std::to_string(kMaxLayers) + " and I at most " +
            std::to_string(kMaxLayers - 1) + " (the layer limit)";
    return false;
  }
  out = p;
  return true;
}

std::string Plan::invalid_for(int layers) const {
  if (kind == PlanKind::segments && n > layers)
    return "plan seg" + std::to_string(n) + " needs K <= layers=" + std::to_string(layers);
  if (kind == PlanKind::from_layer && n >= layers)
    return "plan from" + std::to_string(n) + " needs I < layers=" + std::to_string(layers);
  return {};
}

std::vector<Segment> Plan::segments(int layers, bool attention, bool embed) const {
  std::vector<Segment> out;
  auto whole = [&](int l, bool ckpt) { out.push_back({{{l, BlockPart::whole}}, ckpt}); };
  switch (kind) {
    case PlanKind::none:
      for (int l = 0; l < layers; ++l) whole(l, false);
      break;
    case PlanKind::every_block:
      for (int l = 0; l < layers; ++l) whole(l, true);
      break;
    case PlanKind::every_n:
      for (int l = 0; l < layers; ++l) whole(l, l % n == 0);
      break;
    case PlanKind::from_layer:
      for (int l = 0; l < layers; ++l) whole(l, l >= n);
      break;
    case PlanKind::segments:
    case PlanKind::sqrt_segments: {
      const int k =
          kind == PlanKind::segments ? n : static_cast<int>(std::ceil(std::sqrt(static_cast<double>(layers))));
      int first = 0;
      for (int s = 0; s < k; ++s) {
        const int size = layers / k + (s < layers % k ? 1 : 0);  // earlier segments take the remainder
        Segment seg;
        seg.checkpointed = true;
        for (int l = first; l < first + size; ++l) seg.units.push_back({l, BlockPart::whole});
        first += size;
        if (!seg.units.empty()) out.push_back(seg);
      }
      break;
    }
    case PlanKind::attn_only:
    case PlanKind::ffn_only:
      for (int l = 0; l < layers; ++l) {
        if (attention) out.push_back({{{l, BlockPart::attn}}, kind == PlanKind::attn_only});
        out.push_back({{{l, BlockPart::ffn}}, kind == PlanKind::ffn_only});
      }
      break;
  }
  if (embed && !out.empty()) out.front().units.insert(out.front().units.begin(), Unit{-1, BlockPart::embed});
  return out;
}

}  // namespace ckv
