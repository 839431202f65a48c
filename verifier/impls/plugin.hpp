// ckverify/plugin.hpp (installed; in the source tree verifier/impls/plugin.hpp): everything a C++
// checkpoint implementation needs to be gated by ckverify as a plugin, without patching or rebuilding
// ckverify.
//
//   #include <ckverify/plugin.hpp>
//   class Mine : public ckv::CheckpointImpl {
//     std::vector<torch::Tensor> run(const ckv::SegmentCall& call) override { ... }
//   };
//   CKVERIFY_PLUGIN([](const ckv::PluginOptions& o) { return new Mine(o); })
//
// build it with find_package(ckverify) and ckverify_add_plugin(mine mine.cpp), and gate it with
// `ckverify check --impl ./libmine.so[:key=value,...]`.
//
// The interface (interface.hpp): run() gets a SegmentCall: the segment function, its positional
// arguments (several tensors, ints, doubles, bools, None), the parameters it reads, the segment's index
// in the plan, the optimizer step, the micro-batch, and the generators it draws from besides the devices'
// default ones (a model-parallel tracker's streams: replay them as the defaults); begin_step()/end_step()
// mark step boundaries.
// Lifetime: call.fn and every tensor in call.args stay valid until end_step(call.step) returns; the
// implementation may copy fn and call it again from any thread until then (that is what a recompute
// does). Modules with side effects learn about recomputes through SegmentScope (segment_scope.hpp): wrap
// the first forward in SegmentScope(state, false) and each recompute in SegmentScope(state, true), one
// SegmentState per call; an implementation that does not will replay their effects, and ckverify's
// side-effect-once property says so.
//
// ckverify loads the plugin with dlopen and checks its stamp first: the interface version and the
// LibTorch version (major.minor) and C++ ABI it was built against must match ckverify's own, else the
// load fails with one line naming the difference (exit 2). The plugin resolves ckverify's functions
// (SegmentScope, ckv::checkpoint) from the ckverify executable that loads it, so there is one recompute
// flag per thread, shared with the modules of the Case.
#pragma once

#include <torch/version.h>

#include <map>
#include <string>

#include "verifier/impls/interface.hpp"

namespace ckv {

// key=value pairs from the --impl spec ("./libmine.so:eager=true,chunks=4"); values are the text given.
using PluginOptions = std::map<std::string, std::string>;

}  // namespace ckv

extern "C" {
struct ckverify_plugin_stamp {
  int interface_version;
  int torch_major, torch_minor;
  int cxx11_abi;
};
}

#define CKVERIFY_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

// Defines the plugin's two entry points: its stamp and its factory `make` (a callable taking
// const ckv::PluginOptions& and returning a new ckv::CheckpointImpl*; it may throw
// std::invalid_argument for an option it does not accept, which ckverify reports as bad usage).
#define CKVERIFY_PLUGIN(make)                                                                                        \
  CKVERIFY_PLUGIN_EXPORT const ckverify_plugin_stamp* ckverify_plugin_stamp_v1() {                                   \
    static const ckverify_plugin_stamp stamp{::ckv::kImplInterfaceVersion, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, \
                                             _GLIBCXX_USE_CXX11_ABI};                                                \
    return &stamp;                                                                                                   \
  }                                                                                                                  \
  CKVERIFY_PLUGIN_EXPORT ::ckv::CheckpointImpl* ckverify_plugin_create(const ::ckv::PluginOptions& options) {        \
    return (make)(options);                                                                                          \
  }
