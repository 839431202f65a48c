// verifier/dist/group.hpp: processes joined in a c10d process group over Gloo on 127.0.0.1, the
// substrate of Cases with tensor or data parallelism (tp, dp). Every rank is a process of its own; they
// meet through a FileStore (a file in the run's temporary directory), so nothing listens on a port.
// Subgroups (the tensor-parallel ranks of one replica, the replicas of one shard) are process groups of
// their own over a prefix of the same store. Collectives sum in place and wait; a rank that does not
// arrive fails the others at the group's timeout with c10d's error (ranks.hpp kills and attributes).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ckv::dist {

struct GroupSpec {
  std::string store_path;  // the FileStore's file; every rank names the same one
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{30000};  // how long a collective waits for the other ranks
};

class Group {
 public:
  // Joins the group (every rank calls it with its own rank); returns once all have joined.
  static std::shared_ptr<Group> join(const GroupSpec& spec);
  // The subgroup whose members are `ranks` (ranks of this group, in the subgroup's order); every member
  // calls it with the same `name` and `ranks`, and no other rank needs to.
  std::shared_ptr<Group> subgroup(const std::string& name, const std::vector<int>& ranks) const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }

  // Collectives throw on every rank when the ranks pass tensors of other sizes or dtypes, or are not in
  // the same collective (one in all_reduce_sum_, another in all_gather).
  //
  // In place; t must be contiguous. bf16 and fp16 are summed in fp32 and rounded once. A tensor whose
  // bytes and size fit in kInlineBytes travels with its check, in one collective, and every rank sums
  // the ranks' tensors in rank order (((r0 + r1) + r2) + ...), so the ranks hold the same sum (on two
  // ranks, Gloo's); a larger one goes to Gloo's all-reduce after its check.
  void all_reduce_sum_(torch::Tensor& t) const;
  // Every rank's bytes, in rank order; the ranks may pass other lengths. One collective when each
  // rank's fit in kInlineBytes, two otherwise (the second as long as the longest).
  std::vector<std::string> all_gather_bytes(const std::string& mine,
                                            std::optional<std::chrono::milliseconds> wait = std::nullopt) const;
  // What the first collective of an exchange carries per rank: a collective costs milliseconds when
  // ranks share cores, whatever its size, and the models' tensors are small.
  static constexpr int64_t kInlineBytes = 16384 - 16;
  // Every rank's t, in rank order. `wait`: how long this rank waits for the others before it throws, if not
  // the group's timeout (the collective then stays pending: the process must end without tearing the group
  // down, whose destructor waits for it).
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t,
                                        std::optional<std::chrono::milliseconds> wait = std::nullopt) const;
  // Every rank's tensors, out[r][i] rank r's ts[i] (shaped as this rank's ts[i], on its device), in one
  // exchange however many there are (one collective while they fit in kInlineBytes): a collective costs
  // milliseconds when ranks share cores, so a list of tensors goes at once. Throws on every rank, naming
  // the first difference, when the ranks pass lists of other lengths or tensors of other sizes or dtypes.
  std::vector<std::vector<torch::Tensor>> all_gather_many(const std::vector<torch::Tensor>& ts) const;
  void barrier() const;

  struct Impl;
  explicit Group(std::shared_ptr<Impl> impl, int rank, int size, std::string name)
      : impl_(std::move(impl)), rank_(rank), size_(size), name_(std::move(name)) {}

 private:
  // Every rank's message, which begins with the collective's kind (the enum in group.cpp): throws on
  // every rank when the ranks are in other collectives.
  std::vector<std::string> exchange(int64_t kind, const std::string& mine,
                                    std::optional<std::chrono::milliseconds> wait) const;
  // Every rank's tensor, checked for size and dtype against t; the bytes follow where `with_data`.
  std::vector<std::string> exchange_tensor(int64_t kind, const torch::Tensor& t, bool with_data,
                                           std::optional<std::chrono::milliseconds> wait) const;
  std::shared_ptr<Impl> impl_;
  int rank_, size_;
  std::string name_;
};

}  // namespace ckv::dist
