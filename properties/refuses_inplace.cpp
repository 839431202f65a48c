// properties/refuses_inplace.cpp: refuses-inplace. When the input of a checkpointed segment is modified
// in place between its forward and its backward, backward fails with an error instead of recomputing
// from the new value (silently wrong gradients).
#include <fmt/format.h>

#include "properties/property.hpp"

namespace ckv {
namespace {
const char* kName = "refuses-inplace";

Finding judge(const Observations& o) {
  const InplaceExperiment& e = o.inplace_exp;
  if (!e.ran) return Finding::not_applicable(kName, e.why_not);
  const std::string where = fmt::format("step 0 micro 0 segment {}", e.segment);
  if (!e.threw)
    return Finding::fail(kName, 0, where,
                         "the segment's input was modified in place (add_(1)) between forward and backward, and "
                         "backward completed without an error: the recompute silently used the new value");
  return Finding::pass(kName, "backward refused: " + e.message);
}
}  // namespace

Property refuses_inplace_property() {
  return {kName, "a checkpointed segment's input modified in place before backward makes backward fail, not recompute",
          judge};
}

}  // namespace ckv
