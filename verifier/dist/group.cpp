// verifier/dist/group.cpp: see group.hpp.
#include "verifier/dist/group.hpp"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
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
// past or short of each other's data. So every collective begins with an exchange of fixed-size blocks,
// each rank's collective kind, tensor sizes and dtypes, and (what fits) its data; every rank compares,
// and throws, naming the ranks, when they differ. Only then does anything of a size the ranks chose
// travel. A block costs what the bare size check cost: one collective of a few kilobytes.
namespace {
enum Kind : int64_t { kAllReduce = 1, kAllGather = 2, kAllGatherMany = 3, kBytes = 4 };

std::string kind_name(int64_t kind) {
  switch (kind) {
    case kAllReduce:
      return "all_reduce";
    case kAllGather:
      return "all_gather";
    case kAllGatherMany:
      return "all_gather_many";
    case kBytes:
      return "all_gather_bytes";
    default:
      return "an unknown collective (" + std::to_string(kind) + ")";
  }
}

// The block: the message's length (int64), then its first kBlock - 8 bytes.
constexpr int64_t kBlock = Group::kInlineBytes + 16;

// Waits for a collective: the group's timeout, or `wait` (c10d then throws "Operation timed out").
template <class W>
void wait_for(const W& work, std::optional<std::chrono::milliseconds> wait) {
  if (wait)
    work->wait(*wait);
  else
    work->wait();
}

int64_t read_int(const std::string& s, size_t at) {
  if (s.size() < at + sizeof(int64_t)) throw std::logic_error("dist: a message shorter than its header");
  int64_t v = 0;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}

void append_ints(std::string& s, std::initializer_list<int64_t> vs) {
  for (int64_t v : vs) s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A tensor of `sizes` and `type` on the CPU holding s's bytes from `at` (copied: a string's bytes are
// not aligned for every dtype).
torch::Tensor tensor_from(const std::string& s, size_t at, c10::IntArrayRef sizes, c10::ScalarType type) {
  torch::Tensor t = torch::empty(sizes, torch::TensorOptions().dtype(type));
  if (s.size() < at + t.nbytes()) throw std::logic_error("dist: a message shorter than its tensor");
  if (t.nbytes() > 0) std::memcpy(t.data_ptr(), s.data() + at, t.nbytes());
  return t;
}

std::string type_name(int64_t code) {
  return c10::toString(static_cast<c10::ScalarType>(code));
}
}  // namespace

std::vector<std::string> Group::exchange(int64_t kind, const std::string& payload,
                                         std::optional<std::chrono::milliseconds> wait) const {
  std::string mine;
  append_ints(mine, {kind});
  mine += payload;
  const int64_t length = static_cast<int64_t>(mine.size());
  // Rank r's block at r * kBlock in a zeroed buffer, summed over the ranks: an all-gather through Gloo's
  // all-reduce, which works in place. Gloo's all-gather stages its output in a LibTorch tensor on its
  // own thread, which memory accounting (model/memory.hpp) would charge to the run whose step is
  // current; this buffer and Gloo's own scratch are outside LibTorch's allocator. uint8 sums are exact
  // here: every byte has one rank that may write it.
  auto gather = [&](int64_t block_bytes, int64_t from) {
    std::vector<uint8_t> buffer(static_cast<size_t>(block_bytes * size_), 0);
    uint8_t* at = buffer.data() + block_bytes * rank_;
    if (from == 0) {
      std::memcpy(at, &length, sizeof length);
      std::memcpy(at + 8, mine.data(), static_cast<size_t>(std::min(length, block_bytes - 8)));
    } else if (length > from) {
      std::memcpy(at, mine.data() + from, static_cast<size_t>(length - from));
    }
    std::vector<torch::Tensor> ts{torch::from_blob(buffer.data(), {block_bytes * size_}, torch::kUInt8)};
    wait_for(impl_->pg->allreduce(ts), wait);
    return buffer;
  };
  const std::vector<uint8_t> blocks = gather(kBlock, 0);
  std::vector<std::string> all(static_cast<size_t>(size_));
  std::vector<int64_t> lengths(static_cast<size_t>(size_));
  int64_t longest = 0;
  for (int r = 0; r < size_; ++r) {
    const uint8_t* from = blocks.data() + kBlock * r;
    int64_t n = 0;
    std::memcpy(&n, from, sizeof n);
    if (n < 8 || n > (int64_t{1} << 40))
      throw std::logic_error("dist: rank " + std::to_string(r) + " sent a block of length " + std::to_string(n));
    all[static_cast<size_t>(r)].assign(reinterpret_cast<const char*>(from) + 8,
                                       static_cast<size_t>(std::min(n, kBlock - 8)));
    lengths[static_cast<size_t>(r)] = n;
    longest = std::max(longest, n);
  }
  // The rest of the longer messages, every rank's padded to the longest: the lengths are now known to
  // every rank, so the sizes Gloo sees agree.
  if (longest > kBlock - 8) {
    const int64_t rest = longest - (kBlock - 8);
    const std::vector<uint8_t> tails = gather(rest, kBlock - 8);
    for (int r = 0; r < size_; ++r) {
      const int64_t n = lengths[static_cast<size_t>(r)];
      if (n > kBlock - 8)
        all[static_cast<size_t>(r)].append(reinterpret_cast<const char*>(tails.data() + rest * r),
                                           static_cast<size_t>(n - (kBlock - 8)));
    }
  }
  for (int r = 0; r < size_; ++r) {
    const int64_t theirs = read_int(all[static_cast<size_t>(r)], 0);
    if (theirs != kind)
      throw std::invalid_argument("dist: " + kind_name(kind) + " in " + name_ + ": rank " + std::to_string(rank_) +
                                  " is in " + kind_name(kind) + ", rank " + std::to_string(r) + " in " +
                                  kind_name(theirs));
  }
  for (std::string& s : all) s.erase(0, sizeof(int64_t));
  return all;
}

std::vector<std::string> Group::exchange_tensor(int64_t kind, const torch::Tensor& t, bool with_data,
                                                std::optional<std::chrono::milliseconds> wait) const {
  std::string mine;
  append_ints(mine, {t.numel(), static_cast<int64_t>(t.scalar_type())});
  if (with_data) {
    const torch::Tensor host = t.detach().to(torch::kCPU).contiguous();
    mine.append(static_cast<const char*>(host.data_ptr()), host.nbytes());
  }
  std::vector<std::string> all = exchange(kind, mine, wait);
  for (int r = 0; r < size_; ++r) {
    const std::string& theirs = all[static_cast<size_t>(r)];
    const int64_t numel = read_int(theirs, 0), type = read_int(theirs, 8);
    if (numel != t.numel() || type != static_cast<int64_t>(t.scalar_type()))
      throw std::invalid_argument("dist: " + kind_name(kind) + " in " + name_ + ": rank " + std::to_string(rank_) +
                                  " passes " + std::to_string(t.numel()) + " elements of " +
                                  type_name(static_cast<int64_t>(t.scalar_type())) + ", rank " + std::to_string(r) +
                                  " " + std::to_string(numel) + " elements of type " + type_name(type));
    if (theirs.size() != mine.size())
      throw std::logic_error("dist: rank " + std::to_string(r) + " sent " + std::to_string(theirs.size()) +
                             " bytes of a tensor, this rank " + std::to_string(mine.size()));
  }
  return all;
}

std::vector<std::string> Group::all_gather_bytes(const std::string& mine,
                                                 std::optional<std::chrono::milliseconds> wait) const {
  return exchange(kBytes, mine, wait);
}

void Group::all_reduce_sum_(torch::Tensor& t) const {
  if (!t.is_contiguous()) throw std::invalid_argument("dist: all_reduce of a non-contiguous tensor");
  // bf16 and fp16 (an autocast region's partial sums) are summed in fp32 and rounded once: Gloo in
  // LibTorch 1.13 has no bf16 reduction ("Invalid scalar type"), and both builds then sum alike.
  const bool narrow = t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
  const bool small = static_cast<int64_t>(t.nbytes()) + 16 <= kInlineBytes;
  const std::vector<std::string> all = exchange_tensor(kAllReduce, t, small, std::nullopt);
  if (small) {
    // Summed into t itself (or, for bf16, fp16 and tensors off the CPU, into a buffer outside
    // LibTorch's allocator): a sum here allocates no tensor, as Gloo's in-place all-reduce did not.
    torch::NoGradGuard no_grad;
    auto part = [&](int r) {  // rank r's tensor, read in its message where aligned for its dtype
      char* at = const_cast<char*>(all[static_cast<size_t>(r)].data()) + 16;
      if (reinterpret_cast<uintptr_t>(at) % alignof(std::max_align_t) != 0)
        return tensor_from(all[static_cast<size_t>(r)], 16, t.sizes(), t.scalar_type());
      return torch::from_blob(at, t.sizes(), torch::TensorOptions().dtype(t.scalar_type()));
    };
    if (!narrow && t.is_cpu()) {
      t.copy_(part(0));
      for (int r = 1; r < size_; ++r) t.add_(part(r));
      return;
    }
    const torch::ScalarType wide = narrow ? torch::kFloat : t.scalar_type();
    const size_t bytes = static_cast<size_t>(t.numel()) * c10::elementSize(wide);
    std::vector<double> sum_buffer((bytes + 7) / 8), part_buffer((bytes + 7) / 8);
    const auto options = torch::TensorOptions().dtype(wide);
    torch::Tensor sum = torch::from_blob(sum_buffer.data(), t.sizes(), options);
    torch::Tensor widened = torch::from_blob(part_buffer.data(), t.sizes(), options);
    sum.copy_(part(0));
    for (int r = 1; r < size_; ++r) {
      widened.copy_(part(r));  // a cast by copy: an add of mixed dtypes would allocate the cast
      sum.add_(widened);
    }
    t.copy_(sum);
    return;
  }
  if (narrow) {
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
  const std::vector<std::string> all = exchange_tensor(kAllGather, t, true, wait);
  std::vector<torch::Tensor> out;
  for (const std::string& theirs : all)
    out.push_back(tensor_from(theirs, 16, t.sizes(), t.scalar_type()).to(t.device()));
  return out;
}

std::vector<std::vector<torch::Tensor>> Group::all_gather_many(const std::vector<torch::Tensor>& ts) const {
  // The list's length, every tensor's size and dtype, then their bytes.
  std::vector<torch::Tensor> host;
  std::string mine;
  append_ints(mine, {static_cast<int64_t>(ts.size())});
  for (const torch::Tensor& t : ts) {
    host.push_back(t.detach().to(torch::kCPU).contiguous());
    append_ints(mine, {host.back().numel(), static_cast<int64_t>(host.back().scalar_type())});
  }
  const size_t header = mine.size();
  for (const torch::Tensor& h : host) mine.append(static_cast<const char*>(h.data_ptr()), h.nbytes());
  const std::vector<std::string> all = exchange(kAllGatherMany, mine, std::nullopt);
  for (int r = 0; r < size_; ++r) {
    const std::string& theirs = all[static_cast<size_t>(r)];
    const int64_t count = read_int(theirs, 0);
    if (count != static_cast<int64_t>(ts.size()))
      throw std::invalid_argument("dist: all_gather_many in " + name_ + ": rank " + std::to_string(rank_) +
                                  " passes a list of " + std::to_string(ts.size()) + " tensors, rank " +
                                  std::to_string(r) + " a list of " + std::to_string(count));
    for (size_t i = 0; i < ts.size(); ++i) {
      const int64_t numel = read_int(theirs, 8 + 16 * i), type = read_int(theirs, 16 + 16 * i);
      if (numel == host[i].numel() && type == static_cast<int64_t>(host[i].scalar_type())) continue;
      throw std::invalid_argument("dist: all_gather_many in " + name_ + ": tensor " + std::to_string(i) + ": rank " +
                                  std::to_string(rank_) + " passes " + std::to_string(host[i].numel()) +
                                  " elements of " + type_name(static_cast<int64_t>(host[i].scalar_type())) + ", rank " +
                                  std::to_string(r) + " " + std::to_string(numel) + " elements of type " +
                                  type_name(type));
    }
  }
  std::vector<std::vector<torch::Tensor>> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    size_t at = header;
    for (size_t i = 0; i < ts.size(); ++i) {
      torch::Tensor t = tensor_from(all[static_cast<size_t>(r)], at, host[i].sizes(), host[i].scalar_type());
      at += t.nbytes();
      out[static_cast<size_t>(r)].push_back(t.to(ts[i].device()));
    }
  }
  return out;
}

void Group::barrier() const {
  impl_->pg->barrier()->wait();
}

}  // namespace ckv::dist
