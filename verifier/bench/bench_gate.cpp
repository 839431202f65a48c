// verifier/bench/bench_gate.cpp: the gate's cost (Google Benchmark, not a timed test).
//   BM_GateCase     one generated Case through the run stage and every property (baseline and checkpointed
//                   runs, the two experiments, the fp64 and fp32 references where they judge), cycling over
//                   64 generated one-process cases
//   BM_VerifiedCase / BM_PlainStep  one fixed default-size case: fully verified vs one plain training
//                   step (forward + backward + SGD, no checkpointing); their ratio is the verification overhead.
//   BM_CheckpointedStep  the same step checkpointed by the builtin (plan=block), unverified: what the
//                   implementation costs; a verified case less this and a plain step is what verifying costs.
//   BM_GateRatio    the two alternated pair by pair: that ratio, its median and quartiles over the pairs.
#include <benchmark/benchmark.h>
#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "properties/generators.hpp"
#include "properties/property.hpp"
#include "verifier/impls/registry.hpp"

namespace {
using namespace ckv;

Case default_case() {
  return case_from_line("layers=4 d=16 heads=2 ffn=4 vocab=11 drop=0.1 batch=2 seq=8 steps=1 plan=block seed=3");
}

void BM_VerifiedCase(benchmark::State& st) {
  const Case c = default_case();
  auto impl = make_builtin();
  for (auto _ : st) benchmark::DoNotOptimize(check_case(c, *impl));
}
void BM_PlainStep(benchmark::State& st) {
  Case c = default_case();
  c.plan = Plan{};
  for (auto _ : st) benchmark::DoNotOptimize(train(c, nullptr));
}
void BM_CheckpointedStep(benchmark::State& st) {
  const Case c = default_case();
  auto impl = make_builtin();
  for (auto _ : st) benchmark::DoNotOptimize(train(c, impl.get()));
}
// BM_VerifiedCase and BM_PlainStep alternated case by case in one loop: the ratio of each adjacent pair, so that a
// machine whose speed drifts (other jobs, frequency) moves both sides of every ratio alike. Reports the
// median pair ratio and its interquartile range (counters ratio, ratio_q1, ratio_q3).
void BM_GateRatio(benchmark::State& st) {
  const Case c = default_case();
  Case plain = c;
  plain.plan = Plan{};
  auto impl = make_builtin();
  std::vector<double> ratios;
  auto time = [](auto&& run) {
    const auto start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  bool verified_first = false;
  for (auto _ : st) {
    double v = 0.0, p = 0.0;
    auto verified = [&] { v = time([&] { benchmark::DoNotOptimize(check_case(c, *impl)); }); };
    auto step = [&] { p = time([&] { benchmark::DoNotOptimize(train(plain, nullptr)); }); };
    if (verified_first)
      verified(), step();
    else
      step(), verified();
    verified_first = !verified_first;
    ratios.push_back(v / p);
  }
  std::sort(ratios.begin(), ratios.end());
  auto at = [&](double q) { return ratios[static_cast<size_t>(q * static_cast<double>(ratios.size() - 1) + 0.5)]; };
  if (!ratios.empty()) {
    st.counters["ratio"] = at(0.5);
    st.counters["ratio_q1"] = at(0.25);
    st.counters["ratio_q3"] = at(0.75);
  }
}
void BM_GateCase(benchmark::State& st) {
  std::vector<Case> cases;
  const auto gen = gen_case(CaseGenOptions{});
  // Cases with tp or dp > 1 run as processes of their own (check_case_as_ranks), not in this one.
  for (uint64_t i = 1; cases.size() < 64; ++i)
    if (Case c = gen(rc::Random(i), 100).value(); c.ranks() == 1) cases.push_back(std::move(c));
  auto impl = make_builtin();
  size_t i = 0;
  for (auto _ : st) benchmark::DoNotOptimize(check_case(cases[i++ % cases.size()], *impl));
  st.counters["cases_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_VerifiedCase)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlainStep)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CheckpointedStep)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GateRatio)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GateCase)->Unit(benchmark::kMillisecond);
}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);  // as `ckverify` runs the gate
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
