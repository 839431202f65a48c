// verifier/checkpoint/saved_tensor_hooks.cpp: see saved_tensor_hooks.hpp.
#include "verifier/checkpoint/saved_tensor_hooks.hpp"

#include <torch/csrc/autograd/engine.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace ckv {
namespace {

std::vector<const SavedTensorHooksFactory*>& factories() {
  thread_local std::vector<const SavedTensorHooksFactory*> stack;
  return stack;
}

struct HooksEngine : torch::autograd::Engine {
  static HooksEngine& get() {
    static HooksEngine engine;
    return engine;
  }
  static torch::autograd::Engine& stub() { return get(); }
  ~HooksEngine() override { stop(); }
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    const auto& stack = factories();
    if (!stack.empty()) return (*stack.back())();
    // No scope of ours: the engine we replaced answers (Python's engine answers from
    // torch.autograd.graph.saved_tensors_hooks, which torch.utils.checkpoint relies on).
    torch::autograd::Engine* before = previous.load();
    return before ? before->get_default_saved_variable_hooks() : nullptr;
  }
  // An exception thrown in a node goes to the engine we replaced too: Python's engine keeps a Python
  // exception's message there (a checkpoint function raising in its recompute), which the base engine
  // would lose. LibTorch changed the signature (1.13 takes the task by value): one of these two
  // overrides it, the other is an unused overload.
  void thread_on_exception(std::shared_ptr<torch::autograd::GraphTask> task,
                           const std::shared_ptr<torch::autograd::Node>& fn, std::exception& e) {
    on_exception(task, fn, e);
  }
  void thread_on_exception(const std::shared_ptr<torch::autograd::GraphTask>& task,
                           const std::shared_ptr<torch::autograd::Node>& fn, std::exception& e) {
    on_exception(task, fn, e);
  }
  void on_exception(const std::shared_ptr<torch::autograd::GraphTask>& task,
                    const std::shared_ptr<torch::autograd::Node>& fn, std::exception& e) {
    torch::autograd::Engine* before = previous.load();
    if (before)
      before->thread_on_exception(task, fn, e);
    else
      torch::autograd::Engine::thread_on_exception(task, fn, e);
  }
  std::atomic<torch::autograd::Engine*> previous{nullptr};
};

}  // namespace

bool saved_tensor_hooks_active() {
  return !factories().empty();
}

void install_saved_tensor_hooks_engine() {
  // Ours goes on top of whatever engine is the default now, and again whenever another one (torch's
  // Python module, imported later) replaced it: each keeps the one before it for the hooks it has.
  static std::mutex mutex;
  HooksEngine& ours = HooksEngine::get();
  if (&torch::autograd::Engine::get_default_engine() == &ours) return;
  std::lock_guard<std::mutex> lock(mutex);
  torch::autograd::Engine& current = torch::autograd::Engine::get_default_engine();
  if (&current == &ours) return;
  ours.previous.store(&current);
  torch::autograd::set_default_engine_stub(&HooksEngine::stub);
}

SavedTensorHooksScope::SavedTensorHooksScope(SavedTensorHooksFactory factory) : factory_(std::move(factory)) {
  install_saved_tensor_hooks_engine();
  factories().push_back(&factory_);
}

SavedTensorHooksScope::~SavedTensorHooksScope() {
  factories().pop_back();
}

}  // namespace ckv
