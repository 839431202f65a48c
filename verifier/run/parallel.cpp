// verifier/run/parallel.cpp: see parallel.hpp.
#include "verifier/run/parallel.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "verifier/model/shard.hpp"
#include "verifier/run/run.hpp"

namespace ckv {

ParallelRun::ParallelRun(std::shared_ptr<dist::Group> world, const Case& c)
    : world_(std::move(world)), tp_(c.tp), dp_(c.dp), micro_count_(c.micro / std::max(1, c.dp)) {
  if (world_->size() != c.ranks())
    throw std::invalid_argument("parallel: " + std::to_string(world_->size()) +
                                " ranks for a Case with tp=" + std::to_string(c.tp) + " dp=" + std::to_string(c.dp));
  if (c.micro % c.dp != 0) throw std::invalid_argument("parallel: micro is not divisible by dp");
  // Megatron's convention: the model-parallel stream is the seed offset by 2718 plus the tensor-parallel
  // rank (equal across data-parallel replicas).
  stream_seed_ = c.seed + 2718 + static_cast<uint64_t>(tp_rank());
  if (tp_ > 1) {
    std::vector<int> replica(static_cast<size_t>(tp_));
    std::iota(replica.begin(), replica.end(), dp_rank() * tp_);
    tp_group_ = world_->subgroup("tp" + std::to_string(dp_rank()), replica);
  }
  if (dp_ > 1) {
    std::vector<int> shard;
    for (int d = 0; d < dp_; ++d) shard.push_back(d * tp_ + tp_rank());
    dp_group_ = world_->subgroup("dp" + std::to_string(tp_rank()), shard);
  }
}

RunGroups ParallelRun::run_groups() const {
  const std::string run = "run" + std::to_string(runs_++);
  RunGroups g;
  // Every rank makes its tensor-parallel group first, then its data-parallel one: each is formed by
  // ranks that all form it next.
  if (tp_ > 1) {
    std::vector<int> replica(static_cast<size_t>(tp_));
    std::iota(replica.begin(), replica.end(), dp_rank() * tp_);
    g.tp = world_->subgroup(run + ".tp" + std::to_string(dp_rank()), replica);
  }
  if (dp_ > 1) {
    std::vector<int> shard;
    for (int d = 0; d < dp_; ++d) shard.push_back(d * tp_ + tp_rank());
    g.dp = world_->subgroup(run + ".dp" + std::to_string(tp_rank()), shard);
  }
  return g;
}

bool ParallelRun::all(bool mine, std::optional<std::chrono::milliseconds> wait) const {
  for (const torch::Tensor& t : world_->all_gather(torch::tensor({mine ? 1 : 0}, torch::kInt), wait))
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
  std::string bytes(mine.size() * sizeof(double), '\0');
  if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::vector<std::vector<double>> out;
  for (const std::string& theirs : world_->all_gather_bytes(bytes)) {
    if (theirs.size() % sizeof(double) != 0)
      throw std::logic_error("parallel: a rank sent " + std::to_string(theirs.size()) + " bytes of doubles");
    std::vector<double> v(theirs.size() / sizeof(double));
    if (!v.empty()) std::memcpy(v.data(), theirs.data(), theirs.size());
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<std::string> ParallelRun::strings(const std::string& mine) const {
  return world_->all_gather_bytes(mine);
}

std::vector<double> ParallelRun::flat(const ParamSet& shard) {
  std::vector<double> out;
  for (const NamedArray& a : shard.items) out.insert(out.end(), a.data.begin(), a.data.end());
  return out;
}

ParamSet ParallelRun::join_shards(const ParamSet& shard, std::vector<std::vector<double>> ranks) const {
  const std::vector<double> mine = flat(shard);
  ranks.resize(static_cast<size_t>(tp_));  // replica 0's tensor-parallel ranks
  for (const auto& r : ranks)
    if (r.size() != mine.size()) throw std::runtime_error("parallel: the ranks hold parameter sets of other sizes");
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

// The records of a replica's calls as numbers (exact: bools, small integers and fp32 values), to be
// sent to the other ranks, and back.
struct Pack {
  std::vector<double> v;
  void num(double x) { v.push_back(x); }
  void tensor(const torch::Tensor& t) {
    if (!t.defined()) return num(-1.0);
    num(static_cast<double>(t.dim()));
    for (int64_t s : t.sizes()) num(static_cast<double>(s));
    num(static_cast<double>(static_cast<int>(t.scalar_type())));
    const torch::Tensor d = t.to(torch::kDouble).contiguous();
    v.insert(v.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
};
struct Unpack {
  const std::vector<double>& v;
  size_t at = 0;
  double num() { return v.at(at++); }
  int integer() { return static_cast<int>(num()); }
  torch::Tensor tensor() {
    const int dims = integer();
    if (dims < 0) return {};
    std::vector<int64_t> sizes;
    for (int i = 0; i < dims; ++i) sizes.push_back(static_cast<int64_t>(num()));
    const auto type = static_cast<c10::ScalarType>(integer());
    torch::Tensor d = torch::empty(sizes, torch::kDouble);
    if (at + static_cast<size_t>(d.numel()) > v.size()) throw std::runtime_error("parallel: a truncated record");
    std::copy(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + d.numel()),
              d.data_ptr<double>());
    at += static_cast<size_t>(d.numel());
    return d.to(type);
  }
  bool done() const { return at >= v.size(); }
};

std::vector<double> pack(const std::vector<SiteCall>& calls) {
  Pack p;
  for (const SiteCall& c : calls) {
    for (int x : {c.step, c.micro, c.phase, c.layer, static_cast<int>(c.site), c.call}) p.num(x);
    p.num(c.grad_enabled ? 1 : 0);
    p.num(c.autocast.cpu_enabled ? 1 : 0), p.num(c.autocast.cuda_enabled ? 1 : 0);
    p.num(static_cast<int>(c.autocast.cpu_dtype)), p.num(static_cast<int>(c.autocast.cuda_dtype));
    p.tensor(c.mask), p.tensor(c.known);
  }
  return p.v;
}
void unpack(const std::vector<double>& v, std::vector<SiteCall>& out) {
  for (Unpack u{v}; !u.done();) {
    SiteCall c;
    c.step = u.integer(), c.micro = u.integer(), c.phase = u.integer(), c.layer = u.integer();
    c.site = static_cast<DropoutSite>(u.integer()), c.call = u.integer();
    c.grad_enabled = u.num() != 0.0;
    c.autocast.cpu_enabled = u.num() != 0.0, c.autocast.cuda_enabled = u.num() != 0.0;
    c.autocast.cpu_dtype = static_cast<at::ScalarType>(u.integer());
    c.autocast.cuda_dtype = static_cast<at::ScalarType>(u.integer());
    c.mask = u.tensor(), c.known = u.tensor();
    out.push_back(std::move(c));
  }
}
std::vector<double> pack(const std::vector<ReluCall>& calls) {
  Pack p;
  for (const ReluCall& c : calls) {
    for (int x : {c.step, c.micro, c.layer, c.call}) p.num(x);
    p.tensor(c.positive);
  }
  return p.v;
}
void unpack(const std::vector<double>& v, std::vector<ReluCall>& out) {
  for (Unpack u{v}; !u.done();) {
    ReluCall c;
    c.step = u.integer(), c.micro = u.integer(), c.layer = u.integer(), c.call = u.integer();
    c.positive = u.tensor();
    out.push_back(std::move(c));
  }
}
std::vector<double> pack(const std::vector<NoiseCall>& calls) {
  Pack p;
  for (const NoiseCall& c : calls) {
    for (int x : {c.step, c.micro, c.phase, c.layer, c.call}) p.num(x);
    p.tensor(c.eps);
  }
  return p.v;
}
void unpack(const std::vector<double>& v, std::vector<NoiseCall>& out) {
  for (Unpack u{v}; !u.done();) {
    NoiseCall c;
    c.step = u.integer(), c.micro = u.integer(), c.phase = u.integer(), c.layer = u.integer(), c.call = u.integer();
    c.eps = u.tensor();
    out.push_back(std::move(c));
  }
}
std::vector<double> pack(const std::vector<SegmentCallRecord>& calls) {
  std::vector<double> out;
  for (const SegmentCallRecord& s : calls)
    out.insert(out.end(), {static_cast<double>(s.step), static_cast<double>(s.micro), static_cast<double>(s.segment),
                           static_cast<double>(s.phase), s.grad_enabled ? 1.0 : 0.0});
  return out;
}
void unpack(const std::vector<double>& v, std::vector<SegmentCallRecord>& out) {
  for (size_t i = 0; i + 4 < v.size(); i += 5)
    out.push_back({static_cast<int>(v[i]), static_cast<int>(v[i + 1]), static_cast<int>(v[i + 2]),
                   static_cast<int>(v[i + 3]), v[i + 4] != 0.0, std::string()});  // (no arguments)
}

// Every replica's records of one kind side by side, step by step (each replica's in its own order
// within a step: replica d ran micro-batches after replica d-1's).
template <typename Call>
std::vector<Call> join_replicas(const std::vector<std::vector<double>>& packed) {
  std::vector<Call> out;
  for (const auto& p : packed) unpack(p, out);
  std::stable_sort(out.begin(), out.end(), [](const Call& a, const Call& b) { return a.step < b.step; });
  return out;
}

// The replicas' logs as one: every line in the order of (step, micro-batch) it names ("... step S micro M
// ..."), each replica's lines of one micro-batch in their own order; a line that names none goes with
// the line before it.
std::string join_logs(const std::vector<std::string>& logs) {
  struct Line {
    int step, micro;
    std::string text;
  };
  std::vector<Line> lines;
  for (const std::string& log : logs) {
    std::istringstream in(log);
    int step = -1, micro = -1;
    for (std::string text; std::getline(in, text);) {
      const size_t s = text.find(" step "), m = text.find(" micro ");
      if (s != std::string::npos && m != std::string::npos) {
        step = std::atoi(text.c_str() + s + 6);
        micro = std::atoi(text.c_str() + m + 7);
      }
      lines.push_back({step, micro, text + "\n"});
    }
  }
  std::stable_sort(lines.begin(), lines.end(),
                   [](const Line& a, const Line& b) { return std::tie(a.step, a.micro) < std::tie(b.step, b.micro); });
  std::string out;
  for (const Line& l : lines) out += l.text;
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
  // Within each replica (the replicas run other micro-batches, at other shapes under seqvar).
  const std::vector<std::vector<double>> signatures = vectors(signature);
  for (size_t k = 0; k < signatures.size(); ++k)
    if (signatures[k] != signatures[k - k % static_cast<size_t>(tp_)]) return false;
  return true;
}

std::vector<std::vector<std::vector<double>>> ParallelRun::vectors_many(
    const std::vector<std::vector<double>>& mine) const {
  std::vector<std::vector<std::vector<double>>> out;
  for (const std::vector<double>& theirs : vectors(flatten(mine))) {
    out.push_back(unflatten(theirs));
    if (out.back().size() != mine.size())
      throw std::runtime_error("parallel: the ranks exchanged lists of " + std::to_string(mine.size()) + " and " +
                               std::to_string(out.back().size()) + " vectors");
  }
  return out;
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
  auto ints = [](const auto& v) { return std::vector<double>(v.begin(), v.end()); };
  // Every step's numbers go in one exchange (a collective costs milliseconds when ranks share cores): for
  // each step, kItems vectors in this order.
  enum Item : size_t {
    grads,
    params_after,
    optimizer,
    batchnorm,
    hook_input_max,
    first_micro,
    losses,
    dx,
    grad_defined,
    hook_calls,
    counter,
    external,
    cache_calls,
    log,
    kItems
  };
  std::vector<std::vector<double>> mine;
  for (const StepRecord& s : r.steps) {
    std::vector<std::vector<double>> items(kItems);
    items[grads] = flat(s.grads), items[params_after] = flat(s.params_after);
    items[optimizer] = flat(s.optimizer), items[batchnorm] = flat(s.ledger.batchnorm);
    items[hook_input_max] = {s.hook_input_max}, items[first_micro] = {static_cast<double>(s.first_micro)};
    items[losses] = s.losses, items[dx] = flatten(s.dx);
    items[grad_defined] = ints(s.grad_defined), items[hook_calls] = ints(s.hook_calls);
    items[counter] = ints(s.ledger.counter), items[external] = ints(s.ledger.external);
    items[cache_calls] = ints(s.ledger.cache_calls);
    items[log] = std::vector<double>(s.ledger.log.begin(), s.ledger.log.end());  // bytes as doubles: exact
    for (auto& v : items) mine.push_back(std::move(v));
  }
  const std::vector<std::vector<std::vector<double>>> all_ranks = vectors_many(mine);
  // Item `item` of step `step`: every rank's, or each replica's (its tensor-parallel rank 0's).
  auto of_ranks = [&](size_t step, Item item) {
    std::vector<std::vector<double>> out;
    for (const auto& theirs : all_ranks) out.push_back(theirs.at(step * kItems + item));
    return out;
  };
  auto of_replicas = [&](size_t step, Item item) {
    std::vector<std::vector<double>> out;
    for (int d = 0; d < dp_; ++d) out.push_back(all_ranks.at(static_cast<size_t>(d * tp_)).at(step * kItems + item));
    return out;
  };
  auto sum = [](const std::vector<std::vector<double>>& vs) {
    std::vector<double> out = vs.at(0);
    for (size_t k = 1; k < vs.size(); ++k)
      for (size_t i = 0; i < out.size() && i < vs[k].size(); ++i) out[i] += vs[k][i];
    return out;
  };
  auto join = [](const std::vector<std::vector<double>>& vs) {
    std::vector<double> out;
    for (const auto& v : vs) out.insert(out.end(), v.begin(), v.end());
    return out;
  };
  for (size_t k = 0; k < steps; ++k) {
    StepRecord& s = r.steps[k];
    s.grads = join_shards(s.grads, of_ranks(k, grads));
    s.params_after = join_shards(s.params_after, of_ranks(k, params_after));
    s.optimizer = join_shards(s.optimizer, of_ranks(k, optimizer));
    s.ledger.batchnorm = join_shards(s.ledger.batchnorm, of_ranks(k, batchnorm));  // replicated: rank 0's
    for (const auto& v : of_ranks(k, hook_input_max)) s.hook_input_max = std::max(s.hook_input_max, v.at(0));
    s.first_micro = static_cast<int>(of_ranks(k, first_micro).at(0).at(0));
    s.losses = join(of_replicas(k, losses));
    std::vector<std::vector<double>> xs;
    for (const auto& replica : of_replicas(k, dx))
      for (auto& v : unflatten(replica)) xs.push_back(std::move(v));
    s.dx = std::move(xs);
    const std::vector<double> defined = of_ranks(k, grad_defined).at(0);
    s.grad_defined.assign(defined.begin(), defined.end());
    const std::vector<double> hooks = sum(of_replicas(k, hook_calls));
    s.hook_calls.assign(hooks.begin(), hooks.end());
    if (dp_ > 1) {  // every replica ran its own micro-batches' forwards
      for (auto [count, item] : {std::pair{&s.ledger.counter, counter}, std::pair{&s.ledger.external, external},
                                 std::pair{&s.ledger.cache_calls, cache_calls}}) {
        const std::vector<double> total = sum(of_replicas(k, item));
        count->assign(total.begin(), total.end());
      }
      std::vector<std::string> logs;
      for (const auto& codes : of_replicas(k, log)) {
        std::string text;
        for (double d : codes) text += static_cast<char>(static_cast<int>(d));
        logs.push_back(std::move(text));
      }
      s.ledger.log = join_logs(logs);
    }
  }
  // The masks and ReLU sides are gathered call by call, so only where every rank made the same calls.
  const bool same = completed && same_calls(r);
  if (same && tp_ > 1) gather_calls(*tp_group_, r.sites, r.relu);
  // Each replica's calls, in one exchange: the masks and ReLU sides where gathered, the noise and jitter
  // where every rank completed, the segment calls always.
  std::vector<std::vector<double>> calls{pack(r.segment_calls)};
  if (same && dp_ > 1) calls.push_back(pack(r.sites)), calls.push_back(pack(r.relu));
  if (completed && dp_ > 1) calls.push_back(pack(r.noise)), calls.push_back(pack(r.jitter));
  const std::vector<std::vector<std::vector<double>>> theirs = vectors_many(calls);
  auto replicas_of = [&](size_t item) {
    std::vector<std::vector<double>> out;
    for (int d = 0; d < dp_; ++d) out.push_back(theirs.at(static_cast<size_t>(d * tp_)).at(item));
    return out;
  };
  std::vector<SegmentCallRecord> segments;
  if (dp_ > 1)
    segments = join_replicas<SegmentCallRecord>(replicas_of(0));
  else
    unpack(theirs.at(0).at(0), segments);
  r.segment_calls = std::move(segments);
  size_t next = 1;
  if (same && dp_ > 1) {
    r.sites = join_replicas<SiteCall>(replicas_of(next++));
    r.relu = join_replicas<ReluCall>(replicas_of(next++));
  }
  if (completed && dp_ > 1) {
    r.noise = join_replicas<NoiseCall>(replicas_of(next++));
    r.jitter = join_replicas<NoiseCall>(replicas_of(next++));
  }
  return same;
}

}  // namespace ckv
