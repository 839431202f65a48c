// verifier/cli/bench_report.cpp: see bench_report.hpp.
#include "verifier/cli/bench_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "reports/plot.hpp"
#include "verifier/cli/output.hpp"
#include "verifier/run/run.hpp"

namespace ckv::cli {
namespace {
double mib(int64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024.0);
}
std::string pct(double x) {
  return fmt::format("{:+.1f}%", 100.0 * x);
}
std::string expected_text(const PlanBench& p) {
  return p.overhead_expected < 0 ? "-" : fmt::format("{:.1f}%", 100.0 * p.overhead_expected);
}
// The overhead with its interval: "+23.6% [+22.0,+25.1]"; a "*" marks an interval over fewer rounds
// than a 95% one needs.
std::string overhead_text(const PlanBench& p) {
  if (p.plan == "none" && p.impl.empty()) return "-";
  return fmt::format("{} [{:+.1f},{:+.1f}]{}", pct(p.overhead), 100.0 * p.overhead_ci.lo, 100.0 * p.overhead_ci.hi,
                     p.overhead_ci.coverage >= 0.95 ? "" : "*");
}
// Memory saved per unit of time overhead (the seed's "saving/overhead" ratio). Only where the overhead
// is measured apart from zero: "noise" when its interval contains 0, "n/a" when the plan ran faster than
// none (no overhead to divide by).
// The value, where there is one (JSON and CSV: null and empty elsewhere).
std::optional<double> save_per_overhead(const PlanBench& p) {
  if ((p.plan == "none" && p.impl.empty()) || p.overhead_ci.contains(0.0) || p.overhead_ci.hi < 0) return std::nullopt;
  return p.saving / p.overhead;
}
std::string ratio_text(const PlanBench& p) {
  if (p.plan == "none" && p.impl.empty()) return "-";
  if (p.overhead_ci.contains(0.0)) return "noise";
  if (p.overhead_ci.hi < 0) return "n/a";
  // Resolved by an interval of less than 95% coverage (too few rounds): marked as that interval is.
  return fmt::format("{:.2f}{}", *save_per_overhead(p), p.overhead_ci.coverage >= 0.95 ? "" : "*");
}
std::string impl_tag(const BenchResult& r, const std::string& impl) {
  for (size_t k = 0; k < r.impls.size(); ++k)
    if (r.impls[k] == impl) return fmt::format("[{}]", k + 1);
  return "-";
}
// Why a row's timings rank nothing: it failed (did not complete, its gate failed, its loss curve left
// none's); "" when it did not.
std::string row_failure(const BenchResult& r, const std::string& plan, const std::string& impl) {
  for (const PlanBench& p : r.plans) {
    if (p.plan != plan || p.impl != impl) continue;
    if (!p.completed) return "did not complete";
    if (p.verified.rfind("FAILED", 0) == 0) return "failed the gate";
    const std::string label = impl.empty() ? plan : plan + " (" + impl + ")";
    if (std::find(r.diverged.begin(), r.diverged.end(), label) != r.diverged.end()) return "left none's loss curve";
  }
  return "";
}
// "0.97x [0.95,0.99]: 3.0% faster", or "within noise" when the interval contains 1; no verdict without a
// 95% interval, nor where either side failed (a broken implementation's speed ranks nothing).
// Why a comparison resolves nothing, "" when it resolves: a side that did not complete, failed the gate
// or left none's loss curve, or too few timed rounds for a 95% interval.
std::string not_compared(const BenchResult& r, const ImplComparison& c) {
  for (const std::string* side : {&c.against, &c.impl})
    if (const std::string why = row_failure(r, c.plan, *side); !why.empty()) return impl_tag(r, *side) + " " + why;
  if (c.ci.coverage < 0.95)
    return fmt::format("only {} timed round(s); a 95% interval needs {}", r.rounds, kMinIntervalSamples);
  return "";
}
std::string comparison_text(const BenchResult& r, const ImplComparison& c) {
  // Without a 95% interval the ratio is printed alone.
  const std::string numbers = c.ci.coverage < 0.95 ? fmt::format("{:.3f}x", c.ratio)
                                                   : fmt::format("{:.3f}x [{:.3f},{:.3f}]", c.ratio, c.ci.lo, c.ci.hi);
  if (const std::string why = not_compared(r, c); !why.empty()) return numbers + ": not compared (" + why + ")";
  return numbers + ": " +
         (c.ci.contains(1.0) ? "within noise (no difference this run can resolve)"
          : c.ratio < 1.0    ? fmt::format("{:.1f}% faster", 100.0 * (1.0 - c.ratio))
                             : fmt::format("{:.1f}% slower", 100.0 * (c.ratio - 1.0)));
}
// Whether a comparison resolves a difference, for the JSON: null where comparison_text gives none.
nlohmann::json comparison_verdict(const BenchResult& r, const ImplComparison& c) {
  if (!not_compared(r, c).empty()) return nullptr;
  return c.ci.contains(1.0);
}
std::string row_name(const PlanBench& p) {
  return p.impl.empty() ? p.plan : p.plan + " (" + p.impl + ")";
}
// One pass's collectives per step: "8 x 64.0, 18.00 ms" (count x KiB each, ms inside them), or "0".
std::string collectives_cell(const PassCollectives& c) {
  return c.count == 0 ? std::string("0") : fmt::format("{:.0f} x {:.1f}, {:.2f} ms", c.count, c.kib / c.count, c.ms);
}

}  // namespace

report::LinePlot amp_error_plot(const std::vector<AmpRow>& rows, const std::string& plan, const std::string& impl) {
  report::LinePlot p;
  p.title = "ckverify audit-amp: gradient error vs the fp64 reference per parameter group (impl " + impl + ")";
  p.xlabel = "parameter group (blocks in order, or all blocks when tied, then final norm and head)";
  p.ylabel = "relative L2 error of the gradients (values below 1e-12 drawn at 1e-12)";
  p.log_y = true, p.y_floor = 1e-12;
  std::map<int, std::string> tics;
  std::map<std::string, report::Series> series;
  for (const AmpRow& r : rows) {
    tics[r.position] = r.group.rfind("layer", 0) == 0 ? r.group.substr(5) : r.group;
    const std::string key = r.precision + (r.checkpointed ? " checkpointed (" + plan + ")" : " not checkpointed");
    series[key].title = key;
    series[key].points.emplace_back(r.position, r.rel_l2);
  }
  for (const auto& [x, label] : tics) p.xtics.emplace_back(x, label);
  for (auto& [k, s] : series) {
    std::sort(s.points.begin(), s.points.end());
    p.series.push_back(s);
  }
  return p;
}

std::string bench_table(const BenchResult& r) {
  size_t w = 8;  // the plan column fits strategy labels too
  bool verified = false;
  for (const PlanBench& p : r.plans) w = std::max(w, p.plan.size()), verified |= !p.verified.empty();
  std::string s;
  if (r.impls.size() > 1) {
    s += "implementations:";
    for (size_t k = 0; k < r.impls.size(); ++k) s += fmt::format("  [{}] {}", k + 1, r.impls[k]);
    s += "\n";
  }
  s += fmt::format("timed rounds: {} ({})\n\n", r.rounds, r.stopped);
  s += fmt::format(
      "{:<{}} {:>5} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>24} {:>7} {:>10} {:>8} {:>9}{}\n", "plan", w,
      "impl", "peak MiB", "saving", "kept MiB", "step ms", "(spread)", "fwd ms", "bwd ms", "opt ms",
      "overhead [95% interval]", "expected", "tokens/s", "save/ovh", "loss dev", verified ? "  verified" : "");
  bool starred = false;
  for (const PlanBench& p : r.plans) {
    const std::string tag = p.impl.empty() ? "-" : impl_tag(r, p.impl);
    if (!p.completed) {
      s += fmt::format("{:<{}} {:>5} FAILED: {}\n", p.plan, w, tag, p.error);
      continue;
    }
    starred |= !(p.plan == "none" && p.impl.empty()) && p.overhead_ci.coverage < 0.95;
    s += fmt::format(
        "{:<{}} {:>5} {:>10.1f} {:>8} {:>10.1f} {:>10.1f} {:>8} {:>8.1f} {:>8.1f} {:>8.1f} {:>24} {:>7} {:>10.0f} "
        "{:>8} {:>9.1e}{}\n",
        p.plan, w, tag, mib(p.total_peak), pct(p.saving), mib(p.forward_kept), 1e3 * p.step_s,
        fmt::format("({:.0f}%)", 100.0 * p.spread), 1e3 * p.forward_s, 1e3 * p.backward_s, 1e3 * p.optimizer_s,
        overhead_text(p), expected_text(p), p.tokens_per_s, ratio_text(p), p.loss_divergence,
        verified ? "  " + (p.verified.empty() ? std::string("-") : p.verified) : "");
    if (p.budget_batch > 0)
      s += fmt::format(
          "{:<8}   within the budget: batch {} (peak {:.1f} MiB) at {:.0f} tokens/s, one measurement; "
          "bounded by {}\n",
          "", p.budget_batch, mib(p.budget_peak), p.budget_tokens_per_s, p.budget_note);
    else if (!p.budget_note.empty())
      s += fmt::format("{:<8}   within the budget: {}\n", "", p.budget_note);
  }
  s += "overhead: median over the rounds of step / step(none) - 1, with its distribution-free 95% interval; "
       "save/ovh only where that interval excludes 0 (noise: it does not)\n";
  if (starred) s += "*: fewer timed rounds than a 95% interval needs (6); the interval is [min, max]\n";
  for (const PlanBench& p : r.plans)
    if (!p.verified_detail.empty())
      s += fmt::format("verification of {} {}: {}\n  {}\n", row_name(p), p.verified, "shrunk to", p.verified_detail);
  if (r.tp * r.dp > 1) {
    // The collectives each plan repeats: what recomputing costs beyond compute under model parallelism.
    s += fmt::format(
        "\ncollectives per step on rank 0 of {} (tp={} dp={}): count x KiB each, ms inside them\n{:<{}} {:>5} {:>22} "
        "{:>22} {:>22}\n",
        r.tp * r.dp, r.tp, r.dp, "plan", w, "impl", "forward", "recompute", "backward");
    for (const PlanBench& p : r.plans)
      if (p.completed)
        s += fmt::format("{:<{}} {:>5} {:>22} {:>22} {:>22}\n", p.plan, w, p.impl.empty() ? "-" : impl_tag(r, p.impl),
                         collectives_cell(p.forward_collectives), collectives_cell(p.recompute_collectives),
                         collectives_cell(p.backward_collectives));
  }
  if (!r.comparisons.empty()) {
    s += fmt::format("\nagainst [1] {} on the same plan (median of per-round step-time ratios, 95% interval):\n",
                     r.impls.front());
    for (const ImplComparison& c : r.comparisons)
      s += fmt::format("  {:<{}} {:>5} {}\n", c.plan, w, impl_tag(r, c.impl), comparison_text(r, c));
  }
  if (!r.growth.empty()) {
    s += "\ngrowth (block parameters frozen; the step's peak above its start):\n";
    s += fmt::format("{:>8} {:>14} {:>14}\n", "layers", "none KiB", "sqrt KiB");
    for (const GrowthPoint& g : r.growth)
      s += fmt::format("{:>8} {:>14.1f} {:>14.1f}\n", g.layers, g.none / 1024.0, g.sqrt / 1024.0);
    if (r.growth.size() >= 3)
      s += fmt::format("fitted peak = c + a * L^k: none k = {:.2f} (c {:.0f} KiB), sqrt k = {:.2f} (c {:.0f} KiB)\n",
                       r.fit_none.k, r.fit_none.c / 1024.0, r.fit_sqrt.k, r.fit_sqrt.c / 1024.0);
  }
  if (!r.growth_stopped.empty()) s += "growth stopped short at " + r.growth_stopped + "\n";
  if (!r.growth_failed.empty()) s += "growth: the implementation failed at " + r.growth_failed + "\n";
  return s;
}

nlohmann::json bench_json(const BenchResult& r, const std::string& impl, const std::string& device, int threads) {
  using nlohmann::json;
  json plans = json::array();
  for (const PlanBench& p : r.plans) {
    json j{{"plan", p.plan}, {"completed", p.completed}};
    if (!p.impl.empty()) j["impl"] = p.impl;
    if (!p.verified.empty()) j["verified"] = p.verified;
    if (!p.completed) {
      j["error"] = p.error;
    } else {
      j.update({{"params_bytes", p.params},
                {"grads_bytes", p.grads},
                {"optimizer_bytes", p.optimizer},
                {"forward_kept_bytes", p.forward_kept},
                {"step_peak_bytes", p.step_peak},
                {"total_peak_bytes", p.total_peak},
                {"saving", p.saving},
                {"step_s", p.step_s},
                {"step_spread", p.spread},
                {"forward_s", p.forward_s},
                {"backward_s", p.backward_s},
                {"optimizer_s", p.optimizer_s},
                {"tokens_per_s", p.tokens_per_s},
                {"overhead", p.overhead},
                {"overhead_interval", {p.overhead_ci.lo, p.overhead_ci.hi}},
                {"overhead_interval_coverage", p.overhead_ci.coverage},
                {"step_times_s", p.step_times},
                {"overhead_expected", p.overhead_expected < 0 ? json(nullptr) : json(p.overhead_expected)},
                {"save_per_overhead", save_per_overhead(p) ? json(*save_per_overhead(p)) : json(nullptr)},
                {"losses", p.losses},
                {"loss_divergence", p.loss_divergence}});
      if (r.tp * r.dp > 1) {
        auto pass = [](const PassCollectives& c) {
          return json{{"count", c.count}, {"kib_total", c.kib}, {"ms_inside", c.ms}};
        };
        j["collectives_per_step"] = {{"forward", pass(p.forward_collectives)},
                                     {"recompute", pass(p.recompute_collectives)},
                                     {"backward", pass(p.backward_collectives)}};
      }
      if (p.budget_batch > 0)
        j["budget"] = {{"batch", p.budget_batch},
                       {"peak_bytes", p.budget_peak},
                       {"tokens_per_s", p.budget_tokens_per_s},
                       {"bounded_by", p.budget_note}};
      else if (!p.budget_note.empty())
        j["budget"] = {{"batch", nullptr}, {"note", p.budget_note}};
    }
    plans.push_back(j);
  }
  json growth = json::array();
  for (const GrowthPoint& g : r.growth)
    growth.push_back({{"layers", g.layers}, {"none_bytes", g.none}, {"sqrt_bytes", g.sqrt}});
  json comparisons = json::array();
  for (const ImplComparison& c : r.comparisons)
    comparisons.push_back({{"plan", c.plan},
                           {"impl", c.impl},
                           {"against", c.against},
                           {"ratio", c.ratio},
                           {"interval", {c.ci.lo, c.ci.hi}},
                           {"coverage", c.ci.coverage},
                           {"within_noise", comparison_verdict(r, c)}});
  json j{{"tool", "ckverify"},
         {"command", "bench"},
         {"impl", impl},
         {"impls", r.impls},
         {"rounds", r.rounds},
         {"converged", r.converged},
         {"stopped", r.stopped},
         {"comparisons", comparisons},
         {"device", device},
         {"threads", threads},
         {"case", r.case_line},
         {"tokens_per_step", r.tokens_per_step},
         {"plans", plans},
         {"diverged", r.diverged},
         {"loss_tolerance", kLossTolerance},
         {"tp", r.tp},
         {"dp", r.dp}};
  if (!r.growth.empty())
    j["growth"] = {{"points", growth},
                   {"fit", "peak = c + a * L^k"},
                   {"none", {{"k", r.fit_none.k}, {"c_bytes", r.fit_none.c}, {"a_bytes", r.fit_none.a}}},
                   {"sqrt", {{"k", r.fit_sqrt.k}, {"c_bytes", r.fit_sqrt.c}, {"a_bytes", r.fit_sqrt.a}}}};
  return j;
}

std::vector<std::string> bench_report_files(bool growth, bool amp) {
  std::vector<std::string> f = {"report.md", "bench.json", "plans.csv", "losses.csv", "memory_time.png", "losses.png"};
  if (growth) f.insert(f.end(), {"growth.csv", "growth.png"});  // growth.png: written with 3 depths or more
  if (amp) f.insert(f.end(), {"amp.csv", "amp_drift.png"});
  return f;
}

void write_bench_report(const FileArg& dir, const BenchResult& r, const AmpAudit* amp, const std::string& impl,
                        const std::string& device, int threads, const std::string& command) {
  auto path = [&](const std::string& f) { return inside(dir, f); };
  auto plot = [&](const report::LinePlot& p, const std::string& f) {
    try {
      report::write_png(p, path(f).path);
    } catch (const report::PlotError& e) {
      throw EnvironmentError(std::string("--out: ") + e.what());
    }
  };
  const std::string device_note = device == "cpu" ? fmt::format("CPU, {} intra-op thread(s)", threads) : device;

  // Data.
  std::string csv =
      "plan,impl,total_peak_bytes,saving,forward_kept_bytes,step_peak_bytes,params_bytes,grads_bytes,optimizer_bytes,"
      "step_s,step_spread,forward_s,backward_s,optimizer_s,overhead,overhead_lo,overhead_hi,overhead_expected,tokens_"
      "per_"
      "s,"
      "loss_divergence,save_per_overhead\n";
  auto quoted = [](const std::string& v) {
    std::string q = "\"";
    for (char ch : v) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  for (const PlanBench& p : r.plans)
    if (p.completed)
      csv += fmt::format(
          "{},{},{},{:.6f},{},{},{},{},{},{:.6f},{:.4f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{},{:.2f},{:.3e},{}"
          "\n",
          p.plan, quoted(p.impl), p.total_peak, p.saving, p.forward_kept, p.step_peak, p.params, p.grads, p.optimizer,
          p.step_s, p.spread, p.forward_s, p.backward_s, p.optimizer_s, p.overhead, p.overhead_ci.lo, p.overhead_ci.hi,
          p.overhead_expected < 0 ? std::string() : fmt::format("{:.6f}", p.overhead_expected), p.tokens_per_s,
          p.loss_divergence, save_per_overhead(p) ? fmt::format("{:.4f}", *save_per_overhead(p)) : std::string());
  write_atomically(path("plans.csv"), csv);
  std::string losses = "plan,impl,step,loss\n";
  for (const PlanBench& p : r.plans)
    for (size_t s = 0; s < p.losses.size(); ++s)
      losses += fmt::format("{},{},{},{:.17g}\n", p.plan, quoted(p.impl), s, p.losses[s]);
  write_atomically(path("losses.csv"), losses);
  write_atomically(path("bench.json"), bench_json(r, impl, device, threads).dump(2) + "\n");
  if (!r.growth.empty()) {
    std::string g = "layers,none_bytes,sqrt_bytes\n";
    for (const GrowthPoint& p : r.growth) g += fmt::format("{},{},{}\n", p.layers, p.none, p.sqrt);
    write_atomically(path("growth.csv"), g);
  }
  if (amp) {
    std::string a = "precision,checkpointed,group,rel_l2,max_rel,drift,noise_floor\n";
    for (const AmpRow& row : amp->rows)
      a += fmt::format("{},{},{},{:.6e},{:.6e},{:.6e},{:.6e}\n", row.precision, row.checkpointed ? 1 : 0, row.group,
                       row.rel_l2, row.max_rel, row.drift, row.floor);
    write_atomically(path("amp.csv"), a);
  }

  // Plots.
  {
    report::LinePlot p;
    p.title = fmt::format("ckverify bench: peak memory vs step time per plan (impl {}, {})", impl, device_note);
    p.xlabel = "step time (ms, median)";
    p.ylabel = "peak tensor memory (MiB: parameters + optimizer + the step's peak)";
    for (const PlanBench& b : r.plans)
      if (b.completed) {
        report::Series s;
        s.title = row_name(b);
        s.points_only = true;
        s.points.emplace_back(1e3 * b.step_s, mib(b.total_peak));
        p.series.push_back(s);
      }
    plot(p, "memory_time.png");
  }
  {
    report::LinePlot p;
    p.title = "ckverify bench: training loss per step for every plan (identical curves = same training)";
    p.xlabel = "optimizer step";
    p.ylabel = "loss (summed over micro-batches)";
    for (const PlanBench& b : r.plans)
      if (b.completed) {
        report::Series s;
        s.title = row_name(b);
        for (size_t k = 0; k < b.losses.size(); ++k) s.points.emplace_back(static_cast<double>(k), b.losses[k]);
        p.series.push_back(s);
      }
    plot(p, "losses.png");
  }
  if (r.growth.size() >= 3) {
    report::LinePlot p;
    p.title = fmt::format("ckverify bench: activation peak vs depth (fit c + a*L^k: none k = {:.2f}, sqrt k = {:.2f})",
                          r.fit_none.k, r.fit_sqrt.k);
    p.xlabel = "layers L (log scale)";
    p.ylabel = "the step's peak above its start (MiB, log scale; block parameters frozen)";
    p.log_x = true, p.log_y = true, p.y_floor = 1e-6;
    report::Series n, q, fn, fq;
    n.title = "none (measured)", q.title = "sqrt (measured)";
    fn.title = fmt::format("none fit: {:.1f} + {:.2f} * L^{:.2f} MiB", r.fit_none.c / 1048576.0,
                           r.fit_none.a / 1048576.0, r.fit_none.k);
    fq.title = fmt::format("sqrt fit: {:.1f} + {:.2f} * L^{:.2f} MiB", r.fit_sqrt.c / 1048576.0,
                           r.fit_sqrt.a / 1048576.0, r.fit_sqrt.k);
    fn.dashed = fq.dashed = true;
    for (const GrowthPoint& g : r.growth) {
      n.points.emplace_back(g.layers, mib(g.none));
      q.points.emplace_back(g.layers, mib(g.sqrt));
    }
    for (double L = r.growth.front().layers; L <= r.growth.back().layers * 1.0001; L *= 1.05) {
      fn.points.emplace_back(L, (r.fit_none.c + r.fit_none.a * std::pow(L, r.fit_none.k)) / 1048576.0);
      fq.points.emplace_back(L, (r.fit_sqrt.c + r.fit_sqrt.a * std::pow(L, r.fit_sqrt.k)) / 1048576.0);
    }
    p.series = {n, q, fn, fq};
    plot(p, "growth.png");
  }
  if (amp) plot(amp_error_plot(amp->rows, amp->plan, impl), "amp_drift.png");

  // The report.
  std::string md = "# ckverify bench\n\n";
  md += fmt::format("Command: `{}`  \nImplementation: `{}`; device: {}; {} tokens per step.  \nCase: `{}`\n\n", command,
                    impl, device_note, r.tokens_per_step, r.case_line);
  md += fmt::format("Timed rounds: {} ({}).\n\n", r.rounds, r.stopped);
  md +=
      "Peak: parameters + optimizer state + the step's peak of tensor memory above its start (activations, "
      "gradients as they are built, temporaries). Kept: what the forward keeps for backward. Every row trains one "
      "step per round, in an order that rotates and reverses round by round. Times are medians over the timed rounds "
      "(spread = (max - min) "
      "/ median). Overhead: the median over the rounds of step / step(`none`) - 1, with its distribution-free 95% "
      "interval (the order statistics of the per-round ratios; * marks fewer rounds than a 95% interval needs). "
      "Expected: T_fwd(recomputed units) / (T_fwd + T_bwd) measured on `none` (an estimate of what recomputing "
      "alone costs, not a ceiling). save/ovh: memory saving per unit of "
      "time overhead, only where the overhead's interval excludes 0 (noise: it does not). loss dev: largest relative "
      "deviation of the row's loss curve from `none`'s.\n\n";
  md += "verified: the gate's verdict on generated Cases with the plan or strategy (`--verify-cases`).\n\n";
  md +=
      "| plan | impl | peak MiB | saving | kept MiB | step ms | spread | fwd ms | bwd ms | opt ms | overhead [95%] | "
      "expected | "
      "tokens/s | save/ovh | loss dev | verified "
      "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const PlanBench& p : r.plans) {
    const std::string tag = p.impl.empty() ? "-" : "`" + p.impl + "`";
    if (!p.completed) {
      md += fmt::format("| {} | {} | FAILED: {} |||||||||||||\n", p.plan, tag, p.error);
      continue;
    }
    md += fmt::format(
        "| {} | {} | {:.1f} | {} | {:.1f} | {:.1f} | {:.0f}% | {:.1f} | {:.1f} | {:.1f} | {} | {} | {:.0f} | {} | "
        "{:.1e} | {} |\n",
        p.plan, tag, mib(p.total_peak), pct(p.saving), mib(p.forward_kept), 1e3 * p.step_s, 100.0 * p.spread,
        1e3 * p.forward_s, 1e3 * p.backward_s, 1e3 * p.optimizer_s, overhead_text(p), expected_text(p), p.tokens_per_s,
        ratio_text(p), p.loss_divergence, p.verified.empty() ? "-" : p.verified);
  }
  if (!r.comparisons.empty()) {
    md += fmt::format(
        "\nAgainst `{}` on the same plan (median of the per-round step-time ratios, 95% interval):\n\n"
        "| plan | impl | ratio |\n|---|---|---|\n",
        r.impls.front());
    for (const ImplComparison& c : r.comparisons)
      md += fmt::format("| {} | `{}` | {} |\n", c.plan, c.impl, comparison_text(r, c));
  }
  if (r.tp * r.dp > 1) {
    md += fmt::format(
        "\nRun as {} ranks (tp={} dp={}): memory and times are rank 0's. Collectives per timed step on rank 0 "
        "(count x KiB each, ms inside them):\n\n| plan | impl | forward | recompute | backward "
        "|\n|---|---|---|---|---|\n",
        r.tp * r.dp, r.tp, r.dp);
    for (const PlanBench& p : r.plans)
      if (p.completed)
        md += fmt::format("| {} | {} | {} | {} | {} |\n", p.plan, p.impl.empty() ? "-" : "`" + p.impl + "`",
                          collectives_cell(p.forward_collectives), collectives_cell(p.recompute_collectives),
                          collectives_cell(p.backward_collectives));
  }
  bool budget = false;
  for (const PlanBench& p : r.plans) budget |= p.budget_batch > 0;
  if (budget) {
    md +=
        "\nLargest batch within the memory budget (measured at that batch):\n\n| plan | batch | peak MiB | tokens/s "
        "|\n|---|---:|---:|---:|\n";
    for (const PlanBench& p : r.plans)
      if (p.budget_batch > 0)
        md += fmt::format("| {} | {} | {:.1f} | {:.0f} |\n", row_name(p), p.budget_batch, mib(p.budget_peak),
                          p.budget_tokens_per_s);
  }
  md += "\n![memory vs time](memory_time.png)\n\n";
  md +=
      r.diverged.empty()
          ? fmt::format("Loss curves: every plan's curve equals `none`'s within {:.0e} (relative).\n\n", kLossTolerance)
          : "Loss curves: **diverged**: " + fmt::format("{}", fmt::join(r.diverged, ", ")) + "\n\n";
  md += "![loss curves](losses.png)\n\n";
  if (!r.growth.empty()) {
    md += fmt::format(
        "## Growth law\n\nThe step's peak above its start, block parameters frozen (so their gradients, "
        "which grow like L under every plan, stay out), fitted as c + a * L^k (c: what every depth "
        "pays: input, head, loss, backward's temporaries). `none`: k = {:.2f}; `sqrt`: k = {:.2f}.\n\n"
        "| layers | none KiB | sqrt KiB |\n|---:|---:|---:|\n",
        r.fit_none.k, r.fit_sqrt.k);
    for (const GrowthPoint& g : r.growth)
      md += fmt::format("| {} | {:.1f} | {:.1f} |\n", g.layers, g.none / 1024.0, g.sqrt / 1024.0);
    if (r.growth.size() >= 3) md += "\n![growth](growth.png)\n";
    md += "\n";
  }
  if (!r.growth_stopped.empty()) md += "Growth stopped short at " + r.growth_stopped + ".\n\n";
  if (!r.growth_failed.empty()) md += "**Growth: the implementation failed** at " + r.growth_failed + ".\n\n";
  if (amp) {
    md += fmt::format(
        "## AMP drift\n\n`ckverify audit-amp` on the same Case, plan `{}`: gradient error against fp64 per "
        "parameter group and precision, with and without checkpointing (data: amp.csv). {}\n\n",
        amp->plan,
        amp->exceeded.empty() && amp->failed.empty()
            ? "Checkpoint drift is within its allowance (noise floor, design floor) everywhere."
            : "**Checkpoint drift exceeds its allowance** (" +
                  (amp->exceeded.empty() ? amp->failed.front() : amp->exceeded.front()) + ").");
    for (const auto& s : amp->skipped) md += "Skipped: " + s + "\n\n";
    md += "![amp drift](amp_drift.png)\n";
  }
  write_atomically(path("report.md"), md);
}

}  // namespace ckv::cli
