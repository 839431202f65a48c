// reference/config.cpp: enum names for ModelConfig (see config.hpp).
#include "reference/config.hpp"

namespace ckv {
namespace {
template <class E, size_t N>
struct NameTable {
  std::array<std::pair<E, std::string_view>, N> rows;
  std::string_view name(E v) const {
    for (const auto& r : rows)
      if (r.first == v) return r.second;
    return "?";
  }
  bool parse(std::string_view s, E& out) const {
    for (const auto& r : rows)
      if (r.second == s) {
        out = r.first;
        return true;
      }
    return false;
  }
  std::string allowed() const {
    std::string a;
    for (const auto& r : rows) a += (a.empty() ? "" : "|") + std::string(r.second);
    return a;
  }
};

constexpr NameTable<NormKind, 2> kNorm{kNormNames};
constexpr NameTable<NormPlacement, 2> kPlacement{kPlacementNames};
constexpr NameTable<Activation, 4> kAct{kActivationNames};
constexpr NameTable<LossKind, 2> kLoss{kLossNames};
constexpr NameTable<Tie, 3> kTie{kTieNames};
constexpr NameTable<DropoutSite, 4> kSite{{{{DropoutSite::attn_probs, "attn_probs"},
                                            {DropoutSite::attn_out, "attn_out"},
                                            {DropoutSite::ffn_hidden, "ffn_hidden"},
                                            {DropoutSite::ffn_out, "ffn_out"}}}};
}  // namespace

bool ModelConfig::operator==(const ModelConfig& o) const {
  return layers == o.layers && d_model == o.d_model && heads == o.heads && ffn_mult == o.ffn_mult && vocab == o.vocab &&
         norm == o.norm && placement == o.placement && attention == o.attention && causal == o.causal &&
         activation == o.activation && loss == o.loss && tie == o.tie && key_padding == o.key_padding &&
         aux_weight == o.aux_weight && effects == o.effects && segout == o.segout && rand == o.rand;
}

std::string_view to_string(NormKind v) {
  return kNorm.name(v);
}
std::string_view to_string(NormPlacement v) {
  return kPlacement.name(v);
}
std::string_view to_string(Activation v) {
  return kAct.name(v);
}
std::string_view to_string(LossKind v) {
  return kLoss.name(v);
}
std::string_view to_string(Tie v) {
  return kTie.name(v);
}
std::string_view to_string(DropoutSite v) {
  return kSite.name(v);
}
bool parse_enum(std::string_view s, NormKind& out) {
  return kNorm.parse(s, out);
}
bool parse_enum(std::string_view s, NormPlacement& out) {
  return kPlacement.parse(s, out);
}
bool parse_enum(std::string_view s, Activation& out) {
  return kAct.parse(s, out);
}
bool parse_enum(std::string_view s, LossKind& out) {
  return kLoss.parse(s, out);
}
bool parse_enum(std::string_view s, Tie& out) {
  return kTie.parse(s, out);
}
bool parse_enum(std::string_view s, DropoutSite& out) {
  return kSite.parse(s, out);
}
template <>
std::string allowed_names<NormKind>() {
  return kNorm.allowed();
}
template <>
std::string allowed_names<NormPlacement>() {
  return kPlacement.allowed();
}
template <>
std::string allowed_names<Activation>() {
  return kAct.allowed();
}
template <>
std::string allowed_names<LossKind>() {
  return kLoss.allowed();
}
template <>
std::string allowed_names<Tie>() {
  return kTie.allowed();
}
template <>
std::string allowed_names<DropoutSite>() {
  return kSite.allowed();
}

}  // namespace ckv
