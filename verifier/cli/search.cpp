// verifier/cli/search.cpp: see search.hpp.
#include "verifier/cli/search.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

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

SearchResult search(const SearchOptions& o) {
  SearchResult s;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const Progress progress{o.progress && ::isatty(STDERR_FILENO) != 0, o.cases};
  const rc::Gen<Case> gen = gen_case(o.gen);
  for (int i = 0; i < o.cases; ++i) {
    if (elapsed() > o.budget_s) {
      s.budget_hit = true;
      break;
    }
    const rc::Shrinkable<Case> shrinkable = generate(gen, o.seed, i);
    const Case c = shrinkable.value();
    std::vector<Finding> fs = run_checks(c);
    ++s.ran;
    progress.tick(s.ran);
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
    s.failing_index = i;
    s.failing_case = c;
    s.findings = std::move(fs);
    // Greedy shrinking: take the first smaller Case that fails the same property, repeat.
    rc::Shrinkable<Case> current = shrinkable;
    for (bool smaller = true; smaller;) {
      smaller = false;
      auto candidates = current.shrinks();
      while (auto next = candidates.next()) {
        if (s.shrink_runs >= o.max_shrink_runs || elapsed() > o.budget_s) {
          s.shrink_cut_short = true;
          break;
        }
        const Case k = next->value();
        ++s.shrink_runs;
        std::vector<Finding> kf = run_checks(k);
        if (!failing(kf, s.property)) continue;
        current = *next;
        s.failing_case = k;
        s.findings = std::move(kf);
        ++s.shrink_steps;
        smaller = true;
        break;
      }
    }
    break;
  }
  progress.end();
  s.elapsed_s = elapsed();
  return s;
}

}  // namespace ckv::cli
