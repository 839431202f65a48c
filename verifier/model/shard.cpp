// verifier/model/shard.cpp: see shard.hpp.
#include "verifier/model/shard.hpp"

#include <cmath>
#include <stdexcept>

#include "verifier/dist/group.hpp"
#include "verifier/model/model.hpp"

namespace ckv {

int shard_dim(const std::string& name) {
  // "<...>.<module>.<linear>.<weight|bias>"
  std::vector<std::string> parts;
  for (size_t begin = 0;;) {
    const size_t dot = name.find('.', begin);
    parts.push_back(name.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  if (parts.size() < 3) return -1;
  const std::string& what = parts[parts.size() - 1];
  const std::string& linear = parts[parts.size() - 2];
  const std::string& module = parts[parts.size() - 3];
  const bool weight = what == "weight";
  if (!weight && what != "bias") return -1;
  const bool column = (module == "attn" && (linear == "wq" || linear == "wk" || linear == "wv")) ||
                      (module == "ffn" && (linear == "fc1" || linear == "gate"));
  const bool row = (module == "attn" && linear == "wo") || (module == "ffn" && linear == "fc2");
  if (column) return 0;         // weight rows and bias entries: the rank's outputs
  if (row && weight) return 1;  // weight columns: the rank's inputs
  return -1;                    // a row-parallel bias is added once, after the reduction
}

int site_shard_dim(DropoutSite s) {
  switch (s) {
    case DropoutSite::attn_probs:
      return 1;  // (B,H,T,T): the rank's heads
    case DropoutSite::ffn_hidden:
      return 2;  // (B,T,Dff): the rank's hidden units
    default:
      return -1;
  }
}

ParamSet shard_params(const ParamSet& full, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("shard_params: rank " + std::to_string(rank) + " of " + std::to_string(size));
  ParamSet out;
  for (const NamedArray& a : full.items) {
    const int dim = shard_dim(a.name);
    if (dim < 0 || size == 1) {
      out.items.push_back(a);
      continue;
    }
    if (static_cast<size_t>(dim) >= a.shape.size() || a.shape[static_cast<size_t>(dim)] % size != 0)
      throw std::invalid_argument("shard_params: " + a.name + " does not split " + std::to_string(size) + " ways");
    NamedArray s{a.name, a.shape, {}};
    const int64_t n = a.shape[static_cast<size_t>(dim)] / size;
    s.shape[static_cast<size_t>(dim)] = n;
    if (dim == 0) {  // contiguous rows
      const int64_t row = a.shape.size() > 1 ? a.shape[1] : 1;
      const auto begin = a.data.begin() + rank * n * row;
      s.data.assign(begin, begin + n * row);
    } else {  // columns of a matrix
      const int64_t rows = a.shape[0], cols = a.shape[1];
      s.data.reserve(static_cast<size_t>(rows * n));
      for (int64_t r = 0; r < rows; ++r) {
        const auto begin = a.data.begin() + r * cols + rank * n;
        s.data.insert(s.data.end(), begin, begin + n);
      }
    }
    out.items.push_back(std::move(s));
  }
  return out;
}

namespace {
// Every rank's `t` (bool) joined along `dim`. Gloo reduces and gathers numbers, not bools: sent as bytes.
torch::Tensor gather_along(const dist::Group& tp, const torch::Tensor& t, int dim) {
  const auto parts = tp.all_gather(t.to(torch::kUInt8).contiguous());
  return torch::cat(parts, dim).to(torch::kBool);
}
}  // namespace

std::vector<SiteCall> gather_site_calls(const dist::Group& tp, const std::vector<SiteCall>& calls) {
  std::vector<SiteCall> out = calls;
  for (SiteCall& c : out) {
    const int dim = site_shard_dim(c.site);
    if (dim < 0) continue;
    if (c.mask.defined()) c.mask = gather_along(tp, c.mask, dim);
    if (c.known.defined()) c.known = gather_along(tp, c.known, dim);
  }
  return out;
}

std::vector<ReluCall> gather_relu_calls(const dist::Group& tp, const std::vector<ReluCall>& calls) {
  std::vector<ReluCall> out = calls;
  for (ReluCall& c : out) c.positive = gather_along(tp, c.positive, 2);  // (B,T,Dff): the hidden units
  return out;
}

std::vector<std::string> parallel_consistency(const dist::Group& tp, const std::vector<SiteCall>& calls,
                                              const std::array<double, kNumDropoutSites>& p,
                                              const TransformerImpl& model) {
  std::vector<std::string> out;
  auto where = [](const SiteCall& c) {
    return "step " + std::to_string(c.step) + " micro " + std::to_string(c.micro) + " layer " +
           std::to_string(c.layer) + " " + std::string(to_string(c.site));
  };
  for (const SiteCall& c : calls) {
    if (c.call != 0 || !c.mask.defined()) continue;
    const auto masks = tp.all_gather(c.mask.to(torch::kUInt8).contiguous());
    if (site_shard_dim(c.site) < 0) {
      for (size_t r = 1; r < masks.size(); ++r)
        if (!torch::equal(masks[r], masks[0])) {
          out.push_back(where(c) + ": replicated masks differ between ranks 0 and " + std::to_string(r));
          break;
        }
      continue;
    }
    std::vector<torch::Tensor> known;
    if (c.known.defined()) known = tp.all_gather(c.known.to(torch::kUInt8).contiguous());
    // Two independent masks agree at a position with probability q = p^2 + (1-p)^2.
    const double rate = p[static_cast<size_t>(c.site)];
    const double log_q = std::log(rate * rate + (1.0 - rate) * (1.0 - rate));
    for (size_t i = 0; i < masks.size(); ++i)
      for (size_t j = i + 1; j < masks.size(); ++j) {
        const torch::Tensor both = known.empty() ? torch::ones_like(masks[i], torch::kBool)
                                                 : (known[i].to(torch::kBool) & known[j].to(torch::kBool));
        const double n = static_cast<double>(both.sum().item<int64_t>());
        if (!(n * log_q < std::log(1e-9))) continue;  // too few positions to tell
        if (((masks[i] == masks[j]) | both.logical_not()).all().item<bool>())
          out.push_back(where(c) + ": model-parallel masks of ranks " + std::to_string(i) + " and " +
                        std::to_string(j) + " are equal");
      }
  }
  // Replicated parameters and gradients: which ranks hold a gradient first (a collective over tensors
  // only some ranks have would not match), then the values.
  std::vector<std::pair<std::string, torch::Tensor>> replicated;
  for (const auto& kv : model.named_params())
    if (shard_dim(kv.first) < 0) replicated.push_back(kv);
  std::vector<uint8_t> has(replicated.size());
  for (size_t i = 0; i < replicated.size(); ++i) has[i] = replicated[i].second.grad().defined();
  const auto defined = tp.all_gather(torch::tensor(std::vector<int64_t>(has.begin(), has.end()), torch::kLong));
  for (size_t i = 0; i < replicated.size(); ++i) {
    bool all = true, any = false;
    for (const auto& d : defined) {
      const bool h = d[static_cast<int64_t>(i)].item<int64_t>() != 0;
      all = all && h, any = any || h;
    }
    const std::string& name = replicated[i].first;
    const auto values = tp.all_gather(replicated[i].second.detach().contiguous());
    for (size_t r = 1; r < values.size(); ++r)
      if (!torch::equal(values[r], values[0])) {
        out.push_back(name + ": replicated values differ between ranks 0 and " + std::to_string(r));
        break;
      }
    if (!all) {
      if (any) out.push_back(name + ": a gradient on some ranks only");
      continue;
    }
    const auto grads = tp.all_gather(replicated[i].second.grad().contiguous());
    for (size_t r = 1; r < grads.size(); ++r)
      if (!torch::equal(grads[r], grads[0])) {
        out.push_back(name + ": replicated gradients differ between ranks 0 and " + std::to_string(r));
        break;
      }
  }
  return out;
}

std::vector<std::string> replica_consistency(const dist::Group& dp, const TransformerImpl& model) {
  std::vector<std::string> out;
  for (const auto& kv : model.named_params()) {
    const torch::Tensor& p = kv.second;
    const auto values = dp.all_gather(p.detach().contiguous());
    for (size_t r = 1; r < values.size(); ++r)
      if (!torch::equal(values[r], values[0])) {
        out.push_back(kv.first + ": values differ between replicas 0 and " + std::to_string(r));
        break;
      }
    const auto defined = dp.all_gather(torch::tensor({p.grad().defined() ? 1 : 0}, torch::kInt));
    int with = 0;
    for (const auto& d : defined) with += d.item<int>();
    if (with == 0) continue;
    if (with != static_cast<int>(defined.size())) {
      out.push_back(kv.first + ": a gradient on some replicas only");
      continue;
    }
    const auto grads = dp.all_gather(p.grad().contiguous());
    for (size_t r = 1; r < grads.size(); ++r)
      if (!torch::equal(grads[r], grads[0])) {
        out.push_back(kv.first + ": gradients differ between replicas 0 and " + std::to_string(r) +
                      " (a gradient the reducer did not average)");
        break;
      }
  }
  return out;
}

}  // namespace ckv
