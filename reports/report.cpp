// reports/report.cpp: the writers (see report.hpp).
#include "reports/report.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace ckv::report {
namespace {

int applied(const Report& r, const PropertyResult& p) {
  return r.cases_run - p.not_applicable;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  return out;
}

std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

std::string to_console(const Report& r) {
  std::string out;
  if (r.failure) {
    const Failure& f = *r.failure;
    out += fmt::format("FAILED {}\n  case:    {}\n  where:   {}\n  detail:  {}\n  seed:    {}\n", f.property,
                       f.case_line, f.where, f.detail, f.seed);
    for (const auto& [p, w] : f.also) out += fmt::format("  also:    {} failed at {}\n", p, w);
    if (!f.repro.empty()) out += "  repro:   " + f.repro + "\n";
    if (f.passing_before >= 0)
      out += fmt::format("  found after {} passing case(s){}\n", f.passing_before,
                         r.shrink_note.empty() ? "" : ", then " + r.shrink_note);
  } else if (r.command == "repro") {
    for (const auto& p : r.properties)
      out += fmt::format("{}{}: {}\n", p.not_applicable ? "n/a   " : "held  ", p.name, p.detail);
  } else {
    for (const auto& p : r.properties) {
      const int n = applied(r, p);
      out += fmt::format("{}{} on {}/{} cases{}\n", n > 0 ? "held  " : "NOT RUN ", p.name, p.held, n,
                         p.not_applicable
                             ? fmt::format(" (not applicable on {}, e.g. {})", p.not_applicable, p.not_applicable_why)
                             : "");
    }
    if (r.time_budget_hit)
      out += fmt::format("time budget of {} s reached after {} of {} cases\n", r.time_budget_s, r.cases_run,
                         r.cases_requested);
    if (r.cases_run == 0) out += "no case ran within the time budget: nothing was verified\n";
  }
  if (!r.error.empty()) out += "internal error: " + r.error + "\n";
  if (r.command == "repro")
    out += r.exit_code == 0 ? "PASS\n" : "FAIL\n";
  else
    out += fmt::format("{}: {} case(s) in {:.1f} s\n", r.exit_code == 0 ? "PASS" : "FAIL", r.cases_run, r.elapsed_s);
  return out;
}

std::string to_json(const Report& r) {
  using nlohmann::json;
  json props = json::array();
  for (const auto& p : r.properties)
    props.push_back({{"property", p.name},
                     {"held", !p.failed && applied(r, p) > 0},
                     {"failed", p.failed},
                     {"cases_held", p.held},
                     {"not_applicable", p.not_applicable},
                     {"not_applicable_why", p.not_applicable_why},
                     {"where", p.where},
                     {"detail", p.detail}});
  json j = {{"tool", "ckverify"},
            {"command", r.command},
            {"impl", r.impl},
            {"plan", r.plan},
            {"device", r.device},
            {"torch", r.torch},
            {"seed", r.seed},
            {"cases_requested", r.cases_requested},
            {"cases_run", r.cases_run},
            {"time_budget_s", r.time_budget_s},
            {"time_budget_hit", r.time_budget_hit},
            {"elapsed_s", r.elapsed_s},
            {"properties", props},
            {"exit_code", r.exit_code}};
  if (!r.only.empty()) j["only"] = r.only;
  if (r.command == "check") {
    j["shard"] = fmt::format("{}/{}", r.shard_index + 1, r.shard_count);
    json outcomes = json::array();
    for (const auto& [i, code] : r.outcomes) outcomes.push_back(json::array({i, code}));
    j["case_outcomes"] = outcomes;
  }
  if (r.failure) {
    const Failure& f = *r.failure;
    json also = json::array();
    for (const auto& [p, w] : f.also) also.push_back({{"property", p}, {"where", w}});
    j["failure"] = {
        {"property", f.property},           {"where", f.where}, {"detail", f.detail}, {"case_line", f.case_line},
        {"case", json::parse(f.case_json)}, {"repro", f.repro}, {"seed", f.seed},     {"also", also}};
    if (f.passing_before >= 0) j["failure"]["case_index"] = f.passing_before;
    if (!r.shrink_note.empty()) j["failure"]["shrink_note"] = r.shrink_note;
  }
  if (!r.error.empty()) j["error"] = r.error;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string to_junit_xml(const Report& r) {
  int failures = 0, skipped = 0;
  for (const auto& p : r.properties) {
    failures += p.failed;
    skipped += !p.failed && applied(r, p) == 0;
  }
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format(
      "<testsuites>\n  <testsuite name=\"ckverify {} impl={}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" "
      "skipped=\"{}\" time=\"{:.3f}\">\n",
      xml_escape(r.command), xml_escape(r.impl), r.properties.size(), failures, r.error.empty() ? 0 : 1, skipped,
      r.elapsed_s);
  out += fmt::format(
      "    <properties><property name=\"seed\" value=\"{}\"/><property name=\"plan\" value=\"{}\"/>"
      "<property name=\"cases_run\" value=\"{}\"/><property name=\"torch\" value=\"{}\"/></properties>\n",
      r.seed, xml_escape(r.plan), r.cases_run, xml_escape(r.torch));
  for (const auto& p : r.properties) {
    out += fmt::format("    <testcase classname=\"ckverify.{}\" name=\"{}\">", xml_escape(r.impl), xml_escape(p.name));
    if (p.failed && r.failure) {
      out += fmt::format("\n      <failure message=\"{}\">{}\ncase: {}\nseed: {}\n{}</failure>\n    ",
                         xml_escape(p.where), xml_escape(p.detail), xml_escape(r.failure->case_line), r.failure->seed,
                         xml_escape(r.failure->repro));
    } else if (p.failed) {
      out +=
          fmt::format("\n      <failure message=\"{}\">{}</failure>\n    ", xml_escape(p.where), xml_escape(p.detail));
    } else if (applied(r, p) == 0) {
      out += "<skipped message=\"not applicable to any case that ran\"/>";
    }
    out += "</testcase>\n";
  }
  if (!r.error.empty())
    out += fmt::format("    <testcase classname=\"ckverify\" name=\"run\"><error message=\"{}\"/></testcase>\n",
                       xml_escape(r.error));
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

std::string to_markdown(const Report& r) {
  std::string out = fmt::format("# ckverify {}: {}\n\n", r.command, r.exit_code == 0 ? "PASS" : "FAIL");
  out += fmt::format("impl `{}`, plan `{}`, device `{}`, seed {}, LibTorch {}; {} of {} case(s) in {:.1f} s{}\n\n",
                     r.impl, r.plan, r.device, r.seed, r.torch, r.cases_run, r.cases_requested, r.elapsed_s,
                     r.time_budget_hit ? " (time budget reached)" : "");
  out += "| property | result | cases held | not applicable |\n|---|---|---|---|\n";
  for (const auto& p : r.properties)
    out += fmt::format("| {} | {} | {} | {} |\n", p.name,
                       p.failed            ? "**FAILED**"
                       : applied(r, p) > 0 ? "held"
                       : p.not_applicable  ? "not applicable"
                                           : "not run",
                       p.held, p.not_applicable);
  if (r.failure) {
    const Failure& f = *r.failure;
    out += fmt::format("\n## Failure: {}\n\n- case: `{}`\n- where: `{}`\n- detail: {}\n- seed: {}\n", f.property,
                       f.case_line, md_cell(f.where), md_cell(f.detail), f.seed);
    for (const auto& [p, w] : f.also) out += fmt::format("- also failed: {} at `{}`\n", p, w);
    if (!f.repro.empty()) out += fmt::format("- repro: `{}`\n", f.repro);
  }
  if (!r.error.empty()) out += "\nInternal error: " + r.error + "\n";
  return out;
}

}  // namespace ckv::report

namespace ckv::report {

Report from_json(const std::string& text) {
  using nlohmann::json;
  // Bounded nesting: a report is four levels deep; refuse anything deeper before the parser recurses.
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}') --depth;
    if (deepest > 16) throw std::invalid_argument("not a ckverify report: JSON nested deeper than 16 levels");
  }
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) throw std::invalid_argument("not a ckverify report: malformed JSON");
  try {
    if (!j.is_object() || j.value("tool", "") != "ckverify")
      throw std::invalid_argument("not a ckverify report (no \"tool\": \"ckverify\")");
    Report r;
    r.command = j.at("command").get<std::string>();
    r.impl = j.at("impl").get<std::string>();
    r.plan = j.at("plan").get<std::string>();
    r.device = j.at("device").get<std::string>();
    r.torch = j.at("torch").get<std::string>();
    r.seed = j.at("seed").get<uint64_t>();
    r.cases_requested = j.at("cases_requested").get<int>();
    r.cases_run = j.at("cases_run").get<int>();
    r.time_budget_s = j.at("time_budget_s").get<double>();
    r.time_budget_hit = j.at("time_budget_hit").get<bool>();
    r.elapsed_s = j.at("elapsed_s").get<double>();
    r.exit_code = j.at("exit_code").get<int>();
    r.error = j.value("error", "");
    r.only = j.value("only", "");
    for (const auto& p : j.at("properties")) {
      PropertyResult x;
      x.name = p.at("property").get<std::string>();
      x.held = p.at("cases_held").get<int>();
      x.not_applicable = p.at("not_applicable").get<int>();
      x.not_applicable_why = p.at("not_applicable_why").get<std::string>();
      x.where = p.at("where").get<std::string>();
      x.detail = p.at("detail").get<std::string>();
      x.failed = p.value("failed", false);
      r.properties.push_back(x);
    }
    if (j.contains("failure")) {
      const json& f = j.at("failure");
      Failure x;
      x.property = f.at("property").get<std::string>();
      x.where = f.at("where").get<std::string>();
      x.detail = f.at("detail").get<std::string>();
      x.case_line = f.at("case_line").get<std::string>();
      x.case_json = f.at("case").dump(2) + "\n";
      x.repro = f.at("repro").get<std::string>();
      x.seed = f.at("seed").get<uint64_t>();
      x.passing_before = f.value("case_index", -1);
      for (const auto& a : f.at("also")) x.also.emplace_back(a.at("property"), a.at("where"));
      r.shrink_note = f.value("shrink_note", "");
      r.failure = x;
    }
    if (j.contains("shard")) {
      const std::string s = j.at("shard").get<std::string>();
      int k = 0, n = 0;
      char tail = 0;
      if (std::sscanf(s.c_str(), "%d/%d%c", &k, &n, &tail) != 2 || n < 1 || k < 1 || k > n)
        throw std::invalid_argument("bad \"shard\" value");
      r.shard_index = k - 1, r.shard_count = n;
    }
    if (j.contains("case_outcomes"))
      for (const auto& o : j.at("case_outcomes")) {
        const std::string code = o.at(1).get<std::string>();
        if (code.size() != r.properties.size()) throw std::invalid_argument("a case outcome does not list every property");
        r.outcomes.emplace_back(o.at(0).get<int>(), code);
      }
    return r;
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    for (char& c : what)
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    throw std::invalid_argument("not a ckverify report: " + what);
  }
}

Report merge(const std::vector<Report>& shards) {
  if (shards.empty()) throw std::invalid_argument("nothing to merge");
  const Report& a = shards.front();
  const int n = a.shard_count;
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const Report& r : shards) {
    if (r.command != "check") throw std::invalid_argument("only `check` reports merge (got a \"" + r.command + "\" report)");
    auto differs = [&](const char* what, bool d) {
      if (d) throw std::invalid_argument(std::string("the reports are not shards of one run: their ") + what + " differ");
    };
    differs("implementations", r.impl != a.impl);
    differs("plans", r.plan != a.plan);
    differs("--only fields", r.only != a.only);
    differs("devices", r.device != a.device);
    differs("LibTorch versions", r.torch != a.torch);
    differs("seeds", r.seed != a.seed);
    differs("case counts (--cases)", r.cases_requested != a.cases_requested);
    differs("shard counts", r.shard_count != n);
    differs("property lists", r.properties.size() != a.properties.size());
    for (size_t p = 0; p < r.properties.size(); ++p) differs("property lists", r.properties[p].name != a.properties[p].name);
    if (++seen[static_cast<size_t>(r.shard_index)] > 1)
      throw std::invalid_argument(fmt::format("shard {}/{} is given twice", r.shard_index + 1, n));
    if (!r.error.empty()) throw std::invalid_argument(fmt::format("shard {}/{} ended in an internal error", r.shard_index + 1, n));
    for (const auto& [i, code] : r.outcomes)
      if (i < 0 || i >= r.cases_requested || i % n != r.shard_index)
        throw std::invalid_argument(
            fmt::format("shard {}/{} lists case {}, which is not one of its cases", r.shard_index + 1, n, i));
  }
  for (int k = 0; k < n; ++k)
    if (!seen[static_cast<size_t>(k)]) throw std::invalid_argument(fmt::format("shard {}/{} is missing", k + 1, n));

  Report m;
  m.command = "check";
  m.impl = a.impl, m.plan = a.plan, m.only = a.only, m.device = a.device, m.torch = a.torch, m.seed = a.seed;
  m.cases_requested = a.cases_requested;
  m.time_budget_s = a.time_budget_s;
  const Report* failing = nullptr;
  for (const Report& r : shards) {
    m.time_budget_hit = m.time_budget_hit || r.time_budget_hit;
    m.elapsed_s = std::max(m.elapsed_s, r.elapsed_s);
    if (r.failure && (!failing || r.failure->passing_before < failing->failure->passing_before)) failing = &r;
    m.outcomes.insert(m.outcomes.end(), r.outcomes.begin(), r.outcomes.end());
  }
  std::sort(m.outcomes.begin(), m.outcomes.end());
  // The unsharded run: cases 0, 1, 2, ... in order until the first failing one. A case no shard ran (its
  // shard stopped at the time budget) ends it there, as the budget would have.
  const int last = failing ? failing->failure->passing_before : a.cases_requested - 1;
  int next = 0;
  for (const auto& o : m.outcomes) {
    if (o.first != next || next > last) break;
    ++next;
  }
  if (next <= last) {
    m.time_budget_hit = true;
    for (const Report& r : shards)
      if (r.time_budget_hit) m.time_budget_s = r.time_budget_s;
  }
  m.outcomes.resize(static_cast<size_t>(next));
  m.cases_run = static_cast<int>(m.outcomes.size());
  m.properties = a.properties;
  for (size_t p = 0; p < m.properties.size(); ++p) {
    PropertyResult& x = m.properties[p];
    x.held = x.not_applicable = 0;
    x.failed = false, x.where.clear(), x.detail.clear(), x.not_applicable_why.clear();
    for (const auto& [i, code] : m.outcomes) x.held += code[p] == 'H', x.not_applicable += code[p] == 'N';
    // The reason of the first case (in case order) to which it did not apply, as the unsharded run reports.
    int first = -1;
    for (const Report& r : shards)
      for (const auto& [i, code] : r.outcomes)
        if (code[p] == 'N') {
          if (first < 0 || i < first) first = i, x.not_applicable_why = r.properties[p].not_applicable_why;
          break;
        }
    if (failing) {
      const PropertyResult& f = failing->properties[p];
      x.failed = f.failed, x.where = f.where, x.detail = f.detail;
    }
  }
  if (failing) {
    m.failure = failing->failure;
    m.shrink_note = failing->shrink_note;
  }
  m.exit_code = failing || m.cases_run == 0 ? 1 : 0;
  return m;
}

}  // namespace ckv::report
