// verifier/bench/bench_gate.cpp: the gate's cost (Google Benchmark, not a timed test).
//   BM_GateCase     one generated Case through the run stage and every property (baseline and checkpointed
//                   runs, the two experiments, the fp64 and fp32 references), cycling over 64 generated cases
//   BM_VerifiedCase / BM_PlainStep  one fixed default-size case: fully verified vs one plain training
//                   step (forward + backward + SGD, no checkpointing); their ratio is the verification overhead.
#include <benchmark/benchmark.h>
#include <rapidcheck.h>

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
void BM_GateCase(benchmark::State& st) {
  std::vector<Case> cases;
  const auto gen = gen_case(CaseGenOptions{});
  for (int i = 0; i < 64; ++i) cases.push_back(gen(rc::Random(static_cast<uint64_t>(i) + 1), 100).value());
  auto impl = make_builtin();
  size_t i = 0;
  for (auto _ : st) benchmark::DoNotOptimize(check_case(cases[i++ % cases.size()], *impl));
  st.counters["cases_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_VerifiedCase)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlainStep)->Unit(benchmark::kMillisecond);
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
