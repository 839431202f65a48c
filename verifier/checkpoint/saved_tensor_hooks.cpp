// verifier/checkpoint/saved_tensor_hooks.cpp: see saved_tensor_hooks.hpp.
#include "verifier/checkpoint/saved_tensor_hooks.hpp"

#include <torch/csrc/autograd/engine.h>

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
  static torch::autograd::Engine& get() {
    static HooksEngine engine;
    return engine;
  }
  ~HooksEngine() override { stop(); }
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    const auto& stack = factories();
    if (stack.empty()) return nullptr;
    return (*stack.back())();
  }
};

}  // namespace

bool saved_tensor_hooks_active() {
  return !factories().empty();
}

void install_saved_tensor_hooks_engine() {
  static std::once_flag once;
  std::call_once(once, [] { torch::autograd::set_default_engine_stub(&HooksEngine::get); });
}

SavedTensorHooksScope::SavedTensorHooksScope(SavedTensorHooksFactory factory) : factory_(std::move(factory)) {
  install_saved_tensor_hooks_engine();
  if (&torch::autograd::Engine::get_default_engine() != &HooksEngine::get())
    throw std::runtime_error(
        "ckverify checkpoint: another autograd engine (torch's Python module?) replaced ckverify's in this process, "
        "so saved-tensor hooks cannot be installed; use torch.utils.checkpoint from Python instead");
  factories().push_back(&factory_);
}

SavedTensorHooksScope::~SavedTensorHooksScope() {
  factories().pop_back();
}

}  // namespace ckv
