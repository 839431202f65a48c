// verifier/dist/group.cpp: see group.hpp.
#include "verifier/dist/group.hpp"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstring>
#include <stdexcept>

namespace ckv::dist {

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // the whole group's store; subgroups prefix it
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::chrono::milliseconds timeout;
};

namespace {
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                     std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}
}  // namespace

std::shared_ptr<Group> Group::join(const GroupSpec& spec) {
  if (spec.size < 1 || spec.rank < 0 || spec.rank >= spec.size)
    throw std::invalid_argument("dist: rank " + std::to_string(spec.rank) + " of a group of " +
                                std::to_string(spec.size));
  auto impl = std::make_shared<Impl>();
  auto file = c10::make_intrusive<c10d::FileStore>(spec.store_path, spec.size);
  file->setTimeout(spec.timeout);
  impl->store = file;
  impl->timeout = spec.timeout;
  impl->pg =
      make_gloo(c10::make_intrusive<c10d::PrefixStore>("world", impl->store), spec.rank, spec.size, spec.timeout);
  return std::make_shared<Group>(impl, spec.rank, spec.size, "world");
}

std::shared_ptr<Group> Group::subgroup(const std::string& name, const std::vector<int>& ranks) const {
  int me = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_)
      throw std::invalid_argument("dist: subgroup " + name + " names rank " + std::to_string(ranks[i]) +
                                  " of a group of " + std::to_string(size_));
    if (ranks[i] == rank_) me = static_cast<int>(i);
  }
  if (me < 0) throw std::invalid_argument("dist: rank " + std::to_string(rank_) + " is not in subgroup " + name);
  auto impl = std::make_shared<Impl>();
  impl->store = impl_->store;
  impl->timeout = impl_->timeout;
  const int n = static_cast<int>(ranks.size());
  // The members are part of the store's prefix: disjoint subgroups of the same name ("tp" of each
  // replica) must not meet.
  std::string members;
  for (int r : ranks) members += (members.empty() ? "" : ",") + std::to_string(r);
  const std::string full = name_ + "/" + name + "[" + members + "]";
  impl->pg = make_gloo(c10::make_intrusive<c10d::PrefixStore>(full, impl->store), me, n, impl->timeout);
  return std::make_shared<Group>(impl, me, n, full);
}

// Gloo reduces and gathers raw buffers: ranks that pass tensors of other sizes or dtypes would read
// past or short of each other's data. Each collective first gathers every rank's (numel, dtype) and
// throws on every rank, naming the ranks, when they differ.
namespace {
// Waits for a collective: the group's timeout, or `wait` (c10d then throws "Operation timed out").
template <class W>
void wait_for(const W& work, std::optional<std::chrono::milliseconds> wait) {
  if (wait)
    work->wait(*wait);
  else
    work->wait();
}
}  // namespace

void Group::check_same_on_every_rank(const torch::Tensor& t, const char* what,
                                     std::optional<std::chrono::milliseconds> wait) const {
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < size_; ++r) out[0].push_back(torch::empty({2}, torch::kLong));
  std::vector<torch::Tensor> in{torch::tensor({t.numel(), static_cast<int64_t>(t.scalar_type())}, torch::kLong)};
  wait_for(impl_->pg->allgather(out, in), wait);
  for (int r = 0; r < size_; ++r)
    if (!torch::equal(out[0][static_cast<size_t>(r)], in[0]))
      throw std::invalid_argument(
          std::string("dist: ") + what + " in " + name_ + ": rank " + std::to_string(rank_) + " passes " +
          std::to_string(t.numel()) + " elements of " + std::string(c10::toString(t.scalar_type())) + ", rank " +
          std::to_string(r) + " " + std::to_string(out[0][static_cast<size_t>(r)][0].item<int64_t>()) +
          " elements of type " +
          c10::toString(static_cast<c10::ScalarType>(out[0][static_cast<size_t>(r)][1].item<int64_t>())));
}

void Group::all_reduce_sum_(torch::Tensor& t) const {
  if (!t.is_contiguous()) throw std::invalid_argument("dist: all_reduce of a non-contiguous tensor");
  check_same_on_every_rank(t, "all_reduce");
  // bf16 and fp16 (an autocast region's partial sums) are summed in fp32 and rounded once: Gloo in
  // LibTorch 1.13 has no bf16 reduction ("Invalid scalar type"), and both builds then sum alike.
  if (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf) {
    std::vector<torch::Tensor> wide{t.to(torch::kFloat)};
    impl_->pg->allreduce(wide)->wait();
    t.copy_(wide[0]);
    return;
  }
  std::vector<torch::Tensor> ts{t};
  impl_->pg->allreduce(ts)->wait();
}

std::vector<torch::Tensor> Group::all_gather(const torch::Tensor& t,
                                             std::optional<std::chrono::milliseconds> wait) const {
  const torch::Tensor in = t.contiguous();
  check_same_on_every_rank(in, "all_gather", wait);
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < size_; ++r) out[0].push_back(torch::empty_like(in));
  std::vector<torch::Tensor> ins{in};
  wait_for(impl_->pg->allgather(out, ins), wait);
  return out[0];
}

std::vector<std::vector<torch::Tensor>> Group::all_gather_many(const std::vector<torch::Tensor>& ts) const {
  // The lists first: their lengths (all_gather's own check), then every tensor's size and dtype.
  std::vector<int64_t> sig{static_cast<int64_t>(ts.size())};
  std::vector<torch::Tensor> host;
  int64_t total = 0;
  for (const torch::Tensor& t : ts) {
    host.push_back(t.detach().to(torch::kCPU).contiguous());
    sig.push_back(host.back().numel());
    sig.push_back(static_cast<int64_t>(host.back().scalar_type()));
    total += static_cast<int64_t>(host.back().nbytes());
  }
  const torch::Tensor mine = torch::tensor(sig, torch::kLong);
  const std::vector<torch::Tensor> sigs = all_gather(mine);
  for (int r = 0; r < size_; ++r) {
    const torch::Tensor& theirs = sigs[static_cast<size_t>(r)];
    if (torch::equal(theirs, mine)) continue;
    const int64_t* a = mine.data_ptr<int64_t>();
    const int64_t* b = theirs.data_ptr<int64_t>();
    int64_t i = 1;
    while (a[i] == b[i]) ++i;
    const int64_t item = (i - 1) / 2;
    auto type = [](int64_t code) { return std::string(c10::toString(static_cast<c10::ScalarType>(code))); };
    throw std::invalid_argument("dist: all_gather_many in " + name_ + ": tensor " + std::to_string(item) + ": rank " +
                                std::to_string(rank_) + " passes " + std::to_string(a[1 + 2 * item]) + " elements of " +
                                type(a[2 + 2 * item]) + ", rank " + std::to_string(r) + " " +
                                std::to_string(b[1 + 2 * item]) + " elements of type " + type(b[2 + 2 * item]));
  }
  // Then every tensor's bytes in one buffer (at least one byte: Gloo in LibTorch 1.13 divides by the
  // element count), its size now known equal on every rank.
  torch::Tensor buffer = torch::zeros({std::max<int64_t>(total, 1)}, torch::kUInt8);
  uint8_t* at = buffer.data_ptr<uint8_t>();
  for (const torch::Tensor& h : host) {
    if (h.nbytes() > 0) std::memcpy(at, h.data_ptr(), h.nbytes());
    at += h.nbytes();
  }
  std::vector<std::vector<torch::Tensor>> gathered(1);
  for (int r = 0; r < size_; ++r) gathered[0].push_back(torch::empty_like(buffer));
  std::vector<torch::Tensor> in{buffer};
  impl_->pg->allgather(gathered, in)->wait();
  std::vector<std::vector<torch::Tensor>> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const uint8_t* from = gathered[0][static_cast<size_t>(r)].data_ptr<uint8_t>();
    for (size_t i = 0; i < ts.size(); ++i) {
      torch::Tensor t = torch::empty_like(host[i]);
      if (t.nbytes() > 0) std::memcpy(t.data_ptr(), from, t.nbytes());
      from += t.nbytes();
      out[static_cast<size_t>(r)].push_back(t.to(ts[i].device()));
    }
  }
  return out;
}

void Group::barrier() const {
  impl_->pg->barrier()->wait();
}

}  // namespace ckv::dist
