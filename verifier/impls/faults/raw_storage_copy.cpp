// verifier/impls/faults/raw_storage_copy.cpp: keeps its own copy of every tensor input and recomputes
// from it, but copies the way hand-written offloading code that memcpy's a tensor's buffer does: numel
// elements from the start of the storage, as if the tensor were contiguous at offset 0. Right for every
// contiguous input at offset 0; a view (a slice of a larger buffer, a transpose) is recomputed from other
// values, and the gradients are those of a forward that never ran.
#include "verifier/impls/faults/faults.hpp"
#include "verifier/impls/faults/frame_impl.hpp"

namespace ckv::faults {
namespace {
torch::Tensor raw_copy(const torch::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return t;
  const int64_t elements = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
  if (elements < t.numel()) return t.detach().clone();  // an expanded tensor: the storage is smaller
  void* start = const_cast<void*>(t.storage().data());
  return torch::from_blob(start, {t.numel()}, t.options()).clone().view(t.sizes());
}

class RawStorageCopyImpl : public CheckpointImpl {
 public:
  std::vector<torch::Tensor> run(const SegmentCall& call) override {
    auto copies = std::make_shared<std::vector<c10::IValue>>(call.args);
    for (auto& a : *copies)
      if (a.isTensor()) a = raw_copy(a.toTensor());
    auto calls = std::make_shared<int>(0);
    SegmentFunction fn = [inner = call.fn, copies, calls](const std::vector<c10::IValue>& args) {
      if ((*calls)++ == 0) return inner(args);  // the forward, on the inputs themselves
      std::vector<c10::IValue> own = args;
      for (size_t i = 0; i < own.size() && i < copies->size(); ++i)
        if (own[i].isTensor() && (*copies)[i].isTensor() && own[i].toTensor().defined())
          own[i] = (*copies)[i].toTensor().detach().requires_grad_(own[i].toTensor().requires_grad());
      return inner(own);
    };
    return checkpoint_detail::checkpoint_with<checkpoint_detail::RecomputeFrame>(fn, call.args, full_recompute());
  }
};
}  // namespace
ImplEntry raw_storage_copy() {
  return {{"raw-storage-copy", "recomputes from copies of its inputs read from the storage as if contiguous",
           "grad-baseline", "segin=view"},
          [] { return std::make_unique<RawStorageCopyImpl>(); }};
}
}  // namespace ckv::faults
