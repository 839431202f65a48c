// verifier/dist/rng_tracker.cpp: see rng_tracker.hpp.
#include "verifier/dist/rng_tracker.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

namespace ckv::dist {
namespace {
at::Generator cpu_default() {
  return at::detail::getDefaultCPUGenerator();
}
torch::Tensor state_of(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void set_state(at::Generator g, const torch::Tensor& s) {
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
}
}  // namespace

void RngTracker::add(const std::string& name, uint64_t seed) {
  if (streams_.count(name)) throw std::invalid_argument("RngTracker: stream " + name + " exists");
  streams_.emplace(name, Stream{at::detail::createCPUGenerator(seed)});
}

RngTracker::Fork RngTracker::fork(const std::string& name) {
  const auto it = streams_.find(name);
  if (it == streams_.end()) throw std::invalid_argument("RngTracker: no stream named " + name);
  if (*it->second.forked) throw std::logic_error("RngTracker: stream " + name + " is already forked");
  return Fork(it->second.generator, it->second.forked.get());
}

RngTracker::Fork::Fork(at::Generator stream, bool* forked)
    : stream_(std::move(stream)), saved_default_(state_of(cpu_default())), forked_(forked) {
  set_state(cpu_default(), state_of(stream_));
  *forked_ = true;
}
RngTracker::Fork::Fork(Fork&& o) noexcept
    : stream_(std::move(o.stream_)), saved_default_(std::move(o.saved_default_)), forked_(o.forked_) {
  o.forked_ = nullptr;
}
RngTracker::Fork::~Fork() {
  if (!forked_) return;  // moved from
  set_state(stream_, state_of(cpu_default()));
  set_state(cpu_default(), saved_default_);
  *forked_ = false;
}

std::vector<at::Generator> RngTracker::generators() const {
  std::vector<at::Generator> out;
  for (const auto& [name, s] : streams_) out.push_back(s.generator);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> RngTracker::states() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, s] : streams_) {
    if (*s.forked) throw std::logic_error("RngTracker: stream " + name + " is forked; its state is the default's");
    out.emplace_back(name, state_of(s.generator));
  }
  return out;
}

void RngTracker::set_states(const std::vector<std::pair<std::string, torch::Tensor>>& saved) {
  std::vector<std::string> ours, theirs;
  for (const auto& [name, s] : streams_) ours.push_back(name);
  for (const auto& [name, state] : saved) theirs.push_back(name);
  if (ours != theirs) {
    auto list = [](const std::vector<std::string>& names) {
      std::string out;
      for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
      return "[" + out + "]";
    };
    throw std::invalid_argument("RngTracker: the saved states are of streams " + list(theirs) + ", this tracker has " +
                                list(ours));
  }
  for (const auto& [name, s] : streams_)
    if (*s.forked) throw std::logic_error("RngTracker: stream " + name + " is forked");
  // Every state is tried on a scratch generator first: a bad one changes nothing.
  for (const auto& [name, state] : saved) {
    try {
      set_state(at::detail::createCPUGenerator(0), state);
    } catch (const std::exception& e) {
      throw std::invalid_argument("RngTracker: the saved state of stream " + name + " is not a CPU generator state (" +
                                  std::string(e.what()).substr(0, 200) + ")");
    }
  }
  for (const auto& [name, state] : saved) set_state(streams_.at(name).generator, state);
}

}  // namespace ckv::dist
