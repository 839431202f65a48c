// verifier/checkpoint/saved_tensor_hooks.hpp: saved-tensor hooks for LibTorch C++, the mechanism
// behind torch.autograd.graph.saved_tensors_hooks (which Python has and C++ lacks). Inside a
// SavedTensorHooksScope, every tensor autograd saves for backward is handed to a hooks object made by
// the scope's factory (pack), and is asked back from it when backward needs it (unpack). The
// checkpoint (checkpoint.hpp) packs nothing and unpacks by recomputing.
//
// How: autograd asks the default engine for the default saved-variable hooks whenever it saves a tensor
// (SavedVariable's constructor). The base engine answers "none"; Python's engine answers from Python's
// hook stack. install() makes an engine of ours the default: it answers from a thread-local stack of
// factories, and with the stack empty it asks the engine it replaced (so torch's Python hooks, and with
// them torch.utils.checkpoint, keep working in a process that runs both); otherwise it behaves exactly
// like the base engine. When torch's Python module is imported later and installs Python's engine, the
// next scope puts ours back on top of it.
#pragma once

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <functional>
#include <memory>

namespace ckv {

using SavedTensorHooksFactory = std::function<std::unique_ptr<torch::autograd::SavedVariableHooks>()>;

class SavedTensorHooksScope {
 public:
  explicit SavedTensorHooksScope(SavedTensorHooksFactory factory);
  ~SavedTensorHooksScope();
  SavedTensorHooksScope(const SavedTensorHooksScope&) = delete;
  SavedTensorHooksScope& operator=(const SavedTensorHooksScope&) = delete;

 private:
  SavedTensorHooksFactory factory_;
};

// True while a SavedTensorHooksScope is open on this thread.
bool saved_tensor_hooks_active();

// Makes ckverify's engine the process's default autograd engine (idempotent). Called by the first
// scope; exposed so a program can do it before its first backward.
void install_saved_tensor_hooks_engine();

}  // namespace ckv
