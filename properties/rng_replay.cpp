// properties/rng_replay.cpp: rng-replay. Every recomputed call of a dropout site drew the mask the first
// forward drew, at every position whose mask is known (site_tap.hpp: native dropout hides the mask where
// its input is exactly zero), and every recomputed noise module (fx=noise) and jitter (rand=jitter) drew
// the first forward's eps.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <tuple>

#include "properties/compare.hpp"
#include "properties/property.hpp"
#include "properties/replay.hpp"
#include "verifier/model/shard.hpp"

namespace ckv {
namespace {
const char* kName = "rng-replay";

// Every recomputed draw of a noise module or the jitter against the first forward's; counts the compared.
std::optional<Finding> judge_draws(const std::vector<NoiseCall>& calls, const char* what, size_t& compared) {
  std::map<std::tuple<int, int, int>, const NoiseCall*> first;
  for (const NoiseCall& n : calls)
    if (n.call == 0) first[{n.step, n.micro, n.layer}] = &n;
  for (const NoiseCall& r : calls) {
    if (r.call == 0) continue;
    const std::string where =
        fmt::format("step {} micro {} layer{} {} call {}", r.step, r.micro, r.layer, what, r.call);
    const auto it = first.find({r.step, r.micro, r.layer});
    if (it == first.end()) return Finding::fail(kName, r.step, where, "a recompute call without a first-forward call");
    const torch::Tensor& f = it->second->eps;
    if (r.eps.sizes() != f.sizes())
      return Finding::fail(kName, r.step, where,
                           fmt::format("the recompute drew {} of shape {} where the first forward drew {}: it "
                                       "recomputed from inputs of other shapes",
                                       what, c10::str(r.eps.sizes()), c10::str(f.sizes())));
    ++compared;
    if (torch::equal(r.eps, f)) continue;
    const torch::Tensor diff = r.eps != f;
    const int64_t n = diff.sum().item<int64_t>();
    if (n == 0) continue;
    const int64_t flat = diff.reshape({-1}).nonzero().index({0, 0}).item<int64_t>();
    CompareResult at{{"eps", r.eps.sizes().vec(), {"b", "t", "c"}}, {}, {}};
    return Finding::fail(kName, r.step, where,
                         fmt::format("the recomputed {} differs from the first forward's at {} of {} positions, "
                                     "first at index {} (first forward {:.6g}, recompute {:.6g}): the recompute drew "
                                     "from a different generator state",
                                     what, n, r.eps.numel(), at.index(flat), f.reshape({-1})[flat].item<double>(),
                                     r.eps.reshape({-1})[flat].item<double>()));
  }
  return std::nullopt;
}

Finding judge(const Observations& o) {
  size_t compared = 0;
  for (const ReplayPair& p : replay_pairs(o.test.sites)) {
    const SiteCall& r = *p.later;
    if (!r.mask.defined()) continue;  // rate 0: nothing drawn
    const std::string site = site_label(r);
    if (!p.first) return Finding::fail(kName, r.step, site, "a recompute call without a first-forward call");
    const SiteCall& f = *p.first;
    ++compared;
    if (f.mask.defined() && r.mask.sizes() == f.mask.sizes() && torch::equal(r.mask, f.mask)) continue;
    if (!f.mask.defined() || r.mask.sizes() != f.mask.sizes())
      return Finding::fail(
          kName, r.step, site,
          fmt::format("the recompute drew a dropout mask of shape {} where the first forward drew {}: "
                      "it recomputed from inputs of other shapes",
                      c10::str(r.mask.sizes()), f.mask.defined() ? c10::str(f.mask.sizes()) : std::string("none")));
    torch::Tensor known = torch::ones_like(r.mask);
    if (r.known.defined()) known = known & r.known;
    if (f.known.defined()) known = known & f.known;
    const torch::Tensor diff = (r.mask != f.mask) & known;
    const int64_t n = diff.sum().item<int64_t>();
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
                    r.mask.reshape({-1})[flat].item<bool>() ? "kept" : "dropped") +
            // Inside a tensor-parallel region the mask comes from the model-parallel stream, which only
            // a checkpoint that replays the generators it is shown draws again.
            (o.c.tp > 1 && site_shard_dim(r.site) >= 0
                 ? "; the site is inside a tensor-parallel region and draws from the model-parallel stream: for "
                   "the recompute, the checkpoint must give each generator the call shows "
                   "(SegmentCall::generators; segment.generators in Python) the state it had at that call's "
                   "forward, as it does the default generator (a stream not restored, or given another call's, "
                   "rank's or generator's state, draws another mask)"
                 : ""));
  }
  // Noise modules and jitter: the recompute's eps must be the first forward's, bitwise (same generator
  // position).
  size_t noise_compared = 0;
  for (const auto& [calls, what] : {std::pair{&o.test.noise, "noise"}, std::pair{&o.test.jitter, "jitter"}})
    if (std::optional<Finding> f = judge_draws(*calls, what, noise_compared)) return *f;
  if (compared + noise_compared == 0)
    return Finding::not_applicable(
        kName, "no dropout site with a non-zero rate, no noise module and no jitter was recomputed");
  return Finding::pass(kName, fmt::format("{} recomputed mask(s) and {} recomputed noise or jitter draw(s) equal to "
                                          "the first forward's",
                                          compared, noise_compared));
}
}  // namespace

Property rng_replay_property() {
  return {kName,
          "every recomputed dropout mask (known positions) and noise draw (fx=noise) equals the first forward's, per "
          "site and micro-batch",
          judge};
}

}  // namespace ckv
