// properties/rng_replay.cpp: rng-replay. Every recomputed call of a dropout site drew the mask the first
// forward drew, at every position whose mask is known (site_tap.hpp: native dropout hides the mask where
// its input is exactly zero).
#include <fmt/format.h>

#include "properties/compare.hpp"
#include "properties/property.hpp"
#include "properties/replay.hpp"

namespace ckv {
namespace {
const char* kName = "rng-replay";

Finding judge(const Observations& o) {
  size_t compared = 0;
  for (const ReplayPair& p : replay_pairs(o.test.sites)) {
    const SiteCall& r = *p.later;
    if (!r.mask.defined()) continue;  // rate 0: nothing drawn
    const std::string site = site_label(r);
    if (!p.first) return Finding::fail(kName, r.step, site, "a recompute call without a first-forward call");
    const SiteCall& f = *p.first;
    torch::Tensor known = torch::ones_like(r.mask);
    if (r.known.defined()) known = known & r.known;
    if (f.known.defined()) known = known & f.known;
    const torch::Tensor diff = (r.mask != f.mask) & known;
    const int64_t n = diff.sum().item<int64_t>();
    ++compared;
    if (n == 0) continue;
    const int64_t flat = diff.reshape({-1}).nonzero().index({0, 0}).item<int64_t>();
    CompareResult where{{"mask", r.mask.sizes().vec(), {}}, {}, {}};
    where.view.dims = r.site == DropoutSite::attn_probs ? std::vector<std::string>{"b", "h", "t", "j"}
                                                        : std::vector<std::string>{"b", "t", "c"};
    return Finding::fail(
        kName, r.step, site,
        fmt::format("recomputed dropout mask differs from the first forward's at {} of {} known positions ({:.1f}%), "
                    "first at index {} (first forward {}, recompute {})",
                    n, known.sum().item<int64_t>(),
                    100.0 * static_cast<double>(n) / static_cast<double>(r.mask.numel()), where.index(flat),
                    f.mask.reshape({-1})[flat].item<bool>() ? "kept" : "dropped",
                    r.mask.reshape({-1})[flat].item<bool>() ? "kept" : "dropped"));
  }
  if (compared == 0) return Finding::not_applicable(kName, "no dropout site with a non-zero rate was recomputed");
  return Finding::pass(kName, fmt::format("{} recomputed mask(s) equal to the first forward's", compared));
}
}  // namespace

Property rng_replay_property() {
  return {kName, "every recomputed dropout mask equals the first forward's, per site and micro-batch (known positions)",
          judge};
}

}  // namespace ckv
