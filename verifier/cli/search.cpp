// verifier/cli/search.cpp: see search.hpp.
#include "verifier/cli/search.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "verifier/cli/rank_case.hpp"
#include "verifier/cli/supervise.hpp"
#include "verifier/cli/workers.hpp"
#include "verifier/impls/loader.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv::cli {
namespace {

const Finding* failing(const std::vector<Finding>& fs, const std::string& property,
                       const std::set<std::string>& skipped) {
  for (const auto& f : fs)
    if (f.failed() && (property.empty() || f.property == property) && !skipped.count(f.property)) return &f;
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

std::optional<rc::Shrinkable<Case>> shrink_jump(const rc::Shrinkable<Case>& s, Jump jump) {
  const Case from = s.value();
  auto allowed = [&](Case c) {
    if (jump == Jump::smallest) return c.plan.kind == from.plan.kind;
    c.model.layers = from.model.layers, c.model.d_model = from.model.d_model, c.model.heads = from.model.heads;
    c.model.ffn_mult = from.model.ffn_mult, c.model.vocab = from.model.vocab;
    c.batch = from.batch, c.seq = from.seq, c.steps = from.steps, c.micro = from.micro;
    return c == from;
  };
  std::optional<rc::Shrinkable<Case>> at;
  // Bounded: a Case has a few dozen fields, each taken to its first shrink in one step.
  for (int step = 0; step < 1000; ++step) {
    auto candidates = (at ? *at : s).shrinks();
    std::optional<rc::Shrinkable<Case>> next;
    for (int k = 0; k < 64 && !next; ++k) {
      auto c = candidates.next();
      if (!c) break;
      if (allowed(c->value())) next = std::move(*c);
    }
    if (!next) break;
    at = std::move(next);
  }
  return at;
}

std::vector<Finding> run_checks(const Case& c) {
  if (c.ranks() > 1) return run_case_as_ranks(c);
  auto impl = make_impl(c.impl);
  try {
    return check_case(c, *impl);
  } catch (const EnvironmentError&) {
    throw;
  } catch (const std::exception& e) {  // the baseline failed: a ckverify bug, reported with its Case
    throw std::runtime_error(std::string(e.what()) + " (case: " + to_line(c) + ")");
  }
}

std::string outcome_code(const std::vector<Finding>& fs, const std::set<std::string>& skipped) {
  std::string code;
  for (const auto& name : property_names()) {
    char c = '-';
    for (const auto& f : fs)
      if (f.property == name) {
        if (skipped.count(name))
          c = f.failed() ? 'X' : 'S';
        else
          c = !f.applicable ? 'N' : f.held ? 'H' : 'F';
      }
    code += c;
  }
  return code;
}

SearchResult search(const SearchOptions& o) {
  SearchResult s;
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(o.budget_s, 1e8)));
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const int shard_n = std::max(1, o.shard_count);
  const int total = o.shard_index < o.cases ? (o.cases - o.shard_index + shard_n - 1) / shard_n : 0;
  const Progress progress{o.progress && stderr_is_terminal(), total};
  const rc::Gen<Case> gen = gen_case(o.gen);
  std::unique_ptr<WorkerPool> pool;
  if (o.jobs > 0) pool = std::make_unique<WorkerPool>(WorkerOptions{o.jobs, o.threads, o.case_timeout_s, o.gen.impl});
  if (pool) pool->start_first(deadline);
  if (o.started) o.started();
  auto evaluate = [&](const std::vector<Case>& cs) {
    if (pool) return pool->run(cs, deadline);
    std::vector<std::optional<std::vector<Finding>>> r;
    for (const Case& c : cs) {
      if (Clock::now() >= deadline)
        r.emplace_back();
      else
        r.emplace_back(run_checks(c));
    }
    return r;
  };
  const size_t width = static_cast<size_t>(std::max(1, o.jobs));
  // Greedy shrinking: take the first smaller Case (in shrink order) that fails the same property, repeat.
  // Candidates run `width` at a time; those after the one taken do not count. First, the jumps
  // (shrink_jump): the smallest Case shrinking could reach, then the Case with only its sizes made
  // smallest, the first that fails the same property taken. The greedy walk pays a failing run for
  // every field it moves, which where a failing run costs the whole --case-timeout (a hang) spent the
  // budget on a handful of fields; a failure that needs none of the Case's size now costs one such run,
  // and one that needs its size at most two small passing runs more.
  // Returns where it ended (the shrink tree of f.failing_case).
  auto shrink = [&](rc::Shrinkable<Case> current, FoundFailure& f, const auto& evaluate) -> rc::Shrinkable<Case> {
    std::vector<rc::Shrinkable<Case>> jumps;
    std::vector<Case> jump_values;
    for (Jump kind : {Jump::smallest, Jump::sizes})
      if (auto j = shrink_jump(current, kind)) {
        Case v = j->value();
        if (std::find(jump_values.begin(), jump_values.end(), v) != jump_values.end()) continue;
        jumps.push_back(std::move(*j)), jump_values.push_back(std::move(v));
      }
    for (size_t k = 0; k < jumps.size() && !f.shrink_cut_short;) {
      std::vector<Case> group;
      for (; k + group.size() < jumps.size() && group.size() < width &&
             f.shrink_runs + static_cast<int>(group.size()) < o.max_shrink_runs;)
        group.push_back(jump_values[k + group.size()]);
      if (group.empty()) break;
      auto results = evaluate(group);
      bool taken = false;
      for (size_t g = 0; g < group.size() && !taken; ++g) {
        if (!results[g]) {
          f.shrink_cut_short = true;
          break;
        }
        ++f.shrink_runs;
        if (!failing(*results[g], f.property, o.skipped)) continue;
        current = jumps[k + g];
        f.failing_case = group[g];
        f.findings = std::move(*results[g]);
        ++f.shrink_steps;
        taken = true;
      }
      if (taken) break;
      k += group.size();
    }
    for (bool smaller = true; smaller && !f.shrink_cut_short;) {
      smaller = false;
      auto candidates = current.shrinks();
      for (bool more = true; more && !smaller && !f.shrink_cut_short;) {
        std::vector<rc::Shrinkable<Case>> group;
        while (group.size() < width && f.shrink_runs + static_cast<int>(group.size()) < o.max_shrink_runs) {
          auto next = candidates.next();
          if (!next) {
            more = false;
            break;
          }
          group.push_back(*next);
        }
        if (group.empty()) {
          f.shrink_cut_short = more;  // out of runs, not out of candidates
          break;
        }
        std::vector<Case> values;
        for (const auto& g : group) values.push_back(g.value());
        auto results = evaluate(values);
        for (size_t k = 0; k < group.size(); ++k) {
          if (!results[k]) {
            f.shrink_cut_short = true;
            break;
          }
          ++f.shrink_runs;
          if (!failing(*results[k], f.property, o.skipped)) continue;
          current = group[k];
          f.failing_case = values[k];
          f.findings = std::move(*results[k]);
          ++f.shrink_steps;
          smaller = true;
          break;
        }
      }
    }
    return current;
  };
  // A shrunk finding, run again alone in a fresh worker process. When it does not fail there, the
  // failure needed something its worker carried from earlier cases: the Case first found is tried
  // alone, then after the cases its worker had run before it; the finding keeps what reproduces it.
  auto fresh_fails = [&](const std::vector<Case>& sequence,
                         const std::string& property) -> std::optional<std::vector<Finding>> {
    WorkerPool fresh(WorkerOptions{1, o.threads, o.case_timeout_s, o.gen.impl});
    auto r = fresh.run(sequence, deadline);
    if (r.empty() || !r.back()) return std::nullopt;  // the budget ran out
    if (!failing(*r.back(), property, o.skipped)) return std::vector<Finding>{};
    return std::move(*r.back());
  };
  // Each candidate alone in a worker process of its own, so that nothing an earlier candidate left in
  // the implementation (a cache, a counter) decides whether a smaller Case fails. A start per candidate
  // (and the implementation's load) makes this shrink slower: it runs only where the other one misled.
  auto fresh_each = [&](const std::vector<Case>& cs) {
    std::vector<std::optional<std::vector<Finding>>> r;
    for (const Case& c : cs) {
      WorkerPool one(WorkerOptions{1, o.threads, o.case_timeout_s, o.gen.impl});
      auto got = one.run({c}, deadline);
      r.push_back(got.empty() ? std::nullopt : std::move(got.front()));
    }
    return r;
  };
  auto confirm = [&](FoundFailure& f, const rc::Shrinkable<Case>& first_shrinkable,
                     const std::vector<Finding>& first_findings, std::vector<Case> history) {
    const Case first = first_shrinkable.value();
    const auto alone = fresh_fails({f.failing_case}, f.property);
    if (!alone || !alone->empty()) return;  // it fails alone (or there is no time left to tell)
    const auto original = fresh_fails({first}, f.property);
    f.failing_case = first;
    f.findings = first_findings;
    f.shrink_steps = 0;
    if (original && !original->empty()) {
      f.findings = *original;
      FoundFailure again;
      again.property = f.property;
      again.failing_index = f.failing_index;
      again.failing_case = first;
      again.findings = *original;
      again.shrink_runs = f.shrink_runs;
      shrink(first_shrinkable, again, fresh_each);
      f.shrink_runs = again.shrink_runs;
      f.shrink_cut_short = again.shrink_cut_short;
      if (again.shrink_steps > 0) {
        f.failing_case = std::move(again.failing_case);
        f.findings = std::move(again.findings);
        f.shrink_steps = again.shrink_steps;
        f.history_note = fmt::format(
            "the smaller Cases first found failed only after other cases had run in the same worker process (the "
            "implementation keeps state across calls: a cache, a counter); shrunk again with every candidate alone "
            "in a fresh worker process ({} step(s)), so this Case fails on its own",
            again.shrink_steps);
        return;
      }
      f.history_note =
          "its shrunk Case passed in a fresh worker process, so the Case first found is kept: the smaller Cases "
          "failed only after other cases had run in the same process";
      return;
    }
    const size_t n = history.size();
    history.push_back(first);
    const auto replayed = fresh_fails(history, f.property);
    history.pop_back();
    if (replayed && !replayed->empty()) {
      f.findings = *replayed;
      f.history = std::move(history);
      // Memory that depends on what ran before is held from earlier calls, or garbage that a collector
      // (Python's, for reference cycles) frees at a time the earlier cases decide: not always "state".
      const char* why = f.property == "memory-saved"
                            ? "the memory it holds depends on earlier calls (a cache or global it fills, or tensors "
                              "kept in reference cycles that Python's garbage collector frees only later)"
                            : "the implementation keeps state across calls (a global, a cache, a counter) that "
                              "changes its result";
      f.history_note = fmt::format(
          "it fails only after the {} case(s) its worker process ran before it, not alone: {}; `repro --history` "
          "replays them first",
          n, why);
    } else {
      f.history_note =
          "it did not fail again in a fresh worker process, alone or after the cases its worker ran before it: the "
          "failure depends on something outside the Case (timing, the machine, state ckverify does not replay)";
    }
  };
  // Properties with a finding (or skipped): set aside for the rest of the search.
  std::set<std::string> excluded = o.skipped;
  const int max_findings = std::max(1, o.max_findings);
  std::vector<FoundFailure> found;
  for (int i = o.shard_index; i < o.cases && static_cast<int>(found.size()) < max_findings && !s.budget_hit;) {
    if (Clock::now() >= deadline) {
      s.budget_hit = true;
      break;
    }
    std::vector<rc::Shrinkable<Case>> batch;
    std::vector<Case> values;
    std::vector<int> index;
    // Eight cases per worker a batch: the workers idle only at a batch's end, waiting for its last case
    // (at two per worker, -j 2 lost a fifth of its throughput there); after a failure the rest of the
    // batch runs again, which costs a failing run little.
    for (; i < o.cases && batch.size() < 8 * width; i += shard_n) {
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
      const std::vector<Finding>& fs = *results[k];
      ++s.ran;
      progress.tick(s.ran);
      s.outcomes.emplace_back(index[k], outcome_code(fs, o.skipped));
      for (const auto& f : fs) {
        if (o.skipped.count(f.property)) {
          if (f.failed()) ++s.skipped_failed[f.property];
        } else if (!f.applicable) {
          ++s.not_applicable[f.property];
          if (!s.not_applicable_why.count(f.property)) s.not_applicable_why[f.property] = f.detail;
        } else if (f.held) {
          ++s.held[f.property];
        }
      }
      // Every property failing here without a finding yet is a new one (in report order), each shrunk
      // on its own; the search then goes on after this case (the rest of the batch ran before these
      // properties were set aside, so it runs again).
      std::vector<std::string> fresh;
      for (const auto& f : fs)
        if (f.failed() && !excluded.count(f.property) && (o.pinned.empty() || f.property == o.pinned))
          fresh.push_back(f.property);
      if (fresh.empty()) continue;
      const std::vector<Case> history = pool ? pool->history_before(k) : std::vector<Case>{};  // before shrinking
      for (const auto& property : fresh) {
        if (static_cast<int>(found.size()) >= max_findings) break;
        FoundFailure f;
        f.property = property;
        f.failing_index = index[k];
        f.failing_case = values[k];
        f.findings = fs;
        excluded.insert(property);
        const rc::Shrinkable<Case> end = shrink(batch[k], f, evaluate);
        if (pool && o.confirm_fresh && spec_kind(o.gen.impl) != SpecKind::name) confirm(f, batch[k], fs, history);
        // Causes first: where the Case shrinking ended fails a property that comes earlier in report
        // order, or recompute-count (one the first failing case did not fail: a cache the implementation
        // kept across calls, a dimension the bigger Case hid it behind), that property heads the finding and the
        // one shrunk for goes under `also`, free to be found again on its own (--max-findings).
        if (const std::string cause = cause_first(f.findings, f.property, excluded);
            o.pinned.empty() && cause != f.property) {
          excluded.erase(f.property);
          f.property = cause;
          excluded.insert(cause);
          if (f.history.empty() && !f.shrink_cut_short && end.value() == f.failing_case) shrink(end, f, evaluate);
        }
        found.push_back(std::move(f));
      }
      i = index[k] + shard_n;
      break;
    }
  }
  if (!found.empty()) {
    FoundFailure& first = found.front();
    s.property = first.property;
    s.failing_index = first.failing_index;
    s.failing_case = first.failing_case;
    s.findings = first.findings;
    s.shrink_steps = first.shrink_steps, s.shrink_runs = first.shrink_runs;
    s.shrink_cut_short = first.shrink_cut_short;
    s.history = first.history;
    s.history_note = first.history_note;
    s.further.assign(std::make_move_iterator(found.begin() + 1), std::make_move_iterator(found.end()));
  }
  progress.end();
  s.elapsed_s = elapsed();
  return s;
}

}  // namespace ckv::cli
