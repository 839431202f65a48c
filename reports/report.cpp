// reports/report.cpp: the writers (see report.hpp).
#include "reports/report.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

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
  if (r.failure) {
    const Failure& f = *r.failure;
    json also = json::array();
    for (const auto& [p, w] : f.also) also.push_back({{"property", p}, {"where", w}});
    j["failure"] = {
        {"property", f.property},           {"where", f.where}, {"detail", f.detail}, {"case_line", f.case_line},
        {"case", json::parse(f.case_json)}, {"repro", f.repro}, {"seed", f.seed},     {"also", also}};
  }
  if (!r.error.empty()) j["error"] = r.error;
  return j.dump(2) + "\n";
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
