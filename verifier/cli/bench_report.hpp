// verifier/cli/bench_report.hpp: what `ckverify bench` prints and writes. The console table and the
// JSON carry the same numbers; `--out DIR` adds a Markdown report with gnuplot plots (memory against
// step time per plan, the growth law, the loss curves, AMP drift) and the data beside them as CSV and JSON.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "reports/plot.hpp"
#include "verifier/cli/output.hpp"
#include "verifier/run/amp_audit.hpp"
#include "verifier/run/bench.hpp"

namespace ckv::cli {

std::string bench_table(const BenchResult& r);
nlohmann::json bench_json(const BenchResult& r, const std::string& impl, const std::string& device, int threads);
// The files `--out DIR` may write (relative to DIR), for a run with or without --growth and --amp.
std::vector<std::string> bench_report_files(bool growth, bool amp);
// The per-group gradient error plot of an AMP audit (`audit-amp --plot`, the bench report).
report::LinePlot amp_error_plot(const std::vector<AmpRow>& rows, const std::string& plan, const std::string& impl);
// Writes them all (each atomically). Throws UsageError when a file cannot be written and
// EnvironmentError when gnuplot fails.
void write_bench_report(const FileArg& dir, const BenchResult& r, const AmpAudit* amp, const std::string& impl,
                        const std::string& device, int threads, const std::string& command);

}  // namespace ckv::cli
