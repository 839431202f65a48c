// verifier/cli/args.hpp: what the commands' options mean, in one place. Every command that takes an
// option (a plan, a time budget, a case count, a shard, a device, a size, a list of implementations,
// --only, --skip) reads it through the one parser here, so each spelling is accepted or refused alike
// everywhere, with the same one-line message (a UsageError: exit 2). Nothing here loads an
// implementation.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "reports/report.hpp"
#include "verifier/case/case.hpp"
#include "verifier/cli/output.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace ckv::cli {

struct SearchOptions;

// The exit codes (ckverify --help says them).
constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitInternal = 3;

// The machine's cores (at least 1): the default of -j/--jobs.
int machine_cores();

// The command line as run, each argument made printable (bench's report shows it).
std::string command_line(int argc, char** argv);

// What every command's command line must be: no option given as "" (which would silently write
// nothing), and a TMPDIR that is a directory (workers' scratch and plots go there: one that is not is
// this machine's problem, said up front, not an internal error half-way through a run).
void check_invocation(const CLI::App& app);

// An option naming a file (or a directory) the command writes, or reads after it may have loaded an
// implementation: `file.given` takes the value, and `file.path` is resolved as the command line is
// parsed (output.hpp: FileArg), before anything is loaded. A default belongs in `file` beforehand
// (file_arg), resolved then.
CLI::Option* add_file(CLI::App* command, const std::string& name, FileArg& file, const std::string& help);

// A Case file named on the command line: a bad one is a usage error.
Case load_case_argument(const std::string& path);
// A plugin spec with its library's path made absolute, so that a plugin or a Python module that changes
// the working directory later, and a repro file read elsewhere, still find it; other specs as given.
std::string absolute_impl_spec(const std::string& spec);
// A history file (`check` writes one beside a repro file, `repro --history` reads it): the Cases one
// worker ran before a failure, oldest first, as a JSON array of Case files. Bounded, every Case
// validated; throws UsageError naming the file.
std::string history_to_json(const std::vector<Case>& history);
std::vector<Case> load_history(const std::string& path);

// A count given on the command line (cases, rounds, findings, ...) in [lo, hi]: checked before anything
// is sized by it, "OPTION must be in [lo, hi]" otherwise.
void check_count(const std::string& option, int value, int lo, int hi);
// The most generated cases a search takes (check, faults: --cases; their time budget ends a run that
// asks for more than it can run), and a command that generates every Case up front and runs each to
// the end (audit-amp --cases; bench --verify-cases).
constexpr int kMaxSearchCases = report::kMaxCases;
constexpr int kMaxRunEveryCase = 100000;

// --seed: decimal, in [0, 2^64), nothing after it (the Case's own seed parser).
uint64_t parse_seed(const std::string& text);

// --plan (and each item of bench's --plans), named `option` in the message.
Plan parse_plan(const std::string& option, const std::string& text);

// The longest --time-budget (about 3 years): longer ones would overflow the clock's nanoseconds.
constexpr double kMaxBudget = 1e8;
// --time-budget: seconds in (0, kMaxBudget].
void check_time_budget(double seconds);
// --stall-timeout (train, audit-amp, bench): seconds >= 1.
CLI::Option* add_stall_timeout(CLI::App* command, double& seconds);
void check_stall_timeout(double seconds);
// --case-timeout: seconds in [1, 86400].
void check_case_timeout(double seconds);

// Worker processes, the per-case timeout and the shard of `check` and `faults` (and repro's timeout).
struct GateOptions {
  int jobs = 1;
  double case_timeout_s = 120;
  int shard_index = 0, shard_count = 1;
  void apply(SearchOptions& o) const;
};
// -j/--jobs in [1, 256], --case-timeout in [1, 86400] seconds, --shard K/N ("" for none).
GateOptions gate_options(int jobs, double case_timeout, const std::string& shard);

// --device: cpu, cuda or cuda:N, and this machine and build can run the generated cases on it (one probe
// Case); EnvironmentError when they cannot.
void check_device(const std::string& device);

// --memory-budget: "512M", "2G", "1.5GiB", "1048576": bytes.
int64_t parse_bytes(const std::string& text);

// `--impl A,B,...`: a comma starts the next spec unless what follows it, up to the next ':' or ',', is a
// key=value option of the spec before (py:M:F:a=1,b=2); commas inside brackets or quotes never split.
std::vector<std::string> split_impl_list(const std::string& text);

// The implementation spec of `--strategy SPEC`: a Python function in the bridge's strategy convention
// (FUNC(blocks, x, **options)), or a C++ plugin whose implementation is a strategy.
std::string strategy_spec(const std::string& spec);

// --only KEY=VALUE...: each a Case field (not impl, device or plan, which have options of their own),
// no key twice; the fields as one line ("" for none).
std::string parse_only(const std::vector<std::string>& words);

// s as one word for a POSIX shell.
std::string shell_quote(const std::string& s);

// The property names, comma separated.
std::string property_list();

// --skip PROPERTY (repeatable, or a comma list) with its --reason: the properties set aside.
struct Skip {
  std::set<std::string> properties;
  std::string reason;
  // The arguments that set the same aside again (for the printed repro command).
  std::string args() const;
};
Skip parse_skip(const std::vector<std::string>& given, const std::string& reason);

}  // namespace ckv::cli
