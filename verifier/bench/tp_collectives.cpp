// verifier/bench/tp_collectives.cpp: what a checkpoint's recompute costs in collectives under tensor
// parallelism, per plan, on real ranks joined over Gloo on 127.0.0.1. Every rank trains its shard of the
// Transformer (verifier/model/shard.hpp) step after step under three plans:
//   none: no checkpoint;
//   full: every block in the builtin checkpoint (shown the tracker's generators): its recompute repeats
//         each block's forward all-reduces (a block's last saved tensors lie after them, so early stop
//         spares none);
//   kept: the same, with each forward all-reduce's output kept for the recompute (TensorShard::
//         keep_reduced): only local ops are recomputed.
// The plans alternate step by step, so the machine's noise falls on all of them alike, and the ranks
// meet at a barrier before every step. Per plan: the median step time on rank 0 with its quartiles, the
// overhead of the median over no checkpoint, and per step the collectives of each pass from the ledger
// (count, bytes, time inside them on rank 0).
//
// usage: tp_collectives [--tp N] [--steps N] [--layers L] [--d D] [--heads H] [--seq T] [--batch B]
// Run without CKV_RANK, it starts itself as the ranks (dist/ranks.hpp) and prints rank 0's table.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "verifier/checkpoint/checkpoint.hpp"
#include "verifier/dist/collectives.hpp"
#include "verifier/dist/ranks.hpp"
#include "verifier/dist/rng_tracker.hpp"
#include "verifier/model/model.hpp"
#include "verifier/model/shard.hpp"

using namespace ckv;
using namespace ckv::dist;

namespace {

struct Options {
  int tp = 2, steps = 30, layers = 4, d = 64, heads = 4, seq = 64, batch = 4;
};

Options parse(int argc, char** argv) {
  Options o;
  const std::map<std::string, int*> flags = {{"--tp", &o.tp},      {"--steps", &o.steps}, {"--layers", &o.layers},
                                             {"--d", &o.d},        {"--heads", &o.heads}, {"--seq", &o.seq},
                                             {"--batch", &o.batch}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto it = flags.find(a);
    if (it == flags.end() || i + 1 >= argc)
      throw std::invalid_argument("unknown or incomplete option " + a +
                                  " (usage: tp_collectives [--tp N] [--steps N] [--layers L] [--d D] [--heads H] "
                                  "[--seq T] [--batch B])");
    try {
      size_t used = 0;
      *it->second = std::stoi(argv[++i], &used);
      if (used != std::string(argv[i]).size() || *it->second < 1) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw std::invalid_argument(a + " takes a positive integer, not " + std::string(argv[i]));
    }
  }
  if (o.tp < 2 || o.tp > 8) throw std::invalid_argument("--tp must be 2..8");
  if (o.d % o.heads != 0) throw std::invalid_argument("--d must divide by --heads");
  return o;
}

struct Plan {
  std::string name;
  bool checkpoint = false, keep = false;
  std::vector<double> ms;
  std::vector<std::pair<size_t, size_t>> records;  // each measured step's ledger records [begin, end)
};

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

int rank_main(const Options& o, const RankEnv& env) {
  auto world = Group::join({env.store, env.rank, env.world, std::chrono::seconds(120)});
  ModelConfig cfg;
  cfg.layers = o.layers, cfg.d_model = o.d, cfg.heads = o.heads, cfg.ffn_mult = 4;
  const std::string why = tp_error(cfg, o.tp);
  if (!why.empty()) throw std::invalid_argument(why);
  const ParamSet params = make_params(cfg, 1);
  const CaseData data = make_case_data(cfg, o.batch, o.seq, 1);
  const torch::Tensor x =
      torch::tensor(data.x, torch::kDouble).reshape({o.batch, o.seq, o.d}).to(torch::kFloat).requires_grad_();
  const torch::Tensor targets = torch::tensor(data.targets, torch::kLong).reshape({o.batch, o.seq});

  std::vector<Plan> plans = {
      {"none", false, false, {}, {}}, {"full", true, false, {}, {}}, {"kept", true, true, {}, {}}};
  RngTracker tracker;
  tracker.add(kModelParallelStream, 1000 + static_cast<uint64_t>(env.rank));
  auto ledger = std::make_shared<CollectiveLedger>();
  // One model per plan (keep_reduced is the shard's), the same parameters and ledger.
  std::vector<std::unique_ptr<SiteTap>> taps;
  std::vector<std::shared_ptr<TransformerImpl>> models;
  for (const Plan& p : plans) {
    TensorShard shard;
    shard.rank = env.rank, shard.size = env.world, shard.tracker = &tracker, shard.keep_reduced = p.keep;
    shard.region = std::make_shared<ParallelRegion>();
    shard.region->group = world;
    shard.region->ledger = ledger;
    taps.push_back(std::make_unique<SiteTap>(DropoutImpl::explicit_mask,
                                             std::array<double, kNumDropoutSites>{0.1, 0.1, 0.1, 0.1}));
    taps.back()->set_recording(false);
    models.push_back(std::make_shared<TransformerImpl>(cfg, taps.back().get(), nullptr, shard));
    models.back()->load(params);
  }
  auto step = [&](size_t k, int s) {
    TransformerImpl& model = *models[k];
    for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    torch::manual_seed(static_cast<uint64_t>(s));  // the default generator: equal on every rank
    world->barrier();
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor h = x;
    for (int l = 0; l < cfg.layers; ++l) {
      const Unit u{l, BlockPart::whole};
      auto block = [&model, u](const torch::Tensor& in) { return model.run_unit(u, in, {}); };
      if (plans[k].checkpoint) {
        CheckpointOptions options;
        options.generators = tracker.generators();
        h = ckv::checkpoint(block, h, options);
      } else {
        h = block(h);
      }
    }
    model.head_loss(h, targets, {}).backward();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    return took.count();
  };
  const int warmup = 2;
  for (int s = 0; s < warmup; ++s)
    for (size_t k = 0; k < plans.size(); ++k) step(k, s);
  for (int s = 0; s < o.steps; ++s)
    for (size_t k = 0; k < plans.size(); ++k) {
      const size_t before = ledger->records().size();
      plans[k].ms.push_back(step(k, warmup + s));
      plans[k].records.emplace_back(before, ledger->records().size());
    }
  const std::vector<CollectiveRecord> records = ledger->records();
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line,
                "tp_collectives: tp=%d layers=%d d=%d heads=%d ffn=%d batch=%d seq=%d dropout=0.1, %d steps per plan "
                "(alternated), rank 0\n",
                o.tp, o.layers, o.d, o.heads, cfg.d_ff(), o.batch, o.seq, o.steps);
  out << line;
  out << "plan  step ms (q1-q3)        vs none  collectives per step (count x KiB each, ms inside):\n"
         "                                        forward              recompute            backward\n";
  const double none = quantile(plans[0].ms, 0.5);
  for (const Plan& p : plans) {
    struct Sum {
      int n = 0;
      double kib = 0, ms = 0;
    };
    std::map<Pass, Sum> per;
    for (const auto& [begin, end] : p.records)
      for (size_t i = begin; i < end; ++i) {
        Sum& t = per[records[i].pass];
        ++t.n, t.kib += static_cast<double>(records[i].bytes) / 1024.0, t.ms += records[i].seconds * 1000.0;
      }
    const double steps = static_cast<double>(p.records.size());
    const double median = quantile(p.ms, 0.5);
    std::snprintf(line, sizeof line, "%-5s %7.2f (%6.2f-%6.2f)  %+6.1f%%", p.name.c_str(), median, quantile(p.ms, 0.25),
                  quantile(p.ms, 0.75), 100.0 * (median / none - 1.0));
    out << line;
    for (Pass pass : {Pass::forward, Pass::recompute, Pass::backward}) {
      const Sum& t = per[pass];
      if (t.n == 0) {
        std::snprintf(line, sizeof line, "  %-19s", "0");
      } else {
        std::snprintf(line, sizeof line, "  %3.0f x %5.1f, %5.2f ms", t.n / steps, t.kib / t.n, t.ms / steps);
      }
      out << line;
    }
    out << "\n";
  }
  if (env.rank == 0) std::ofstream(std::filesystem::path(env.store).parent_path() / "table.txt") << out.str();
  world->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (std::getenv("CKV_RANK")) {
      torch::set_num_threads(1);
      return rank_main(o, RankEnv::from_environment());
    }
    // The launcher: the same program as the ranks, in a directory of the run's own.
    std::string templ = (std::filesystem::temp_directory_path() / "tp_collectives.XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw std::runtime_error("tp_collectives: cannot make a temporary directory");
    const std::filesystem::path dir(templ);
    RankLaunch l;
    l.exe = std::filesystem::canonical("/proc/self/exe").string();
    l.args.assign(argv + 1, argv + argc);
    l.world = o.tp;
    l.dir = dir.string();
    l.deadline = std::chrono::minutes(10);
    const auto outcomes = run_ranks(l);
    if (const RankOutcome* f = first_failure(outcomes)) {
      std::cerr << "tp_collectives: " << f->describe() << "\n";
      std::filesystem::remove_all(dir);
      return 1;
    }
    std::ifstream table(dir / "table.txt");
    std::cout << table.rdbuf();
    std::filesystem::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tp_collectives: " << e.what() << "\n";
    return 2;
  }
}
