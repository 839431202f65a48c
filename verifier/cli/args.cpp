// verifier/cli/args.cpp: see args.hpp.
#include "verifier/cli/args.hpp"

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "properties/property.hpp"
#include "reports/report.hpp"
#include "verifier/cli/search.hpp"
#include "verifier/impls/loader.hpp"
#include "verifier/run/run.hpp"

namespace ckv::cli {

int machine_cores() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::string command_line(int argc, char** argv) {
  std::string command = "ckverify";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + sanitize(argv[i], 200);
  return command;
}

void check_invocation(const CLI::App& app) {
  if (const char* tmp = std::getenv("TMPDIR"); tmp && *tmp) {
    struct stat st {};
    if (::stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode))
      throw UsageError("TMPDIR=" + sanitize(tmp, 200) + " is not a directory (set it to one, or unset it)");
  }
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options())
      if (opt->count() > 0 && opt->get_type_name() == "TEXT")
        for (const std::string& v : opt->results())
          if (v.empty()) throw UsageError(opt->get_name() + " is empty");
}

CLI::Option* add_file(CLI::App* command, const std::string& name, FileArg& file, const std::string& help) {
  return command->add_option(name, file.given, help)->each([&file](const std::string& given) {
    file = file_arg(given);
  });
}

Case load_case_argument(const std::string& path) {
  try {
    return load_case_file(path);
  } catch (const CaseError& e) {
    throw UsageError(e.what());
  }
}

std::string absolute_impl_spec(const std::string& spec) {
  if (spec_kind(spec) != SpecKind::plugin) return spec;
  const size_t colon = spec.find(':');
  std::error_code ec;
  const auto path = std::filesystem::absolute(spec.substr(0, colon), ec);
  if (ec) return spec;
  return path.lexically_normal().string() + (colon == std::string::npos ? "" : spec.substr(colon));
}

std::string history_to_json(const std::vector<Case>& history) {
  std::string out = "[\n";
  for (size_t i = 0; i < history.size(); ++i) out += (i ? ",\n" : "") + to_json(history[i]);
  return out + "\n]\n";
}

std::vector<Case> load_history(const std::string& path) {
  constexpr size_t kMaxHistoryBytes = size_t{64} << 20;  // far more than a run's worth of Cases
  const std::string text = read_regular_file(path, kMaxHistoryBytes);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_array()) throw UsageError("--history " + sanitize(path, 200) + ": not a JSON array of Cases");
  std::vector<Case> out;
  for (const auto& c : j) {
    try {
      out.push_back(case_from_json(c.dump()));
    } catch (const std::exception& e) {
      throw UsageError("--history " + sanitize(path, 200) + ": case " + std::to_string(out.size() + 1) + ": " +
                       sanitize(e.what(), 300));
    }
  }
  return out;
}

void check_count(const std::string& option, int value, int lo, int hi) {
  if (value < lo || value > hi)
    throw UsageError(option + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

uint64_t parse_seed(const std::string& text) {
  try {
    const uint64_t seed = case_from_line("seed=" + text).seed;
    if (text.find_first_not_of("0123456789") != std::string::npos) throw CaseError("not a decimal number");
    return seed;
  } catch (const CaseError&) {
    throw UsageError("--seed \"" + sanitize(text) + "\" is not an integer in [0, 2^64)");
  }
}

Plan parse_plan(const std::string& option, const std::string& text) {
  Plan p;
  std::string err;
  if (!Plan::parse(text, p, err)) throw UsageError(option + ": " + sanitize(err, 160));
  return p;
}

void check_time_budget(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds) || seconds > kMaxBudget)
    throw UsageError("--time-budget must be a number of seconds in (0, 1e8]");
}

CLI::Option* add_stall_timeout(CLI::App* command, double& seconds) {
  return command
      ->add_option("--stall-timeout", seconds,
                   "Seconds without progress (a micro-batch started, a Case verified) after which the run counts as "
                   "hung: the implementation is killed and blamed")
      ->capture_default_str();
}

void check_stall_timeout(double seconds) {
  if (!(seconds >= 1.0) || !std::isfinite(seconds))
    throw UsageError("--stall-timeout must be a number of seconds >= 1");
}

void check_case_timeout(double seconds) {
  if (!(seconds >= 1) || !std::isfinite(seconds) || seconds > 86400)
    throw UsageError("--case-timeout must be a number of seconds in [1, 86400]");
}

void GateOptions::apply(SearchOptions& o) const {
  o.jobs = jobs;
  // One intra-op thread per worker, whatever N: the gate's tensors are tiny (one thread runs a case as
  // fast as two), N workers on N cores do not oversubscribe the machine, and what a case measures
  // (memory-saved's allocations) does not depend on N.
  o.threads = 1;
  o.case_timeout_s = case_timeout_s;
  o.shard_index = shard_index, o.shard_count = shard_count;
}

GateOptions gate_options(int jobs, double case_timeout, const std::string& shard) {
  GateOptions g;
  check_count("-j/--jobs", jobs, 1, 256);
  check_case_timeout(case_timeout);
  g.jobs = jobs, g.case_timeout_s = case_timeout;
  if (!shard.empty() && !report::parse_shard(shard, g.shard_index, g.shard_count))
    throw UsageError("--shard \"" + sanitize(shard) +
                     "\" is not K/N with 1 <= K <= N <= " + std::to_string(report::kMaxShards));
  return g;
}

void check_device(const std::string& device) {
  Case probe;
  try {
    probe = case_from_line("device=" + device);
  } catch (const CaseError& e) {
    throw UsageError(std::string("--device: ") + e.what());
  }
  if (probe.device != device)  // the line form splits on blanks: "cpu " must not pass as "cpu"
    throw UsageError("--device: \"" + sanitize(device) + "\" is not one of cpu|cuda|cuda:N");
  check_environment(probe);
}

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::map<std::string, double> units = {{"", 1.0},       {"B", 1.0},     {"K", 0x1p10},  {"KB", 0x1p10},
                                               {"KIB", 0x1p10}, {"M", 0x1p20},  {"MB", 0x1p20}, {"MIB", 0x1p20},
                                               {"G", 0x1p30},   {"GB", 0x1p30}, {"GIB", 0x1p30}};
  const auto u = units.find(unit);
  if (used == 0 || u == units.end() || !std::isfinite(v) || v <= 0 || v * u->second > 0x1p50)
    throw UsageError("--memory-budget \"" + sanitize(text) + "\" is not a size such as 512M or 2G (at most 1 PiB)");
  return static_cast<int64_t>(v * u->second);
}

std::vector<std::string> split_impl_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma = top_level_comma(text, 0); comma < text.size(); comma = top_level_comma(text, comma + 1)) {
    const size_t end = text.find_first_of(",:", comma + 1);
    const std::string next = text.substr(comma + 1, end == std::string::npos ? std::string::npos : end - comma - 1);
    if (next.find('=') != std::string::npos) continue;  // an option of the spec before
    out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  out.push_back(text.substr(start));
  for (const auto& spec : out)
    if (spec.empty())
      throw UsageError("--impl \"" + sanitize(text, 200) + "\" has an empty implementation in its list");
  return out;
}

std::string strategy_spec(const std::string& spec) {
  if (spec.empty()) throw UsageError("--strategy needs a spec: py:MODULE:FUNC[:key=value,...] or PATH.so[:...]");
  if (spec_kind(spec) == SpecKind::python) {
    if (spec.find("@convention=") != std::string::npos)
      throw UsageError("--strategy " + sanitize(spec, 200) + ": the spec sets @convention itself");
    const size_t first = spec.find(':', 3);
    const bool has_options = first != std::string::npos && spec.find(':', first + 1) != std::string::npos;
    if (spec.back() == ':') return spec + "@convention=strategy";
    return spec + (has_options ? ",@convention=strategy" : ":@convention=strategy");
  }
  if (spec_kind(spec) != SpecKind::plugin)
    throw UsageError("--strategy " + sanitize(spec, 200) +
                     ": expected py:MODULE:FUNC[:key=value,...] or a plugin PATH.so");
  return spec;
}

std::string parse_only(const std::vector<std::string>& words) {
  std::set<std::string> keys;
  std::string only;
  for (const auto& w : words) {
    const std::string key = w.substr(0, w.find('='));
    if (key == "impl" || key == "device" || key == "plan")
      throw UsageError("--only " + sanitize(w) + ": use --" + key + " for " + key);
    try {
      check_field_text(w);  // the rules that join fields apply to the generated Case (apply_only)
    } catch (const CaseError& e) {
      throw UsageError("--only: " + std::string(e.what()));
    }
    if (!keys.insert(key).second) throw UsageError("--only " + sanitize(key) + " is given twice");
    only += (only.empty() ? "" : " ") + w;
  }
  return only;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./:=,@+") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string property_list() {
  std::string out;
  for (const auto& n : property_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string Skip::args() const {
  if (properties.empty()) return "";
  std::string a;
  for (const auto& p : properties) a += " --skip " + p;
  return a + " --reason " + shell_quote(reason);
}

Skip parse_skip(const std::vector<std::string>& given, const std::string& reason) {
  Skip s;
  const std::vector<std::string> names = property_names();
  for (const auto& g : given) {
    size_t start = 0;
    for (;;) {
      const size_t comma = g.find(',', start);
      const std::string name = g.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw UsageError("--skip " + sanitize(name) + ": not a property (" + property_list() + ")");
      s.properties.insert(name);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (!s.properties.empty() && reason.find_first_not_of(" \t") == std::string::npos)
    throw UsageError("--skip needs --reason TEXT: why the property is set aside (it goes into every report)");
  if (s.properties.empty() && !reason.empty()) throw UsageError("--reason without --skip");
  if (reason.size() > 1000 || sanitize(reason, 1000) != reason)
    throw UsageError("--reason: at most 1000 printable characters");
  if (s.properties.size() == names.size())
    throw UsageError("--skip: every property is set aside; nothing would be judged");
  s.reason = reason;
  return s;
}

}  // namespace ckv::cli
