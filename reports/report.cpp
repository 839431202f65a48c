// reports/report.cpp: the writers (see report.hpp).
#include "reports/report.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace ckv::report {
namespace {

// At most `max` characters of s, each outside printable ASCII shown as '?' (for a value quoted in an error).
std::string printable(const std::string& s, size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) out += c >= 0x20 && c < 0x7f ? c : '?';
  return s.size() > max ? out + "..." : out;
}

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

std::string skipped_note(const PropertyResult& p) {
  return p.skipped_failures ? fmt::format("would have failed on {} case(s)", p.skipped_failures)
                            : std::string("held or did not apply on every case");
}

// "exception-safe (would have failed on 80 case(s)), ..."
std::string skipped_counts(const Report& r) {
  std::string out;
  for (const auto& p : r.properties)
    if (p.skipped)
      out += (out.empty() ? "" : ", ") + p.name +
             (p.skipped_failures ? fmt::format(" (would have failed on {} case(s))", p.skipped_failures) : "");
  return out;
}

// A report's findings: the first, then the further ones.
std::vector<const Failure*> failures_of(const Report& r) {
  std::vector<const Failure*> all;
  if (r.failure) all.push_back(&*r.failure);
  for (const auto& f : r.further) all.push_back(&f);
  return all;
}

// The finding whose own property is `name` (the first or a further one), if any.
const Failure* failure_of(const Report& r, const std::string& name) {
  if (r.failure && r.failure->property == name) return &*r.failure;
  for (const auto& f : r.further)
    if (f.property == name) return &f;
  return nullptr;
}

// One line of at most `max` characters (a diagnosis shown beside another on the console).
std::string sanitize_line(const std::string& s, size_t max) {
  std::string out;
  for (unsigned char ch : s) {
    if (out.size() >= max) return out + "...";
    out += ch >= 0x20 && ch < 0x7f ? static_cast<char>(ch) : ' ';
  }
  return out;
}

// Lines after the first indented by `pad` (a multi-line field under its label).
std::string indented(const std::string& text, const std::string& pad) {
  std::string out;
  for (char ch : text) out += ch == '\n' ? "\n" + pad : std::string(1, ch);
  return out;
}

// Text inside a Markdown code fence: a line of backticks in it would close the fence.
std::string fence_safe(const std::string& text) {
  std::string out = text;
  for (size_t at = 0; (at = out.find("```", at)) != std::string::npos;) out.replace(at, 3, "'''");
  return out;
}

}  // namespace

bool parse_shard(const std::string& text, int& index, int& count) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return false;
  auto number = [](const std::string& digits, int& out) {
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return false;
    out = 0;
    for (char c : digits)
      if ((out = out * 10 + (c - '0')) > kMaxShards) return false;
    return true;
  };
  int k = 0, n = 0;
  if (!number(text.substr(0, slash), k) || !number(text.substr(slash + 1), n) || n < 1 || k < 1 || k > n) return false;
  index = k - 1, count = n;
  return true;
}

std::string to_console(const Report& r) {
  std::string out;
  if (r.failure) {
    const size_t n = 1 + r.further.size();
    auto block = [&](const Failure& f, size_t k, const std::string& note) {
      out += fmt::format("{}FAILED {}{}\n  case:    {}\n  where:   {}\n  detail:  {}\n  seed:    {}\n", k ? "\n" : "",
                         f.property, n > 1 ? fmt::format(" (finding {} of {})", k + 1, n) : "", f.case_line, f.where,
                         f.detail, f.seed);
      if (!f.trace.empty()) out += "  trace:   " + indented(f.trace, "           ") + "\n";
      if (!f.history_note.empty()) out += "  history: " + f.history_note + "\n";
      for (const auto& a : f.also)
        out += fmt::format("  also:    {} failed at {}{}\n", a.property, a.where,
                           a.detail.empty() ? "" : ": " + sanitize_line(a.detail, 160));
      if (!skipped_counts(r).empty())
        out += fmt::format("  skipped: {} (set aside: {})\n", skipped_counts(r), r.skip_reason);
      if (!f.repro.empty()) out += "  repro:   " + f.repro + "\n";
      if (f.passing_before >= 0) {
        // Every case before it ran and passed only in a whole run's first finding; a shard runs every
        // n-th case, and a merged run has a gap where a shard stopped at its time budget.
        const bool gap = r.shard_count == 1 && f.passing_before > r.cases_run;
        out += k == 0 && r.shard_count == 1 && !gap
                   ? fmt::format("  found after {} passing case(s)", f.passing_before)
                   : fmt::format("  found at case {}{}", f.passing_before,
                                 gap ? fmt::format(" (not every case before it ran: case {} did not, its shard "
                                                   "stopped at its time budget)",
                                                   r.cases_run)
                                     : "");
        out += (note.empty() ? "" : ", then " + note) + "\n";
      }
    };
    block(*r.failure, 0, r.shrink_note);
    for (size_t k = 0; k < r.further.size(); ++k) block(r.further[k], k + 1, r.further[k].shrink_note);
  } else if (r.command == "repro") {
    for (const auto& p : r.properties)
      out += p.skipped ? fmt::format("skipped {}: {} ({})\n", p.name, r.skip_reason, skipped_note(p))
                       : fmt::format("{}{}: {}\n", p.not_applicable ? "n/a   " : "held  ", p.name, p.detail);
  } else {
    for (const auto& p : r.properties) {
      if (p.skipped) {
        out += fmt::format("skipped {}: {} ({})\n", p.name, r.skip_reason, skipped_note(p));
        continue;
      }
      const int n = applied(r, p);
      out += fmt::format("{}{} on {}/{} cases{}\n", n > 0 ? "held  " : "NOT RUN ", p.name, p.held, n,
                         p.not_applicable
                             ? fmt::format(" (not applicable on {}, e.g. {})", p.not_applicable, p.not_applicable_why)
                             : "");
    }
    if (r.time_budget_hit)
      out += fmt::format("time budget of {} s reached after {} of {} cases\n", r.time_budget_s, r.cases_run,
                         r.cases_requested);
    if (r.cases_run == 0)
      out += "no case ran within the time budget: nothing was verified\n";
    else if (r.cases_run < (r.min_cases + r.shard_count - 1) / r.shard_count)
      out +=
          fmt::format("only {} case(s) ran, fewer than --min-cases {}{}: too little was verified\n", r.cases_run,
                      r.min_cases, r.shard_count > 1 ? fmt::format(" (this shard's share: 1/{})", r.shard_count) : "");
  }
  if (!r.error.empty()) out += "internal error: " + r.error + "\n";
  if (r.command == "repro")
    out += r.exit_code == 0 ? "PASS\n" : "FAIL\n";
  else
    out +=
        r.time_budget_hit
            ? fmt::format("{}: {} of {} case(s) in {:.1f} s (time budget reached)\n",
                          r.exit_code == 0 ? "PASS" : "FAIL", r.cases_run, r.cases_requested, r.elapsed_s)
            : fmt::format("{}: {} case(s) in {:.1f} s\n", r.exit_code == 0 ? "PASS" : "FAIL", r.cases_run, r.elapsed_s);
  return out;
}

std::string to_json(const Report& r) {
  using nlohmann::json;
  json props = json::array();
  for (const auto& p : r.properties)
    props.push_back({{"property", p.name},
                     {"held", !p.failed && !p.skipped && applied(r, p) > 0},
                     {"failed", p.failed},
                     {"skipped", p.skipped},
                     {"cases_failed_while_skipped", p.skipped_failures},
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
            {"version", r.version},
            {"seed", r.seed},
            {"cases_requested", r.cases_requested},
            {"cases_run", r.cases_run},
            {"time_budget_s", r.time_budget_s},
            {"time_budget_hit", r.time_budget_hit},
            {"elapsed_s", r.elapsed_s},
            {"properties", props},
            {"exit_code", r.exit_code}};
  if (!r.only.empty()) j["only"] = r.only;
  if (!r.skip_reason.empty()) j["skip_reason"] = r.skip_reason;
  if (r.min_cases > 0) j["min_cases"] = r.min_cases;
  if (r.command == "check") {
    j["shard"] = fmt::format("{}/{}", r.shard_index + 1, r.shard_count);
    json outcomes = json::array();
    for (const auto& [i, code] : r.outcomes) outcomes.push_back(json::array({i, code}));
    j["case_outcomes"] = outcomes;
  }
  auto failure_json = [](const Failure& f, const std::string& shrink_note) {
    json also = json::array();
    for (const auto& a : f.also) also.push_back({{"property", a.property}, {"where", a.where}, {"detail", a.detail}});
    json x = {{"property", f.property},           {"where", f.where}, {"detail", f.detail}, {"case_line", f.case_line},
              {"case", json::parse(f.case_json)}, {"repro", f.repro}, {"seed", f.seed},     {"also", also}};
    if (f.passing_before >= 0) x["case_index"] = f.passing_before;
    if (!shrink_note.empty()) x["shrink_note"] = shrink_note;
    if (!f.trace.empty()) x["trace"] = f.trace;
    if (!f.history_note.empty()) x["history_note"] = f.history_note;
    if (!f.history_file.empty()) x["history_file"] = f.history_file;
    return x;
  };
  if (r.failure) j["failure"] = failure_json(*r.failure, r.shrink_note);
  if (r.max_findings > 1) {
    j["max_findings"] = r.max_findings;
    json further = json::array();
    for (const auto& f : r.further) further.push_back(failure_json(f, f.shrink_note));
    j["further_failures"] = further;
  }
  if (!r.error.empty()) j["error"] = r.error;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string to_junit_xml(const Report& r) {
  int failures = 0, skipped = 0;
  for (const auto& p : r.properties) {
    failures += p.failed;
    skipped += p.skipped || (!p.failed && applied(r, p) == 0);
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
    if (p.skipped) {
      out += fmt::format("<skipped message=\"set aside (--skip): {}; {}\"/>", xml_escape(r.skip_reason),
                         xml_escape(skipped_note(p)));
    } else if (const Failure* own = failure_of(r, p.name); p.failed && own) {
      out += fmt::format("\n      <failure message=\"{}\">{}\ncase: {}\nseed: {}\n{}{}</failure>\n    ",
                         xml_escape(own->where), xml_escape(own->detail), xml_escape(own->case_line), own->seed,
                         xml_escape(own->repro),
                         xml_escape((own->history_note.empty() ? "" : "\nhistory: " + own->history_note) +
                                    (own->trace.empty() ? "" : "\n" + own->trace)));
    } else if (p.failed && r.failure) {
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
                       p.skipped           ? "skipped: " + md_cell(r.skip_reason) + " (" + skipped_note(p) + ")"
                       : p.failed          ? "**FAILED**"
                       : applied(r, p) > 0 ? "held"
                       : p.not_applicable  ? "not applicable"
                                           : "not run",
                       p.held, p.not_applicable);
  std::vector<const Failure*> all;
  if (r.failure) all.push_back(&*r.failure);
  for (const auto& f : r.further) all.push_back(&f);
  for (const Failure* fp : all) {
    const Failure& f = *fp;
    out += fmt::format("\n## Failure: {}\n\n- case: `{}`\n- where: `{}`\n- detail: {}\n- seed: {}\n", f.property,
                       f.case_line, md_cell(f.where), md_cell(f.detail), f.seed);
    for (const auto& a : f.also)
      out += fmt::format("- also failed: {} at `{}`{}\n", a.property, md_cell(a.where),
                         a.detail.empty() ? "" : ": " + md_cell(a.detail));
    if (!f.repro.empty()) out += fmt::format("- repro: `{}`\n", f.repro);
    if (!f.history_note.empty()) out += "- history: " + md_cell(f.history_note) + "\n";
    if (!f.trace.empty()) out += "\n```\n" + fence_safe(f.trace) + "\n```\n";
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
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{')
      deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}')
      --depth;
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
    r.version = j.value("version", "");
    r.seed = j.at("seed").get<uint64_t>();
    {
      const json& n = j.at("cases_requested");
      if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > kMaxCases)
        throw std::invalid_argument(fmt::format("\"cases_requested\" out of [1, {}]", kMaxCases));
      r.cases_requested = n.get<int>();
    }
    r.cases_run = j.at("cases_run").get<int>();
    r.time_budget_s = j.at("time_budget_s").get<double>();
    r.time_budget_hit = j.at("time_budget_hit").get<bool>();
    r.elapsed_s = j.at("elapsed_s").get<double>();
    r.exit_code = j.at("exit_code").get<int>();
    r.error = j.value("error", "");
    r.only = j.value("only", "");
    r.skip_reason = j.value("skip_reason", "");
    r.min_cases = j.value("min_cases", 0);
    if (r.min_cases < 0) throw std::invalid_argument("a negative \"min_cases\"");
    for (const auto& p : j.at("properties")) {
      PropertyResult x;
      x.name = p.at("property").get<std::string>();
      x.held = p.at("cases_held").get<int>();
      x.not_applicable = p.at("not_applicable").get<int>();
      x.not_applicable_why = p.at("not_applicable_why").get<std::string>();
      x.where = p.at("where").get<std::string>();
      x.detail = p.at("detail").get<std::string>();
      x.failed = p.value("failed", false);
      x.skipped = p.value("skipped", false);
      x.skipped_failures = p.value("cases_failed_while_skipped", 0);
      if (x.skipped && x.failed) throw std::invalid_argument("property " + x.name + " is both skipped and failed");
      r.properties.push_back(x);
    }
    auto read_failure = [](const json& f) {
      if (!f.is_object()) throw std::invalid_argument("not a ckverify report: a failure that is not an object");
      Failure x;
      x.property = f.at("property").get<std::string>();
      x.where = f.at("where").get<std::string>();
      x.detail = f.at("detail").get<std::string>();
      x.case_line = f.at("case_line").get<std::string>();
      x.case_json = f.at("case").dump(2) + "\n";
      x.repro = f.at("repro").get<std::string>();
      // What check writes: "ckverify repro FILE ..." (after PYTHONPATH=... for a Python implementation); a
      // report whose repro is anything else was not written by ckverify.
      if (!x.repro.empty() && x.repro.find("ckverify repro ") == std::string::npos)
        throw std::invalid_argument(
            fmt::format("a failure's \"repro\" is not a ckverify repro command: \"{}\"", printable(x.repro, 60)));
      x.seed = f.at("seed").get<uint64_t>();
      if (f.contains("case_index")) {
        const json& n = f.at("case_index");
        if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > kMaxCases)
          throw std::invalid_argument(
              fmt::format("a failure's \"case_index\" is not an integer in [0, {}]", kMaxCases));
        x.passing_before = n.get<int>();
      }
      for (const auto& a : f.at("also"))
        x.also.push_back(
            {a.at("property").get<std::string>(), a.at("where").get<std::string>(), a.value("detail", "")});
      x.shrink_note = f.value("shrink_note", "");
      x.trace = f.value("trace", "");
      x.history_note = f.value("history_note", "");
      x.history_file = f.value("history_file", "");
      return x;
    };
    if (j.contains("failure")) {
      r.failure = read_failure(j.at("failure"));
      r.shrink_note = r.failure->shrink_note;
      r.failure->shrink_note.clear();
    }
    r.max_findings = j.value("max_findings", 1);
    if (r.max_findings < 1 || r.max_findings > 100) throw std::invalid_argument("\"max_findings\" out of [1, 100]");
    if (j.contains("further_failures")) {
      if (!j.at("further_failures").is_array())
        throw std::invalid_argument("not a ckverify report: \"further_failures\" is not a list");
      for (const auto& f : j.at("further_failures")) r.further.push_back(read_failure(f));
    }
    if (!r.further.empty() && !r.failure) throw std::invalid_argument("further failures without a first one");
    if (1 + static_cast<int>(r.further.size()) > r.max_findings && r.failure)
      throw std::invalid_argument("more failures than \"max_findings\"");
    {
      std::set<std::string> seen;
      if (r.failure) seen.insert(r.failure->property);
      for (const auto& f : r.further)
        if (!seen.insert(f.property).second) throw std::invalid_argument("two failures of " + f.property);
    }
    if (j.contains("shard")) {
      const std::string s = j.at("shard").get<std::string>();
      if (!parse_shard(s, r.shard_index, r.shard_count))
        throw std::invalid_argument(
            fmt::format("\"shard\": \"{}\" is not K/N with 1 <= K <= N <= {}", printable(s, 40), kMaxShards));
    }
    bool any_skipped = false;
    for (const auto& p : r.properties) any_skipped = any_skipped || p.skipped;
    if (any_skipped != !r.skip_reason.empty())
      throw std::invalid_argument(any_skipped ? "skipped properties without a \"skip_reason\""
                                              : "a \"skip_reason\" with no skipped property");
    if (j.contains("case_outcomes"))
      for (const auto& o : j.at("case_outcomes")) {
        const std::string code = o.at(1).get<std::string>();
        if (code.size() != r.properties.size())
          throw std::invalid_argument("a case outcome does not list every property");
        for (size_t p = 0; p < code.size(); ++p)
          if (std::string(r.properties[p].skipped ? "SX-" : "HNF-").find(code[p]) == std::string::npos)
            throw std::invalid_argument(fmt::format("a case outcome gives {} the letter '{}'", r.properties[p].name,
                                                    code[p] >= 0x20 && code[p] < 0x7f ? code[p] : '?'));
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
  for (const Report& r : shards)  // before anything is sized by the count
    if (r.shard_count < 1 || r.shard_count > kMaxShards || r.shard_index < 0 || r.shard_index >= r.shard_count)
      throw std::invalid_argument(
          fmt::format("shard {}/{} is not K/N with 1 <= K <= N <= {}", r.shard_index + 1, r.shard_count, kMaxShards));
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const Report& r : shards) {
    if (r.command != "check")
      throw std::invalid_argument("only `check` reports merge (got a \"" + r.command + "\" report)");
    auto differs = [&](const char* what, bool d) {
      if (d)
        throw std::invalid_argument(std::string("the reports are not shards of one run: their ") + what + " differ");
    };
    differs("implementations", r.impl != a.impl);
    differs("plans", r.plan != a.plan);
    differs("--only fields", r.only != a.only);
    differs("devices", r.device != a.device);
    differs("LibTorch versions", r.torch != a.torch);
    differs("ckverify versions", r.version != a.version);
    differs("seeds", r.seed != a.seed);
    differs("case counts (--cases)", r.cases_requested != a.cases_requested);
    differs("shard counts", r.shard_count != n);
    differs("property lists", r.properties.size() != a.properties.size());
    for (size_t p = 0; p < r.properties.size(); ++p) {
      differs("property lists", r.properties[p].name != a.properties[p].name);
      differs("skipped properties (--skip)", r.properties[p].skipped != a.properties[p].skipped);
    }
    differs("--skip reasons", r.skip_reason != a.skip_reason);
    differs("--min-cases", r.min_cases != a.min_cases);
    differs("--max-findings", r.max_findings != a.max_findings);
    if (++seen[static_cast<size_t>(r.shard_index)] > 1)
      throw std::invalid_argument(fmt::format("shard {}/{} is given twice", r.shard_index + 1, n));
    if (!r.error.empty())
      throw std::invalid_argument(fmt::format("shard {}/{} ended in an internal error", r.shard_index + 1, n));
    std::set<int> listed;
    for (const auto& [i, code] : r.outcomes) {
      if (i < 0 || i >= r.cases_requested || i % n != r.shard_index)
        throw std::invalid_argument(
            fmt::format("shard {}/{} lists case {}, which is not one of its cases", r.shard_index + 1, n, i));
      if (!listed.insert(i).second)
        throw std::invalid_argument(fmt::format("shard {}/{} lists case {} twice", r.shard_index + 1, n, i));
      // A failed property at case i: a finding that shard reports, made at i, or earlier for that property
      // (after a finding the search goes on with --max-findings, and the property may fail again).
      for (size_t p = 0; p < code.size(); ++p) {
        if (code[p] != 'F') continue;
        bool reported = false;
        for (const Failure* f : failures_of(r))
          reported =
              reported || f->passing_before == i || (f->property == r.properties[p].name && f->passing_before <= i);
        if (!reported)
          throw std::invalid_argument(fmt::format(
              "shard {}/{} lists case {} as failed but does not report that failure", r.shard_index + 1, n, i));
      }
    }
    // The shard's own counts and failures agree with its outcomes (the counts merge recomputes from).
    for (size_t p = 0; p < r.properties.size(); ++p) {
      const PropertyResult& x = r.properties[p];
      int h = 0, na = 0, sf = 0;
      for (const auto& [i, code] : r.outcomes) h += code[p] == 'H', na += code[p] == 'N', sf += code[p] == 'X';
      if (h != x.held || na != x.not_applicable || sf != x.skipped_failures)
        throw std::invalid_argument(
            fmt::format("shard {}/{}: the counts of {} disagree with its case outcomes", r.shard_index + 1, n, x.name));
    }
    for (const Failure* f : failures_of(r)) {
      bool at_its_case = false;
      for (const auto& [i, code] : r.outcomes)
        if (i == f->passing_before)
          for (size_t p = 0; p < code.size(); ++p)
            at_its_case = at_its_case || (r.properties[p].name == f->property && code[p] == 'F');
      if (!at_its_case)
        throw std::invalid_argument(
            fmt::format("shard {}/{} reports a {} failure at case {}, which its outcomes do not show",
                        r.shard_index + 1, n, f->property, f->passing_before));
    }
    if (static_cast<int>(r.outcomes.size()) != r.cases_run)
      throw std::invalid_argument(
          fmt::format("shard {}/{} ran {} case(s) but lists {}", r.shard_index + 1, n, r.cases_run, r.outcomes.size()));
  }
  for (int k = 0; k < n; ++k)
    if (!seen[static_cast<size_t>(k)]) throw std::invalid_argument(fmt::format("shard {}/{} is missing", k + 1, n));

  Report m;
  m.command = "check";
  m.skip_reason = a.skip_reason;
  m.min_cases = a.min_cases;
  m.impl = a.impl, m.plan = a.plan, m.only = a.only, m.device = a.device, m.torch = a.torch, m.seed = a.seed;
  m.version = a.version;
  m.cases_requested = a.cases_requested;
  m.time_budget_s = a.time_budget_s;
  m.max_findings = a.max_findings;
  for (const Report& r : shards) {
    m.time_budget_hit = m.time_budget_hit || r.time_budget_hit;
    m.elapsed_s = std::max(m.elapsed_s, r.elapsed_s);
    m.outcomes.insert(m.outcomes.end(), r.outcomes.begin(), r.outcomes.end());
  }
  std::sort(m.outcomes.begin(), m.outcomes.end());
  // The findings of the unsharded run: per property, the earliest failure any shard found (in case
  // order), the first --max-findings of them. (Where one case fails several properties, the unsharded
  // run finds each at that case, as a shard does.)
  struct Pick {
    const Failure* f;
    const Report* r;
    std::string note;
  };
  std::map<std::string, Pick> earliest;
  for (const Report& r : shards)
    for (const Failure* f : failures_of(r)) {
      auto it = earliest.find(f->property);
      if (it == earliest.end() || f->passing_before < it->second.f->passing_before)
        earliest[f->property] = Pick{f, &r, f == &*r.failure ? r.shrink_note : f->shrink_note};
    }
  std::vector<Pick> picks;
  for (const auto& [name, pick] : earliest) picks.push_back(pick);
  auto order = [&](const std::string& name) {
    for (size_t p = 0; p < a.properties.size(); ++p)
      if (a.properties[p].name == name) return p;
    return a.properties.size();
  };
  std::sort(picks.begin(), picks.end(), [&](const Pick& x, const Pick& y) {
    return x.f->passing_before != y.f->passing_before ? x.f->passing_before < y.f->passing_before
                                                      : order(x.f->property) < order(y.f->property);
  });
  if (static_cast<int>(picks.size()) > m.max_findings) picks.resize(static_cast<size_t>(m.max_findings));
  // The unsharded run: cases 0, 1, 2, ... in order until the case of its last finding (when it found
  // --max-findings of them). A case no shard ran (its shard stopped at the time budget) ends it there,
  // as the budget would have.
  const int last =
      static_cast<int>(picks.size()) == m.max_findings ? picks.back().f->passing_before : a.cases_requested - 1;
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
  // A finding at a case past a gap (a shard that stopped at its budget) is still reported: it is real.
  m.outcomes.resize(static_cast<size_t>(next));
  m.cases_run = static_cast<int>(m.outcomes.size());
  m.properties = a.properties;
  for (size_t p = 0; p < m.properties.size(); ++p) {
    PropertyResult& x = m.properties[p];
    x.held = x.not_applicable = x.skipped_failures = 0;
    x.failed = false, x.where.clear(), x.detail.clear(), x.not_applicable_why.clear();
    for (const auto& [i, code] : m.outcomes)
      x.held += code[p] == 'H', x.not_applicable += code[p] == 'N', x.skipped_failures += code[p] == 'X';
    // The reason of the first case (in case order) to which it did not apply, as the unsharded run reports.
    int first = -1;
    for (const Report& r : shards)
      for (const auto& [i, code] : r.outcomes)
        if (code[p] == 'N') {
          if (first < 0 || i < first) first = i, x.not_applicable_why = r.properties[p].not_applicable_why;
          break;
        }
    if (!picks.empty()) {  // the first finding's shard says which properties failed on its Case
      const PropertyResult& f = picks.front().r->properties[p];
      x.failed = f.failed, x.where = f.where, x.detail = f.detail;
    }
    for (const Pick& k : picks)
      if (k.f->property == x.name) x.failed = true, x.where = k.f->where, x.detail = k.f->detail;
  }
  if (!picks.empty()) {
    m.failure = *picks.front().f;
    m.shrink_note = picks.front().note;
    for (size_t k = 1; k < picks.size(); ++k) {
      m.further.push_back(*picks[k].f);
      m.further.back().shrink_note = picks[k].note;
    }
  }
  m.exit_code = !picks.empty() || m.cases_run == 0 || m.cases_run < m.min_cases ? 1 : 0;
  return m;
}

}  // namespace ckv::report
