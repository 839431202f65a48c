// verifier/cli/cmd_audit_amp.cpp: see cmd_audit_amp.hpp.
#include "verifier/cli/cmd_audit_amp.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "properties/generators.hpp"
#include "reports/plot.hpp"
#include "verifier/case/environment_error.hpp"
#include "verifier/cli/args.hpp"
#include "verifier/cli/bench_report.hpp"
#include "verifier/cli/search.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/run/amp_audit.hpp"

namespace ckv::cli {

CLI::App* add_audit_amp(CLI::App& app, AuditAmpArgs& a) {
  CLI::App* audit = app.add_subcommand(
      "audit-amp",
      "Audit AMP drift: per precision (fp32, bf16, fp16) with and without checkpointing, every parameter "
      "group's gradient error against fp64, and the drift checkpointing adds, against the larger of a measured "
      "noise floor and twice the drift of correct reentrant checkpoints (the design floor). Exit 1 when the drift "
      "exceeds it.");
  audit->add_option("case", a.case_path, "Case JSON file (default: generated fp32 Cases)");
  audit->add_option("--impl", a.impl, "Implementation under test (default: the Case's, or builtin)");
  audit->add_option("--plan", a.plan, "Checkpoint plan (default: the Case's; block when it has none)");
  audit->add_option("--cases", a.cases, "Generated Cases when no Case file is given")
      ->capture_default_str()
      ->each([&a](const std::string&) { a.cases_given = true; });
  audit->add_option("--seed", a.seed_text, "Seed for generated Cases, in [0, 2^64)")->capture_default_str();
  add_file(audit, "--json", a.json, "Write the audit as JSON to this file");
  add_file(audit, "--plot", a.plot, "Write the per-group error plot (PNG, through gnuplot) to this file");
  audit->add_option("--device", a.device, "Device: cpu, cuda or cuda:N")->capture_default_str();
  add_stall_timeout(audit, a.stall_timeout);
  return audit;
}

void finish_audit_amp(AuditAmpArgs& a) {
  check_stall_timeout(a.stall_timeout);
  a.seed = parse_seed(a.seed_text);
  check_count("--cases", a.cases, 1, kMaxRunEveryCase);
}

int run_audit_amp(const AuditAmpArgs& a) {
  using nlohmann::json;
  const std::string &path = a.case_path, &impl_name = a.impl, &plan_text = a.plan;
  const std::string& device = a.device;
  const FileArg &json_path = a.json, &plot_path = a.plot;
  const int cases = a.cases;
  const bool cases_given = a.cases_given;
  const uint64_t seed = a.seed;
  check_outputs({{"--json", json_path}, {"--plot", plot_path}}, {{"the case file", path}});
  std::string lower = plot_path.given;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (!plot_path.empty() && (lower.size() < 4 || lower.compare(lower.size() - 4, 4, ".png") != 0))
    throw UsageError("--plot must name a .png file");
  if (!plot_path.empty() && !report::gnuplot_available())
    throw EnvironmentError("--plot needs gnuplot (apt-get install gnuplot-nox), which is not on PATH");
  if (!path.empty() && cases_given) throw UsageError("--cases generates Cases: give it or a Case file, not both");
  check_device(device);
  std::vector<Case> todo;
  CaseGenOptions gen;
  gen.allow_autocast = false;  // the audit runs every precision itself
  // Every block trainable (a frozen stack has no parameter gradient to audit), and no side-effecting
  // modules: a replayed effect is side-effect-once's finding, not AMP drift.
  gen.only = "freeze=none fx=none";
  gen.impl = impl_name.empty() ? "builtin" : absolute_impl_spec(impl_name);
  gen.device = device;
  if (!plan_text.empty()) {
    const Plan p = parse_plan("--plan", plan_text);
    if (p.kind == PlanKind::none)
      throw UsageError(
          "--plan none: audit-amp compares runs with and without checkpointing; give a plan that "
          "checkpoints something");
    gen.plan = p;
  }
  if (!path.empty()) {
    todo.push_back(load_case_argument(path));
    todo.back().impl = absolute_impl_spec(impl_name.empty() ? todo.back().impl : impl_name);
    if (gen.plan) todo.back().plan = *gen.plan;
  } else {
    const rc::Gen<Case> g = gen_case(gen);
    for (int i = 0; i < cases; ++i) todo.push_back(generate(g, seed, i).value());
  }
  const std::string impl = todo.front().impl;
  check_impl_spec(impl);
  // Per (precision, checkpointed, group): the row of the case where it is worst (checkpointed rows by
  // drift/allowed, then drift; the others by rel-L2), and that case's line.
  struct Worst {
    AmpRow row;
    std::string case_line;
  };
  auto badness = [](const AmpRow& r) {
    if (!r.checkpointed) return std::make_pair(r.rel_l2, 0.0);
    const double ratio = r.drift == 0.0     ? 0.0
                         : r.allowed == 0.0 ? std::numeric_limits<double>::infinity()
                                            : r.drift / r.allowed;
    return std::make_pair(ratio, r.drift);
  };
  std::map<std::tuple<std::string, bool, std::string>, Worst> worst;
  std::vector<std::string> exceeded, skipped, failed;
  std::map<std::string, double> loss_error;
  // Why a design floor is missing, with the cases it was missing in (one line per reason, not per case).
  std::map<std::string, std::vector<std::string>> design_notes;
  std::string plan_name, case_line;
  int threads_a = 1, threads_b = 2;
  for (const Case& c : todo) {
    validate(c);
    const auto im = make_impl(c.impl);
    const AmpAudit a = audit_amp(c, *im);
    plan_name = todo.size() == 1 ? a.plan : "plan", case_line = a.case_line, skipped = a.skipped;
    threads_a = a.threads_a, threads_b = a.threads_b;
    for (const AmpRow& r : a.rows) {
      const auto [it, fresh] = worst.try_emplace({r.precision, r.checkpointed, r.group}, Worst{r, a.case_line});
      if (!fresh && badness(r) > badness(it->second.row)) it->second = Worst{r, a.case_line};
    }
    for (const auto& e : a.exceeded) exceeded.push_back(todo.size() > 1 ? e + " (case " + to_line(c) + ")" : e);
    for (const auto& e : a.failed) failed.push_back(todo.size() > 1 ? e + " (case " + to_line(c) + ")" : e);
    for (const auto& [k, v] : a.loss_error) loss_error[k] = std::max(loss_error[k], v);
    for (const auto& n : a.design_notes) design_notes[n].push_back(a.case_line);
  }
  auto note_line = [&](const std::string& note, const std::vector<std::string>& in) {
    if (todo.size() == 1) return note;
    return fmt::format("{} (in {} of {} cases; first: {})", note, in.size(), todo.size(), in.front());
  };
  std::vector<Worst> worst_rows;
  for (const auto& [k, w] : worst) worst_rows.push_back(w);
  // Plot positions over cases of different depths: the blocks, then the groups after the deepest stack's.
  int after_blocks = 0;
  for (const auto& w : worst_rows)
    if (w.row.group == "blocks" || w.row.group.rfind("layer", 0) == 0)
      after_blocks = std::max(after_blocks, w.row.position + 1);
  for (auto& w : worst_rows)
    if (w.row.group != "blocks" && w.row.group.rfind("layer", 0) != 0)
      w.row.position = after_blocks + (w.row.group == "norm_f" ? 0 : 1);
  std::stable_sort(worst_rows.begin(), worst_rows.end(),
                   [](const Worst& a, const Worst& b) { return a.row.rel_l2 > b.row.rel_l2; });
  std::vector<AmpRow> rows;
  for (const auto& w : worst_rows) rows.push_back(w.row);

  std::cout << "ckverify audit-amp: impl=" << impl << " plan="
            << (gen.plan           ? gen.plan->to_string()
                : todo.size() == 1 ? plan_name
                                   : "generated")
            << " device=" << device << " "
            << (todo.size() == 1 ? "case: " + case_line
                                 : std::to_string(todo.size()) + " generated cases, seed " + std::to_string(seed) +
                                       " (each row from the case where it is worst: checkpointed rows by "
                                       "drift/allowed, the others by rel-L2)")
            << "\n";
  for (const auto& sk : skipped) std::cout << "skipped " << sk << "\n";
  std::cout << fmt::format("noise floor: the non-checkpointed run at {} vs {} intra-op thread(s)\n\n", threads_a,
                           threads_b);
  std::cout << fmt::format(
      "design floor: the drift of ckverify's reference reentrant checkpoints (from the inputs, "
      "and from detached leaves as torch's use_reentrant=True); allowed: the larger of the noise "
      "floor and {} x the design floor\n",
      kAmpDesignFactor);
  for (const auto& [n, in] : design_notes) std::cout << sanitize(note_line(n, in), 600) << "\n";
  std::cout << "\n"
            << fmt::format("{:<6} {:<8} {:<8} {:>14} {:>14} {:>12} {:>12} {:>12} {:>12} {:>13}\n", "prec", "ckpt",
                           "group", "rel-L2 vs fp64", "max-rel", "ckpt drift", "noise floor", "design floor", "allowed",
                           "drift/allowed");
  for (const AmpRow& r : rows) {
    std::string ratio = "-", allowed = "-", design = "-", drift = "-";
    if (r.checkpointed) {
      ratio = r.drift == 0.0 ? "0" : r.allowed == 0.0 ? "inf" : fmt::format("{:.3g}", r.drift / r.allowed);
      allowed = fmt::format("{:.3e}", r.allowed), design = fmt::format("{:.3e}", r.design);
      drift = fmt::format("{:.3e}", r.drift);
    }
    std::cout << fmt::format("{:<6} {:<8} {:<8} {:>14.3e} {:>14.3e} {:>12} {:>12.3e} {:>12} {:>12} {:>13}\n",
                             r.precision, r.checkpointed ? plan_name : "none", r.group, r.rel_l2, r.max_rel, drift,
                             r.floor, design, allowed, ratio);
  }
  if (todo.size() > 1) {
    const Worst* w = nullptr;
    for (const auto& x : worst_rows)
      if (x.row.checkpointed && (!w || badness(x.row) > badness(w->row))) w = &x;
    if (w && badness(w->row).first > 0.0)
      std::cout << fmt::format("\nworst checkpointed row: {} {} (drift/allowed {}), from case: {}\n", w->row.precision,
                               w->row.group,
                               w->row.drift == 0.0     ? "0"
                               : w->row.allowed == 0.0 ? "inf"
                                                       : fmt::format("{:.3g}", w->row.drift / w->row.allowed),
                               sanitize(w->case_line, 600));
  }
  std::cout << "\nloss error vs fp64:";
  for (const auto& [k, v] : loss_error) std::cout << fmt::format("  {} {:.3e}", k, v);
  std::cout << "\n";
  if (!json_path.empty()) {
    json j{{"tool", "ckverify"},
           {"command", "audit-amp"},
           {"impl", impl},
           {"plan", plan_name},
           {"device", device},
           {"cases", todo.size()},
           {"seed", seed},
           {"noise_floor_threads", {threads_a, threads_b}},
           {"skipped", skipped},
           {"exceeded", exceeded},
           {"failed", failed},
           {"loss_error", loss_error},
           {"design_notes", json::array()}};
    for (const auto& [n, in] : design_notes) j["design_notes"].push_back(note_line(n, in));
    if (todo.size() == 1) j["case"] = case_line;
    json jr = json::array();
    for (const auto& [r, row_case] : worst_rows)
      jr.push_back({{"case", row_case},
                    {"precision", r.precision},
                    {"checkpointed", r.checkpointed},
                    {"group", r.group},
                    {"position", r.position},
                    {"rel_l2", r.rel_l2},
                    {"max_rel", r.max_rel},
                    {"drift_rel_l2", r.checkpointed ? json(r.drift) : json(nullptr)},
                    {"noise_floor", r.floor},
                    {"design_floor", r.checkpointed ? json(r.design) : json(nullptr)},
                    {"allowed_drift", r.checkpointed ? json(r.allowed) : json(nullptr)}});
    j["rows"] = jr;
    write_atomically(json_path, j.dump(2) + "\n");
  }
  if (!plot_path.empty()) {
    const report::LinePlot p = amp_error_plot(rows, plan_name, impl);
    try {
      report::write_png(p, plot_path.path);
    } catch (const report::PlotError& e) {
      throw EnvironmentError(std::string("--plot: ") + e.what());
    }
  }
  for (const auto& f : failed) std::cout << "FAILED " << sanitize(f, 400) << "\n";
  if (!failed.empty() && exceeded.empty()) {
    std::cout << "FAIL: the run under test failed" << std::endl;
    return kExitFailed;
  }
  if (!exceeded.empty()) {
    std::cout << "FAIL: checkpoint drift exceeds its allowance: " << exceeded.front()
              << (exceeded.size() > 1 ? fmt::format(" (and {} more)", exceeded.size() - 1) : "") << std::endl;
    return kExitFailed;
  }
  std::cout << "PASS: checkpoint drift within its allowance everywhere" << std::endl;
  return kExitOk;
}

}  // namespace ckv::cli
