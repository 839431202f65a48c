// properties/replay.hpp: what rng-replay and autocast-replay share: the recomputed calls of every
// dropout site, each paired with the first-forward call it must replay.
#pragma once

#include <fmt/format.h>

#include <map>
#include <tuple>
#include <vector>

#include "verifier/run/run.hpp"

namespace ckv {

struct ReplayPair {
  const SiteCall* first;  // call 0 of the site in that micro-batch (null if there was none)
  const SiteCall* later;  // a later call: a recompute
};

inline std::vector<ReplayPair> replay_pairs(const std::vector<SiteCall>& calls) {
  std::map<std::tuple<int, int, int, int>, const SiteCall*> first;
  for (const auto& c : calls)
    if (c.call == 0) first[{c.step, c.micro, c.layer, static_cast<int>(c.site)}] = &c;
  std::vector<ReplayPair> out;
  for (const auto& c : calls)
    if (c.call > 0) {
      const auto it = first.find({c.step, c.micro, c.layer, static_cast<int>(c.site)});
      out.push_back({it == first.end() ? nullptr : it->second, &c});
    }
  return out;
}

inline std::string site_label(const SiteCall& c) {
  return fmt::format("step {} micro {} layer{} {} call {}", c.step, c.micro, c.layer, to_string(c.site), c.call);
}

}  // namespace ckv
