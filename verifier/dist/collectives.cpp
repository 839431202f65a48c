// verifier/dist/collectives.cpp: see collectives.hpp.
#include "verifier/dist/collectives.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <chrono>
#include <map>
#include <utility>

#include "verifier/checkpoint/compat.hpp"
#include "verifier/checkpoint/segment_scope.hpp"

namespace ckv::dist {

const char* to_string(Pass p) {
  switch (p) {
    case Pass::forward:
      return "forward";
    case Pass::recompute:
      return "recompute";
    case Pass::backward:
      return "backward";
  }
  return "?";
}
const char* to_string(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
  }
  return "?";
}

void CollectiveLedger::add(CollectiveRecord r) {
  const std::lock_guard<std::mutex> lock(mu_);
  records_.push_back(std::move(r));
}
std::vector<CollectiveRecord> CollectiveLedger::records() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return records_;
}
int CollectiveLedger::count(Pass pass) const {
  const std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& r : records_) n += r.pass == pass;
  return n;
}
int64_t CollectiveLedger::bytes(Pass pass) const {
  const std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& r : records_)
    if (r.pass == pass) n += r.bytes;
  return n;
}

std::vector<std::string> ledger_violations(const std::vector<CollectiveRecord>& plain,
                                           const std::vector<CollectiveRecord>& test) {
  // (label, kind) -> backward collectives of the plain run and of the test run, in label order.
  std::map<std::pair<std::string, Collective>, std::pair<int, int>> counts;
  for (const auto& r : plain)
    if (r.pass == Pass::backward) ++counts[{r.where, r.kind}].first;
  for (const auto& r : test)
    if (r.pass == Pass::backward) ++counts[{r.where, r.kind}].second;
  std::vector<std::string> out;
  // A label the plain run never issued a backward collective for is another gradient path (the stack's
  // input made to require grad), extra communication but no repeat: not counted.
  for (const auto& [key, n] : counts)
    if (n.first > 0 && n.second > n.first)
      out.push_back(key.first + ": " + std::to_string(n.second) + " backward " + to_string(key.second) + ", " +
                    std::to_string(n.first) + " without checkpointing");
  return out;
}

torch::Tensor all_reduce_recorded(const Group& group, const torch::Tensor& t, CollectiveLedger* ledger, Pass pass,
                                  const std::string& where) {
  torch::Tensor out = t.detach().contiguous().clone();
  const auto start = std::chrono::steady_clock::now();
  group.all_reduce_sum_(out);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (ledger)
    ledger->add(
        {Collective::all_reduce, pass, static_cast<int64_t>(out.numel() * out.element_size()), where, took.count()});
  return out;
}

namespace {
using torch::autograd::variable_list;

torch::Tensor all_reduce(const torch::Tensor& t, ParallelRegion& region, Pass pass, const std::string& where) {
  return all_reduce_recorded(*region.group, t, region.ledger.get(), pass, where);
}
Pass forward_pass() {
  return compat::current_backward_key() >= 0 ? Pass::recompute : Pass::forward;
}

// The backward of enter_parallel: the gradient all-reduced. (leave_parallel's backward is the identity.)
struct AllReduceBackward : torch::autograd::Node {
  std::shared_ptr<ParallelRegion> region;
  std::string where;
  std::vector<int64_t> sizes;  // the input's, for a gradient that is undefined on this rank
  torch::TensorOptions options;
  variable_list apply(variable_list&& grads) override {
    // The sum over the ranks is not differentiated again here: refused rather than silently first-order.
    if (torch::GradMode::is_enabled())
      throw std::runtime_error("enter_parallel (" + where +
                               "): a backward with create_graph through a tensor-parallel region is not supported");
    // Every rank joins the collective, also one whose gradient is undefined (it contributes zeros).
    const torch::Tensor g = grads.at(0).defined() ? grads[0] : torch::zeros(sizes, options);
    return {all_reduce(g, *region, Pass::backward, where)};
  }
  std::string name() const override { return "ckv::dist::AllReduceBackward"; }
};
struct IdentityBackward : torch::autograd::Node {
  variable_list apply(variable_list&& grads) override { return {grads.at(0)}; }
  std::string name() const override { return "ckv::dist::IdentityBackward"; }
};

// `out` (a new tensor holding the forward's value) gets `node` as its gradient function, wired to x's.
torch::Tensor attach(torch::Tensor out, const torch::Tensor& x, std::shared_ptr<torch::autograd::Node> node) {
  if (!(torch::GradMode::is_enabled() && x.requires_grad())) return out;
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(out, node);
  return out;
}
}  // namespace

torch::Tensor enter_parallel(const torch::Tensor& x, const std::shared_ptr<ParallelRegion>& region,
                             const std::string& where) {
  auto node = std::shared_ptr<AllReduceBackward>(new AllReduceBackward(), torch::autograd::deleteNode);
  node->region = region;
  node->where = where;
  node->sizes = x.sizes().vec();
  node->options = x.options();
  // A copy, not an alias: the output must be a tensor of its own to carry a gradient function.
  return attach(x.detach().clone(), x, node);
}

torch::Tensor leave_parallel(const torch::Tensor& y, const std::shared_ptr<ParallelRegion>& region,
                             const std::string& where, bool keep_in_checkpoint) {
  auto identity = [] { return std::shared_ptr<IdentityBackward>(new IdentityBackward(), torch::autograd::deleteNode); };
  SegmentState* segment = keep_in_checkpoint ? current_segment() : nullptr;
  const std::string key = "ckv.dist.reduced." + where;
  if (segment && is_recomputing()) {
    const auto kept = segment->stash.find(key);
    // The forward's sum, no collective; its gradient still flows to this rank's partial product.
    if (kept != segment->stash.end()) return attach(kept->second.toTensor().clone(), y, identity());
  }
  if (segment && !is_recomputing() && segment->stash.count(key))
    throw std::logic_error("leave_parallel: region " + where +
                           " left twice in one checkpointed call; keep_in_checkpoint needs a label per use");
  torch::Tensor out = all_reduce(y, *region, forward_pass(), where);
  if (segment && !is_recomputing()) segment->stash[key] = out.detach();  // no history: no cycle through it
  return attach(out, y, identity());
}

}  // namespace ckv::dist
