// properties/registry.cpp: the registry and the gate for one Case (see property.hpp).
#include "properties/property.hpp"

#include <nlohmann/json.hpp>

namespace ckv {
using nlohmann::json;

Finding Finding::pass(const std::string& property, std::string summary) {
  Finding f;
  f.property = property;
  f.detail = std::move(summary);
  return f;
}
Finding Finding::fail(const std::string& property, int step, std::string where, std::string detail) {
  Finding f;
  f.property = property;
  f.held = false;
  f.step = step;
  f.where = std::move(where);
  f.detail = std::move(detail);
  return f;
}
Finding Finding::not_applicable(const std::string& property, std::string reason) {
  Finding f;
  f.property = property;
  f.applicable = false;
  f.detail = std::move(reason);
  return f;
}

const std::vector<Property>& properties() {
  static const std::vector<Property> v = {
      // Report order, so the first failing property is the headline: side-effect-once (generators left
      // advanced after every recompute) before exception-safe (the same, only after a throwing one).
      rng_replay_property(),
      autocast_replay_property(),
      recompute_count_property(),
      completes_property(),
      refuses_inplace_property(),
      side_effect_once_property(),
      exception_safe_property(),
      resume_property(),
      memory_saved_property(),
      grad_baseline_property(),
      grad_reference_property(),
      // After the gradients: a rank that drew another rank's stream breaks them first.
      parallel_consistency_property(),
      collective_ledger_property(),
  };
  return v;
}

const Property* find_property(const std::string& name) {
  for (const auto& p : properties())
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> property_names() {
  std::vector<std::string> out;
  for (const auto& p : properties()) out.push_back(p.name);
  return out;
}

std::vector<Finding> judge_all(const Observations& o) {
  std::vector<Finding> out;
  for (const auto& p : properties()) {
    Finding f = p.judge(o);
    f.property = p.name;
    out.push_back(std::move(f));
  }
  return out;
}

std::string cause_first(const std::vector<Finding>& findings, const std::string& shrunk_for,
                        const std::set<std::string>& set_aside) {
  // A segment run or recomputed the wrong number of times, or with the wrong arguments, explains what the
  // other properties see (a mask paired with another call, memory kept, an effect twice): it heads.
  const std::string counts = "recompute-count";
  for (const auto& f : findings)
    if (f.property == counts && f.failed() && shrunk_for != counts && !set_aside.count(counts)) return counts;
  for (const auto& f : findings) {
    if (f.property == shrunk_for) break;
    if (f.failed() && !set_aside.count(f.property)) return f.property;
  }
  return shrunk_for;
}

std::string findings_to_line(const std::vector<Finding>& fs) {
  json a = json::array();
  for (const auto& f : fs) {
    a.push_back(
        {{"p", f.property}, {"h", f.held}, {"a", f.applicable}, {"w", f.where}, {"d", f.detail}, {"s", f.step}});
    if (!f.trace.empty()) a.back()["t"] = f.trace;
  }
  return json{{"findings", a}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<Finding> findings_from_line(const std::string& line) {
  const json j = json::parse(line);
  std::vector<Finding> fs;
  for (const auto& f : j.at("findings")) {
    Finding x;
    x.property = f.at("p").get<std::string>();
    x.held = f.at("h").get<bool>();
    x.applicable = f.at("a").get<bool>();
    x.where = f.at("w").get<std::string>();
    x.detail = f.at("d").get<std::string>();
    x.step = f.at("s").get<int>();
    if (f.contains("t")) x.trace = f.at("t").get<std::string>();
    fs.push_back(std::move(x));
  }
  return fs;
}

std::vector<Finding> check_case(const Case& c, CheckpointImpl& impl) {
  return judge_all(observe(c, impl));
}

}  // namespace ckv
