// verifier/checkpoint/rng.cpp: see rng.hpp.
#include "verifier/checkpoint/rng.hpp"

#include <torch/cuda.h>

#include <cstring>
#include <stdexcept>

#include "verifier/checkpoint/compat.hpp"

namespace ckv {
namespace {
torch::Tensor state_of(const torch::Device& d) {
  at::Generator g = compat::default_generator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void set_state_of(const torch::Device& d, const torch::Tensor& s) {
  at::Generator g = compat::default_generator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
}
torch::Device cuda(size_t i) {
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
}
}  // namespace

RngState RngState::capture(const std::vector<at::Generator>& extra) {
  RngState s;
  s.cpu_ = state_of(torch::Device(torch::kCPU));
  const size_t n = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  for (size_t i = 0; i < n; ++i) s.cuda_.push_back(state_of(cuda(i)));
  for (at::Generator g : extra) {
    if (!g.defined()) throw std::invalid_argument("RngState: an undefined generator");
    std::lock_guard<std::mutex> lock(g.mutex());
    torch::Tensor state = g.get_state();
    s.extra_.emplace_back(std::move(g), std::move(state));
  }
  return s;
}

void RngState::restore(bool include_cuda) const {
  set_state_of(torch::Device(torch::kCPU), cpu_);
  for (const auto& [g, state] : extra_) {
    at::Generator h = g;
    std::lock_guard<std::mutex> lock(h.mutex());
    h.set_state(state);
  }
  if (!include_cuda) return;
  for (size_t i = 0; i < cuda_.size(); ++i) set_state_of(cuda(i), cuda_[i]);
}

std::vector<std::vector<uint8_t>> RngState::bytes() const {
  std::vector<std::vector<uint8_t>> out;
  auto add = [&](const torch::Tensor& t) {
    const torch::Tensor c = t.contiguous().to(torch::kUInt8);
    out.emplace_back(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
  };
  if (cpu_.defined()) add(cpu_);
  for (const auto& t : cuda_) add(t);
  return out;
}

RngState RngState::from_bytes(const std::vector<std::vector<uint8_t>>& b) {
  const RngState here = capture();
  if (b.size() != 1 + here.cuda_.size())
    throw std::invalid_argument("the state holds " + std::to_string(b.size()) + " generator(s), this machine has " +
                                std::to_string(1 + here.cuda_.size()) + " (CPU and CUDA devices)");
  auto make = [&](const std::vector<uint8_t>& v, const torch::Tensor& like, const std::string& which) {
    if (static_cast<int64_t>(v.size()) != like.numel())
      throw std::invalid_argument("the " + which + " generator state has " + std::to_string(v.size()) +
                                  " bytes, this LibTorch's has " + std::to_string(like.numel()));
    return torch::from_blob(const_cast<uint8_t*>(v.data()), {like.numel()}, torch::kUInt8).clone();
  };
  RngState s;
  s.cpu_ = make(b[0], here.cpu_, "CPU");
  for (size_t i = 0; i < here.cuda_.size(); ++i) s.cuda_.push_back(make(b[i + 1], here.cuda_[i], "CUDA"));
  return s;
}

bool RngState::operator==(const RngState& o) const {
  return differences(o).empty();
}

namespace {
// Two generator states (byte tensors on the CPU, whatever the generator's device) compared byte for
// byte; torch::equal only for a layout that is not plain (it costs a dispatch and a reduction).
bool same_state(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.device().is_cpu() && b.device().is_cpu() && a.scalar_type() == torch::kUInt8 &&
      b.scalar_type() == torch::kUInt8 && a.is_contiguous() && b.is_contiguous())
    return a.numel() == b.numel() &&
           std::memcmp(a.data_ptr<uint8_t>(), b.data_ptr<uint8_t>(), static_cast<size_t>(a.numel())) == 0;
  return a.sizes() == b.sizes() && torch::equal(a, b);
}
}  // namespace

std::string RngState::differences(const RngState& o) const {
  std::string out;
  auto add = [&](const std::string& d) { out += (out.empty() ? "" : ", ") + d; };
  if (!same_state(cpu_, o.cpu_)) add("cpu");
  for (size_t i = 0; i < std::max(cuda_.size(), o.cuda_.size()); ++i)
    if (i >= cuda_.size() || i >= o.cuda_.size() || !same_state(cuda_[i], o.cuda_[i])) add("cuda:" + std::to_string(i));
  for (size_t i = 0; i < std::max(extra_.size(), o.extra_.size()); ++i)
    if (i >= extra_.size() || i >= o.extra_.size() || !same_state(extra_[i].second, o.extra_[i].second))
      add("the calls' generator " + std::to_string(i) + " (SegmentCall::generators)");
  return out;
}

}  // namespace ckv
