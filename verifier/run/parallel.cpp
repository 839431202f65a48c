// verifier/run/parallel.cpp: see parallel.hpp.
#include "verifier/run/parallel.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "verifier/model/shard.hpp"
#include "verifier/run/run.hpp"

namespace ckv {

ParallelRun::ParallelRun(std::shared_ptr<dist::Group> world, const Case& c)
    : world_(std::move(world)),
      // Megatron's convention: the model-parallel stream is the seed offset by 2718 plus the rank.
      stream_seed_(c.seed + 2718 + static_cast<uint64_t>(world_->rank())) {
  if (world_->size() != c.tp)
    throw std::invalid_argument("parallel: " + std::to_string(world_->size()) +
                                " ranks for a Case with tp=" + std::to_string(c.tp));
}

std::shared_ptr<dist::Group> ParallelRun::run_group() const {
  std::vector<int> ranks(static_cast<size_t>(size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  return world_->subgroup("run" + std::to_string(runs_++), ranks);
}

bool ParallelRun::all(bool mine) const {
  for (const torch::Tensor& t : world_->all_gather(torch::tensor({mine ? 1 : 0}, torch::kInt)))
    if (t.item<int>() == 0) return false;
  return true;
}

double ParallelRun::max(double mine) const {
  double m = mine;
  for (const torch::Tensor& t : world_->all_gather(torch::tensor({mine}, torch::kDouble)))
    m = std::max(m, t.item<double>());
  return m;
}

std::vector<std::vector<double>> ParallelRun::vectors(const std::vector<double>& mine) const {
  // Gloo gathers equal sizes: the sizes first, then every vector padded to the longest.
  int64_t longest = 0;
  std::vector<int64_t> sizes;
  for (const torch::Tensor& t : world_->all_gather(torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong))) {
    sizes.push_back(t.item<int64_t>());
    longest = std::max(longest, sizes.back());
  }
  // At least one element: Gloo in LibTorch 1.13 divides by the element count (SIGFPE on empty tensors).
  torch::Tensor padded = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kDouble);
  std::copy(mine.begin(), mine.end(), padded.data_ptr<double>());
  std::vector<std::vector<double>> out;
  const std::vector<torch::Tensor> all = world_->all_gather(padded);
  for (size_t r = 0; r < all.size(); ++r) {
    const double* p = all[r].data_ptr<double>();
    out.emplace_back(p, p + sizes[r]);
  }
  return out;
}

std::vector<std::string> ParallelRun::strings(const std::string& mine) const {
  std::vector<double> codes(mine.begin(), mine.end());  // bytes as doubles: exact, and one path
  std::vector<std::string> out;
  for (const auto& v : vectors(codes)) {
    std::string s;
    for (double d : v) s += static_cast<char>(static_cast<int>(d));
    out.push_back(std::move(s));
  }
  return out;
}

ParamSet ParallelRun::gather(const ParamSet& shard) const {
  // One collective for the whole set: every item's data, in order, then split again per rank.
  std::vector<double> flat;
  for (const NamedArray& a : shard.items) flat.insert(flat.end(), a.data.begin(), a.data.end());
  const std::vector<std::vector<double>> ranks = vectors(flat);
  for (const auto& r : ranks)
    if (r.size() != flat.size()) throw std::runtime_error("parallel: the ranks hold parameter sets of other sizes");
  ParamSet out;
  size_t offset = 0;
  for (const NamedArray& a : shard.items) {
    const int dim = shard_dim(a.name);
    NamedArray g;
    g.name = a.name;
    g.shape = a.shape;
    if (dim < 0 || dim >= static_cast<int>(a.shape.size())) {
      g.data.assign(ranks[0].begin() + static_cast<std::ptrdiff_t>(offset),
                    ranks[0].begin() + static_cast<std::ptrdiff_t>(offset + a.data.size()));
    } else {
      std::vector<torch::Tensor> parts;
      for (const auto& r : ranks)
        parts.push_back(torch::from_blob(const_cast<double*>(r.data() + offset), a.shape, torch::kDouble));
      const torch::Tensor joined = torch::cat(parts, dim).contiguous();
      g.shape = joined.sizes().vec();
      g.data.assign(joined.data_ptr<double>(), joined.data_ptr<double>() + joined.numel());
    }
    offset += a.data.size();
    out.items.push_back(std::move(g));
  }
  return out;
}

namespace {
std::vector<double> flatten(const std::vector<std::vector<double>>& vs) {
  std::vector<double> out{static_cast<double>(vs.size())};
  for (const auto& v : vs) out.push_back(static_cast<double>(v.size()));
  for (const auto& v : vs) out.insert(out.end(), v.begin(), v.end());
  return out;
}
std::vector<std::vector<double>> unflatten(const std::vector<double>& f) {
  const size_t n = static_cast<size_t>(f.at(0));
  std::vector<std::vector<double>> out(n);
  size_t at = 1 + n;
  for (size_t i = 0; i < n; ++i) {
    const size_t len = static_cast<size_t>(f.at(1 + i));
    out[i].assign(f.begin() + static_cast<std::ptrdiff_t>(at), f.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += len;
  }
  return out;
}
}  // namespace

bool ParallelRun::same_calls(const RunRecord& r) const {
  std::vector<double> signature;
  for (const SiteCall& c : r.sites)
    signature.insert(signature.end(),
                     {static_cast<double>(c.step), static_cast<double>(c.micro), static_cast<double>(c.phase),
                      static_cast<double>(c.layer), static_cast<double>(c.site), static_cast<double>(c.call),
                      c.mask.defined() ? static_cast<double>(c.mask.numel()) : -1.0,
                      c.known.defined() ? static_cast<double>(c.known.numel()) : -1.0});
  signature.push_back(-2.0);
  for (const ReluCall& c : r.relu)
    signature.insert(signature.end(),
                     {static_cast<double>(c.step), static_cast<double>(c.micro), static_cast<double>(c.layer),
                      static_cast<double>(c.call), static_cast<double>(c.positive.numel())});
  const std::vector<std::vector<double>> signatures = vectors(signature);
  return std::all_of(signatures.begin(), signatures.end(),
                     [&](const std::vector<double>& v) { return v == signatures[0]; });
}

bool ParallelRun::gather(RunRecord& r) const {
  // Completion and the error: the lowest failing rank's, named.
  const bool completed = all(r.completed);
  if (!completed) {
    const std::vector<std::string> errors = strings(r.completed ? "" : r.error);
    const std::vector<std::vector<double>> where = vectors(
        {static_cast<double>(r.error_step), static_cast<double>(r.error_micro), static_cast<double>(r.error_phase)});
    for (size_t k = 0; k < errors.size(); ++k) {
      if (errors[k].empty()) continue;
      r.error = "rank " + std::to_string(k) + ": " + errors[k];
      r.error_step = static_cast<int>(where[k][0]), r.error_micro = static_cast<int>(where[k][1]);
      r.error_phase = static_cast<int>(where[k][2]);
      if (static_cast<int>(k) != rank()) r.error_trace.clear();
      break;
    }
    r.completed = false;
  }
  const size_t steps = static_cast<size_t>(-max(-static_cast<double>(r.steps.size())));
  r.steps.resize(steps);
  for (StepRecord& s : r.steps) {
    s.grads = gather(s.grads);
    s.params_after = gather(s.params_after);
    s.optimizer = gather(s.optimizer);
    s.hook_input_max = max(s.hook_input_max);
    s.losses = rank0(s.losses);
    s.dx = unflatten(rank0(flatten(s.dx)));
    std::vector<double> defined(s.grad_defined.begin(), s.grad_defined.end());
    defined = rank0(defined);
    s.grad_defined.assign(defined.begin(), defined.end());
    std::vector<double> hooks(s.hook_calls.begin(), s.hook_calls.end());
    hooks = rank0(hooks);
    s.hook_calls.assign(hooks.begin(), hooks.end());
    s.ledger.batchnorm = gather(s.ledger.batchnorm);  // replicated: rank 0's
  }
  // The masks and ReLU sides are gathered call by call, so only where every rank made the same calls.
  const bool same = completed && same_calls(r);
  if (same) {
    r.sites = gather_site_calls(*world_, r.sites);
    r.relu = gather_relu_calls(*world_, r.relu);
  }
  std::vector<double> calls;
  for (const SegmentCallRecord& s : r.segment_calls)
    calls.insert(calls.end(),
                 {static_cast<double>(s.step), static_cast<double>(s.micro), static_cast<double>(s.segment),
                  static_cast<double>(s.phase), s.grad_enabled ? 1.0 : 0.0});
  calls = rank0(calls);
  r.segment_calls.clear();
  for (size_t i = 0; i + 4 < calls.size(); i += 5)
    r.segment_calls.push_back({static_cast<int>(calls[i]), static_cast<int>(calls[i + 1]),
                               static_cast<int>(calls[i + 2]), static_cast<int>(calls[i + 3]), calls[i + 4] != 0.0});
  return same;
}

}  // namespace ckv
