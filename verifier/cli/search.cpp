// verifier/cli/search.cpp: see search.hpp.
#include "verifier/cli/search.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "verifier/cli/workers.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv::cli {
namespace {

const Finding* failing(const std::vector<Finding>& fs, const std::string& property) {
  for (const auto& f : fs)
    if (f.failed() && (property.empty() || f.property == property)) return &f;
  return nullptr;
}

struct Progress {
  bool on;
  int total;
  void tick(int done) const {
    if (!on) return;
    const int width = 30, filled = total ? done * width / total : width;
    std::fprintf(stderr, "\r[%s%s] %d/%d cases", std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), ' ').c_str(), done, total);
  }
  void end() const {
    if (on) std::fprintf(stderr, "\n");
  }
};

}  // namespace

rc::Shrinkable<Case> generate(const rc::Gen<Case>& gen, uint64_t seed, int i) {
  return gen(rc::Random(rc::Random::Key{seed, static_cast<uint64_t>(i), 0x636b766572696679ULL, 1}), 100);
}

std::vector<Finding> run_checks(const Case& c) {
  auto impl = make_impl(c.impl);
  try {
    return check_case(c, *impl);
  } catch (const EnvironmentError&) {
    throw;
  } catch (const std::exception& e) {  // the baseline failed: a ckverify bug, reported with its Case
    throw std::runtime_error(std::string(e.what()) + " (case: " + to_line(c) + ")");
  }
}

std::string outcome_code(const std::vector<Finding>& fs) {
  std::string code;
  for (const auto& name : property_names()) {
    char c = '-';
    for (const auto& f : fs)
      if (f.property == name) c = !f.applicable ? 'N' : f.held ? 'H' : 'F';
    code += c;
  }
  return code;
}

SearchResult search(const SearchOptions& o) {
  SearchResult s;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(o.budget_s, 1e8)));
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const int shard_n = std::max(1, o.shard_count);
  const int total = o.shard_index < o.cases ? (o.cases - o.shard_index + shard_n - 1) / shard_n : 0;
  const Progress progress{o.progress && ::isatty(STDERR_FILENO) != 0, total};
  const rc::Gen<Case> gen = gen_case(o.gen);
  std::unique_ptr<WorkerPool> pool;
  if (o.jobs > 0) pool = std::make_unique<WorkerPool>(WorkerOptions{o.jobs, o.threads, o.case_timeout_s, o.gen.impl});
  auto evaluate = [&](const std::vector<Case>& cs) {
    if (pool) return pool->run(cs, deadline);
    std::vector<std::optional<std::vector<Finding>>> r;
    for (const Case& c : cs) {
      if (Clock::now() >= deadline) r.emplace_back();
      else r.emplace_back(run_checks(c));
    }
    return r;
  };
  const size_t width = static_cast<size_t>(std::max(1, o.jobs));
  std::optional<rc::Shrinkable<Case>> failed_at;
  for (int i = o.shard_index; i < o.cases && !failed_at && !s.budget_hit; ) {
    if (Clock::now() >= deadline) {
      s.budget_hit = true;
      break;
    }
    std::vector<rc::Shrinkable<Case>> batch;
    std::vector<Case> values;
    std::vector<int> index;
    for (; i < o.cases && batch.size() < 2 * width; i += shard_n) {
      batch.push_back(generate(gen, o.seed, i));
      values.push_back(batch.back().value());
      index.push_back(i);
    }
    auto results = evaluate(values);
    for (size_t k = 0; k < batch.size(); ++k) {
      if (!results[k]) {
        s.budget_hit = true;
        break;
      }
      std::vector<Finding>& fs = *results[k];
      ++s.ran;
      progress.tick(s.ran);
      s.outcomes.emplace_back(index[k], outcome_code(fs));
      for (const auto& f : fs) {
        if (!f.applicable) {
          ++s.not_applicable[f.property];
          if (!s.not_applicable_why.count(f.property)) s.not_applicable_why[f.property] = f.detail;
        } else if (f.held) {
          ++s.held[f.property];
        }
      }
      const Finding* bad = failing(fs, o.pinned);
      if (!bad) continue;
      s.property = bad->property;
      s.failing_index = index[k];
      s.failing_case = values[k];
      s.findings = std::move(fs);
      failed_at = batch[k];
      break;
    }
  }
  if (failed_at) {
    // Greedy shrinking: take the first smaller Case (in shrink order) that fails the same property, repeat.
    // Candidates run `width` at a time; those after the one taken do not count.
    rc::Shrinkable<Case> current = *failed_at;
    for (bool smaller = true; smaller && !s.shrink_cut_short;) {
      smaller = false;
      auto candidates = current.shrinks();
      for (bool more = true; more && !smaller && !s.shrink_cut_short;) {
        std::vector<rc::Shrinkable<Case>> group;
        while (group.size() < width && s.shrink_runs + static_cast<int>(group.size()) < o.max_shrink_runs) {
          auto next = candidates.next();
          if (!next) {
            more = false;
            break;
          }
          group.push_back(*next);
        }
        if (group.empty()) {
          s.shrink_cut_short = more;  // out of runs, not out of candidates
          break;
        }
        std::vector<Case> values;
        for (const auto& g : group) values.push_back(g.value());
        auto results = evaluate(values);
        for (size_t k = 0; k < group.size(); ++k) {
          if (!results[k]) {
            s.shrink_cut_short = true;
            break;
          }
          ++s.shrink_runs;
          if (!failing(*results[k], s.property)) continue;
          current = group[k];
          s.failing_case = values[k];
          s.findings = std::move(*results[k]);
          ++s.shrink_steps;
          smaller = true;
          break;
        }
      }
    }
  }
  progress.end();
  s.elapsed_s = elapsed();
  return s;
}

}  // namespace ckv::cli
