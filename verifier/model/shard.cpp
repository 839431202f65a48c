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

void gather_calls(const dist::Group& tp, std::vector<SiteCall>& sites, std::vector<ReluCall>& relu) {
  // Gloo gathers numbers, not bools: the masks go as bytes, all in one exchange, and come back joined
  // along their split dimension.
  std::vector<torch::Tensor*> where;
  std::vector<int> dims;
  for (SiteCall& c : sites) {
    const int dim = site_shard_dim(c.site);
    if (dim < 0) continue;
    for (torch::Tensor* t : {&c.mask, &c.known})
      if (t->defined()) where.push_back(t), dims.push_back(dim);
  }
  for (ReluCall& c : relu) where.push_back(&c.positive), dims.push_back(2);  // (B,T,Dff): the hidden units
  std::vector<torch::Tensor> bytes;
  for (const torch::Tensor* t : where) bytes.push_back(t->to(torch::kUInt8));
  const auto all = tp.all_gather_many(bytes);
  for (size_t i = 0; i < where.size(); ++i) {
    std::vector<torch::Tensor> parts;
    for (const auto& rank : all) parts.push_back(rank[i]);
    *where[i] = torch::cat(parts, dims[i]).to(torch::kBool);
  }
}

std::vector<std::string> parallel_consistency(const dist::Group& tp, const std::vector<SiteCall>& calls,
                                              const std::array<double, kNumDropoutSites>& p,
                                              const TransformerImpl& model) {
  std::vector<std::string> out;
  auto where = [](const SiteCall& c) {
    return "step " + std::to_string(c.step) + " micro " + std::to_string(c.micro) + " layer " +
           std::to_string(c.layer) + " " + std::string(to_string(c.site));
  };
  // What the ranks compare, in one exchange (a collective costs milliseconds when ranks share cores):
  // the first-forward masks (and, inside a region, which positions each rank knows), which replicated
  // parameters hold a gradient on each rank, and their values; then the gradients every rank holds.
  std::vector<std::pair<std::string, torch::Tensor>> replicated;
  for (const auto& kv : model.named_params())
    if (shard_dim(kv.first) < 0) replicated.push_back(kv);
  std::vector<int64_t> has(replicated.size());
  for (size_t i = 0; i < replicated.size(); ++i) has[i] = replicated[i].second.grad().defined() ? 1 : 0;
  std::vector<torch::Tensor> first{torch::tensor(has, torch::kLong)};
  std::vector<const SiteCall*> judged;
  for (const SiteCall& c : calls) {
    if (c.call != 0 || !c.mask.defined()) continue;
    judged.push_back(&c);
    first.push_back(c.mask.to(torch::kUInt8));
    if (site_shard_dim(c.site) >= 0 && c.known.defined()) first.push_back(c.known.to(torch::kUInt8));
  }
  for (const auto& kv : replicated) first.push_back(kv.second.detach());
  const auto got = tp.all_gather_many(first);
  auto column = [&](size_t i) {
    std::vector<torch::Tensor> v;
    for (const auto& rank : got) v.push_back(rank.at(i));
    return v;
  };
  size_t next = 1;
  for (const SiteCall* cp : judged) {
    const SiteCall& c = *cp;
    const auto masks = column(next++);
    if (site_shard_dim(c.site) < 0) {
      for (size_t r = 1; r < masks.size(); ++r)
        if (!torch::equal(masks[r], masks[0])) {
          out.push_back(where(c) + ": replicated masks differ between ranks 0 and " + std::to_string(r));
          break;
        }
      continue;
    }
    std::vector<torch::Tensor> known;
    if (c.known.defined()) known = column(next++);
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
  const std::vector<torch::Tensor> defined = column(0);
  std::vector<bool> all_have(replicated.size());
  std::vector<torch::Tensor> held;
  for (size_t i = 0; i < replicated.size(); ++i) {
    bool all = true;
    for (const auto& d : defined) all = all && d[static_cast<int64_t>(i)].item<int64_t>() != 0;
    all_have[i] = all;
    if (all) held.push_back(replicated[i].second.grad());
  }
  const auto grads = held.empty() ? std::vector<std::vector<torch::Tensor>>() : tp.all_gather_many(held);
  size_t g = 0;
  for (size_t i = 0; i < replicated.size(); ++i) {
    const std::string& name = replicated[i].first;
    const auto values = column(next++);
    for (size_t r = 1; r < values.size(); ++r)
      if (!torch::equal(values[r], values[0])) {
        out.push_back(name + ": replicated values differ between ranks 0 and " + std::to_string(r));
        break;
      }
    if (!all_have[i]) {
      bool any = false;
      for (const auto& d : defined) any = any || d[static_cast<int64_t>(i)].item<int64_t>() != 0;
      if (any) out.push_back(name + ": a gradient on some ranks only");
      continue;
    }
    for (size_t r = 1; r < grads.size(); ++r)
      if (!torch::equal(grads[r].at(g), grads[0].at(g))) {
        out.push_back(name + ": replicated gradients differ between ranks 0 and " + std::to_string(r));
        break;
      }
    ++g;
  }
  return out;
}

std::vector<std::string> replica_consistency(const dist::Group& dp, const TransformerImpl& model) {
  // Every parameter and whether it holds a gradient, in one exchange; then the gradients every replica
  // holds, in another.
  const auto params = model.named_params();
  std::vector<torch::Tensor> first;
  for (const auto& kv : params) {
    first.push_back(kv.second.detach());
    first.push_back(torch::tensor({kv.second.grad().defined() ? 1 : 0}, torch::kInt));
  }
  const auto got = dp.all_gather_many(first);
  const size_t replicas = got.size();
  std::vector<int> with(params.size(), 0);
  std::vector<torch::Tensor> held;
  for (size_t i = 0; i < params.size(); ++i) {
    for (const auto& rank : got) with[i] += rank.at(2 * i + 1).item<int>();
    if (with[i] == static_cast<int>(replicas)) held.push_back(params[i].second.grad());
  }
  const auto grads = held.empty() ? std::vector<std::vector<torch::Tensor>>() : dp.all_gather_many(held);
  std::vector<std::string> out;
  size_t g = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].first;
    for (size_t r = 1; r < replicas; ++r)
      if (!torch::equal(got[r].at(2 * i), got[0].at(2 * i))) {
        out.push_back(name + ": values differ between replicas 0 and " + std::to_string(r));
        break;
      }
    if (with[i] == 0) continue;
    if (with[i] != static_cast<int>(replicas)) {
      out.push_back(name + ": a gradient on some replicas only");
      continue;
    }
    for (size_t r = 1; r < replicas; ++r)
      if (!torch::equal(grads[r].at(g), grads[0].at(g))) {
        out.push_back(name + ": gradients differ between replicas 0 and " + std::to_string(r) +
                      " (a gradient the reducer did not average)");
        break;
      }
    ++g;
  }
  return out;
}

}  // namespace ckv
