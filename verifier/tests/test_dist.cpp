// verifier/tests/test_dist.cpp: the multi-process substrate of tensor- and data-parallel Cases
// (verifier/dist/): ranks joined over Gloo on 127.0.0.1, the tensor-parallel collectives against an
// unsharded computation, the ledger under a checkpoint's recompute, and the launcher's accounting of
// ranks that fail, crash, hang or leave processes behind. The ranks are dist_rank (dist_rank.cpp), exec'd,
// or forked by a rank fork server (fork_server.hpp) started in this process before main.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "verifier/dist/collectives.hpp"
#include "verifier/dist/fork_server.hpp"
#include "verifier/dist/proc.hpp"
#include "verifier/dist/ranks.hpp"
#include "verifier/dist/rng_tracker.hpp"
#include "verifier/tests/dist_rank.hpp"

namespace ckv::dist {
namespace {
namespace fs = std::filesystem;

// What a rank forked by a fork server finds of itself (scenario "fork_facts"), one line: the pid of the
// process that started the server (kept in memory: an exec'd program would not know it), its parent, its
// descriptors, threads, two variables and SIGUSR1's disposition.
pid_t creator_pid = 0;
void on_usr1(int) {}
int fork_facts() {
  const RankEnv env = RankEnv::from_environment();
  std::string fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    std::vector<int> open;
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.' && std::atoi(e->d_name) != ::dirfd(d)) open.push_back(std::atoi(e->d_name));
    ::closedir(d);
    std::sort(open.begin(), open.end());
    for (int fd : open) fds += (fds.empty() ? "" : ",") + std::to_string(fd);
  }
  int threads = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/task")) threads += e.is_directory() ? 1 : 0;
  struct sigaction usr1 {};
  ::sigaction(SIGUSR1, nullptr, &usr1);
  const char* late = std::getenv("CKV_TEST_LATE");
  const std::string dir = env.store.substr(0, env.store.rfind('/'));
  std::ofstream(dir + "/result" + std::to_string(env.rank) + ".txt")
      << "creator=" << creator_pid << " parent=" << ::getppid() << " fds=" << fds << " threads=" << threads
      << " late=" << (late ? late : "unset") << " gone=" << (std::getenv("CKV_TEST_GONE") ? "set" : "unset")
      << " usr1=" << (usr1.sa_handler == SIG_DFL ? "default" : "handled") << " rank=" << env.rank
      << " world=" << env.world << "\n";
  return 0;
}
int server_entry(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "fork_facts") return fork_facts();
  return dist_rank_main(argc, argv);
}

// Two servers, started before main while this process is single-threaded and has run nothing (as a
// worker starts its own): `main` for the tests, `victim` to be killed. Before they start, a variable is
// set and a SIGUSR1 handler installed that their ranks must not see.
struct Servers {
  std::unique_ptr<RankForkServer> main, victim;
  Servers() {
    creator_pid = ::getpid();
    ::setenv("CKV_TEST_GONE", "1", 1);
    std::signal(SIGUSR1, on_usr1);
    main = RankForkServer::start(server_entry);
    victim = RankForkServer::start(server_entry);
    ::unsetenv("CKV_TEST_GONE");
    std::signal(SIGUSR1, SIG_DFL);
  }
};
Servers servers;

class Dist : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(CKVERIFY_TEST_TMP) /
           ("dist-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // dist_rank `args` on `world` ranks in this test's directory.
  RankLaunch launch(const std::vector<std::string>& args, int world, int deadline_ms = 60000) const {
    RankLaunch l;
    l.exe = CKVERIFY_DIST_RANK;
    l.args = args;
    l.world = world;
    l.dir = dir_.string();
    l.deadline = std::chrono::milliseconds(deadline_ms);
    return l;
  }
  std::vector<RankOutcome> run(const std::vector<std::string>& args, int world, int deadline_ms = 60000,
                               int grace_ms = 3000) {
    RankLaunch l = launch(args, world, deadline_ms);
    l.grace = std::chrono::milliseconds(grace_ms);
    l.while_waiting = [this] { ++waits_; };
    return via_ ? via_->run(l) : run_ranks(l);
  }
  std::string result(int rank) const {
    std::ifstream in(dir_ / ("result" + std::to_string(rank) + ".txt"));
    std::string line;
    std::getline(in, line);
    return line;
  }
  // Runs `args` on `world` ranks, every one of which must succeed and write `want`.
  void expect_every_rank(const std::vector<std::string>& args, int world, const std::string& want) {
    const auto o = run(args, world);
    ASSERT_EQ(first_failure(o), nullptr) << describe(o);
    for (int r = 0; r < world; ++r) EXPECT_EQ(result(r), want) << args.back() << ", rank " << r;
  }
  static std::string describe(const std::vector<RankOutcome>& o) {
    std::string s;
    for (const auto& r : o) s += r.describe() + "\n";
    return s;
  }
  fs::path dir_;
  RankForkServer* via_ = nullptr;  // the server that launches run()'s ranks; null: run_ranks here
  int waits_ = 0;                  // while_waiting's calls
};

TEST_F(Dist, RanksJoinAndReduceAcrossProcesses) {
  expect_every_rank({"all_reduce"}, 3, "6");
}

// Column-parallel fc1 and row-parallel fc2 on 2 ranks give the unsharded MLP's output and gradients
// (each rank checks its own shard); the ledger: one forward all-reduce (leaving the region), one
// backward all-reduce (the input's gradient entering it), nothing in a recompute.
TEST_F(Dist, TensorParallelMlpMatchesTheUnshardedOne) {
  expect_every_rank({"tp_mlp", "plain"}, 2,
                    "1 0 1 128 | all_reduce/forward/mlp.out all_reduce/backward/mlp.in");  // 4x8 floats
}

// Under the builtin checkpoint the gradients still match. Run to the end, the recompute repeats the
// region's forward all-reduce (recorded as recompute) and issues no backward one twice; with early stop
// (the default) it ends at fc2's saved tensors, before the all-reduce, and repeats nothing.
TEST_F(Dist, ARecomputeRepeatsOnlyForwardCollectives) {
  expect_every_rank({"tp_mlp", "checkpoint-full"}, 2,
                    "1 1 1 128 | all_reduce/forward/mlp.out all_reduce/recompute/mlp.out all_reduce/backward/mlp.in");
  expect_every_rank({"tp_mlp", "checkpoint"}, 2, "1 0 1 128 | all_reduce/forward/mlp.out all_reduce/backward/mlp.in");
}

// The tracker: model-parallel masks differ across the tensor-parallel ranks, replicated ones do not.
// A checkpoint shown the tracker's generators replays both and gives the plain run's gradients on every
// rank; one that replays only the default generator recomputes other model-parallel masks (the bug of
// a tracker not restored in the recompute), and the gradients show it.
TEST_F(Dist, TheTrackerSeparatesStreamsAndACheckpointMustReplayThem) {
  expect_every_rank({"tp_dropout", "plain"}, 2, "differ equal");
  expect_every_rank({"tp_dropout", "checkpoint"}, 2, "match");
  expect_every_rank({"tp_dropout", "checkpoint-unshown"}, 2, "differ");
}

// The sharded Transformer on 2 tensor-parallel ranks, three models (dist_rank.cpp, tp_transformer): each
// rank's loss, input gradient and parameter-gradient slices equal the unsharded fp64 reference's fed the
// masks gathered from both ranks; the ledger: one forward all-reduce leaving each of the 4 regions (2
// layers, attention and FFN), one backward all-reduce entering each. Under the builtin checkpoint shown
// the tracker the same holds, and the recompute repeats all 4 forward all-reduces (a block's last saved
// tensors lie after its FFN's reduction, so early stop spares none); shown only the default generator,
// the recompute draws other model-parallel masks.
TEST_F(Dist, TheShardedTransformerMatchesTheUnshardedReference) {
  expect_every_rank({"tp_transformer", "plain"}, 2, "held 4/0/4 ; held 4/0/4 ; held 4/0/4");
}

TEST_F(Dist, TheShardedTransformerUnderACheckpointReplaysTheTrackersStream) {
  expect_every_rank({"tp_transformer", "checkpoint"}, 2, "held 4/4/4 ; held 4/4/4 ; held 4/4/4");
  // The selective plan: each forward all-reduce's output kept, the recompute repeats none of them.
  expect_every_rank({"tp_transformer", "checkpoint-selective"}, 2, "held 4/0/4 ; held 4/0/4 ; held 4/0/4");
  const auto u = run({"tp_transformer", "checkpoint-unshown"}, 2);
  ASSERT_EQ(first_failure(u), nullptr) << describe(u);
  for (int r = 0; r < 2; ++r) EXPECT_NE(result(r).find("recompute-masks"), std::string::npos) << result(r);
}

// Parallel consistency (shard.hpp) names the two seeding bugs of model-parallel RNG: a tracker seeded
// equally on every tensor-parallel rank draws equal model-parallel masks; a default generator seeded per
// rank (replicated dropout from a per-rank stream) draws replicated masks that differ (the reference
// comparison fails there too). In the first case the reference comparison, fed the gathered masks,
// holds: only the consistency check sees it.
TEST_F(Dist, ParallelConsistencyNamesTheSeedingBugs) {
  const auto same = run({"tp_transformer", "same-seed"}, 2);
  ASSERT_EQ(first_failure(same), nullptr) << describe(same);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(result(r),
              "differs:model-parallel-masks-equal 4/0/4 ; differs:model-parallel-masks-equal 4/0/4 ; "
              "differs:model-parallel-masks-equal 4/0/4");
  const auto own = run({"tp_transformer", "rank-seeded-default"}, 2);
  ASSERT_EQ(first_failure(own), nullptr) << describe(own);
  for (int r = 0; r < 2; ++r) EXPECT_NE(result(r).find("replicated-masks-differ"), std::string::npos) << result(r);
}

// The ledger rule on the sharded Transformer: the builtin's recompute repeats forward all-reduces only,
// and with the outputs kept none; a reentrant design that differentiates its recompute in two passes
// issues each region's backward all-reduce twice: the rule names the 4 regions' entries although the
// gradients are right.
TEST_F(Dist, TheLedgerRuleCatchesARecomputeRepeatingABackwardCollective) {
  expect_every_rank({"tp_ledger", "checkpoint"}, 2, "rule=0 match");
  expect_every_rank({"tp_ledger", "kept"}, 2, "rule=0 match");
  expect_every_rank({"tp_ledger", "two-pass"}, 2,
                    "rule=4 layer0.attn.in: 2 backward all_reduce, 1 without checkpointing match");
}

// A rank holding another rank's slice is caught by the reference comparison, by name.
TEST_F(Dist, AShardHoldingTheWrongSliceIsCaught) {
  const auto o = run({"tp_transformer", "wrong-slice"}, 2);
  ASSERT_EQ(first_failure(o), nullptr) << describe(o);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(result(r).find("differs:"), std::string::npos) << result(r);
    EXPECT_NE(result(r).find("layer0.attn.wq.weight"), std::string::npos) << result(r);
  }
}

// Data parallelism (dist_rank.cpp, dp_transformer): two replicas on their own data, two micro-batches,
// blocks tied to layer 0: with the DDP-style reducer every replica holds the mean of the replicas'
// reference gradients, and each parameter's hook fired once per backward (the 20 parameters of the
// tied model, reduced after each of 2 backwards: 40 backward all-reduces), plainly and under the
// builtin checkpoint. Under a reentrant checkpoint whose recompute runs a nested backward the 16 tied
// block parameters are accumulated, and reduced, once per block: the hook fires twice, the ledger
// shows the extra reductions ((2 x 16 + 4) x 2 = 72). The values stay right (averaging replicated
// values again changes nothing), which is why the fire count, not the gradient, shows the bug.
TEST_F(Dist, TheReducerAveragesOverReplicasAndItsHookFiresOnce) {
  expect_every_rank({"dp_transformer", "plain"}, 2, "held fires=1 40 rule=0");
  expect_every_rank({"dp_transformer", "checkpoint"}, 2, "held fires=1 40 rule=0");
}

TEST_F(Dist, ANestedBackwardMakesTheReducerHookFireTwice) {
  // The ledger rule names it too: 16 labels with more backward all-reduces than without checkpointing.
  expect_every_rank({"dp_transformer", "nested"}, 2,
                    "held fires=2 72 rule=16 dp.0: 4 backward all_reduce, 2 without checkpointing");
}

// A replica whose backward leaves a parameter's gradient undefined still joins its reduction (with zeros)
// and ends with the average, as the other does; without that the other waits in the collective until
// the group's timeout. A parameter moved to another dtype after the reducer hooked it, a backward with
// create_graph through the hooks, and a checkpointed call that leaves one kept region twice are refused
// on every rank, by name.
TEST_F(Dist, TheReducersEdgesAreHandledOrRefused) {
  expect_every_rank({"dp_edge", "undefined"}, 2, "fires=1 grad=1,1,1");
  for (const auto& [mode, message] : std::vector<std::pair<std::string, std::string>>{
           {"set_data", "has a new gradient accumulator"},
           {"create_graph", "create_graph through a data-parallel reducer"},
           {"keep_twice", "left twice in one checkpointed call"}}) {
    const auto o = run({"dp_edge", mode}, 2);
    for (const auto& r : o) {
      EXPECT_EQ(r.status, RankOutcome::Status::failed) << mode << ": " << r.describe();
      EXPECT_NE(r.describe().find(message), std::string::npos) << mode << ": " << r.describe();
    }
  }
}

// The ledger rule counts repeats: a backward collective issued more often than without checkpointing,
// where the run without checkpointing issued it. One it never issued (the stack's input made to require
// grad, as Hugging Face's enable_input_require_grads does for a reentrant checkpoint) is a gradient path
// of its own, extra communication and not a recompute's repeat.
TEST(LedgerRule, CountsRepeatsOfTheBackwardCollectivesThePlainRunIssued) {
  using ckv::dist::CollectiveRecord, ckv::dist::Pass, ckv::dist::Collective;
  auto rec = [](Pass pass, const char* where) {
    return CollectiveRecord{Collective::all_reduce, pass, 64, where, 0.0};
  };
  const std::vector<CollectiveRecord> plain = {rec(Pass::forward, "layer0.attn.out"),
                                               rec(Pass::backward, "layer1.attn.in")};
  std::vector<CollectiveRecord> test = plain;
  test.push_back(rec(Pass::recompute, "layer0.attn.out"));  // a recompute repeating a forward collective
  test.push_back(rec(Pass::backward, "layer0.attn.in"));    // the input made to require grad
  EXPECT_TRUE(ckv::dist::ledger_violations(plain, test).empty());
  test.push_back(rec(Pass::backward, "layer1.attn.in"));  // repeated
  const std::vector<std::string> v = ckv::dist::ledger_violations(plain, test);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0], "layer1.attn.in: 2 backward all_reduce, 1 without checkpointing");
}

// The tracker's streams saved and set again draw the same numbers; a state of other streams, or one
// set while a stream is forked, is refused.
TEST(RngTrackerState, SavedStatesReplayTheStreams) {
  RngTracker t;
  t.add("model-parallel", 3);
  t.add("expert", 4);
  auto draw = [&](const char* name) {
    const auto fork = t.fork(name);
    return torch::rand({5});
  };
  draw("model-parallel");
  const auto saved = t.states();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].first, "expert");  // name order
  const torch::Tensor a = draw("model-parallel"), b = draw("expert");
  t.set_states(saved);
  EXPECT_TRUE(torch::equal(draw("model-parallel"), a));
  EXPECT_TRUE(torch::equal(draw("expert"), b));
  RngTracker other;
  other.add("model-parallel", 3);
  EXPECT_THROW(other.set_states(saved), std::invalid_argument);
  RngTracker joined;  // one stream whose name is the others' joined: not the same streams
  joined.add("expert,model-parallel", 3);
  EXPECT_THROW(joined.set_states(saved), std::invalid_argument);
  // A bad state for one stream changes none of them.
  auto bad = saved;
  bad[1].second = torch::zeros({7}, torch::kUInt8);
  const torch::Tensor before = t.states()[0].second;
  draw("expert");
  const torch::Tensor advanced = t.states()[0].second;
  EXPECT_THROW(t.set_states(bad), std::invalid_argument);
  EXPECT_TRUE(torch::equal(t.states()[0].second, advanced));
  EXPECT_FALSE(torch::equal(advanced, before));
  const auto fork = t.fork("expert");
  EXPECT_THROW(t.set_states(saved), std::logic_error);
  EXPECT_THROW(t.states(), std::logic_error);
}

TEST_F(Dist, AFailingRankIsNamedWithItsMessage) {
  const auto o = run({"fail"}, 2);
  const RankOutcome* f = first_failure(o);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->status, RankOutcome::Status::failed);
  EXPECT_EQ(f->code, 3);
  EXPECT_NE(f->describe().find("planted failure"), std::string::npos) << f->describe();
  EXPECT_EQ(o[0].status, RankOutcome::Status::ok);
}

// Rank 1 aborts; rank 0 waits for it in a collective and is killed after the grace period: the crash is
// what is reported first, not rank 0's wait.
TEST_F(Dist, ACrashIsBlamedOnTheRankThatCrashed) {
  const auto start = std::chrono::steady_clock::now();
  const auto o = run({"crash"}, 2, 60000, 1000);
  const RankOutcome* f = first_failure(o);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->rank, 1) << describe(o);
  EXPECT_EQ(f->status, RankOutcome::Status::crashed);
  EXPECT_EQ(f->code, SIGABRT);
  EXPECT_NE(o[0].status, RankOutcome::Status::ok) << describe(o);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "rank 0 was not stopped";
}

// (The deadline leaves rank 0 time to load LibTorch on a loaded machine.)
TEST_F(Dist, AHungRankIsKilledAtTheDeadline) {
  const auto o = run({"hang"}, 2, 6000);
  EXPECT_EQ(o[0].status, RankOutcome::Status::ok);
  EXPECT_EQ(o[1].status, RankOutcome::Status::timed_out) << describe(o);
  ASSERT_NE(first_failure(o), nullptr);
  EXPECT_EQ(first_failure(o)->rank, 1);
}

// Gone means no /proc entry, or a zombie waiting for whoever inherited it.
bool process_gone(int pid) {
  const fs::path proc = fs::path("/proc") / std::to_string(pid);
  for (int i = 0; i < 300; ++i) {
    std::ifstream stat(proc / "stat");
    std::string p, comm, state;
    if (!(stat >> p >> comm >> state) || state == "Z") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A rank that leaves the ranks' process group is still killed at the deadline (by its pid), and
// run_ranks returns.
TEST_F(Dist, ARankThatLeavesTheGroupIsStillKilled) {
  const auto start = std::chrono::steady_clock::now();
  const auto o = run({"escape"}, 2, 2000);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(o[1].status, RankOutcome::Status::timed_out) << describe(o);
  EXPECT_TRUE(process_gone(std::stoi(result(1))));
}

// The rank that failed first is the cause, not the one that failed later because of it.
TEST_F(Dist, TheFirstFailureInTimeIsTheCause) {
  const auto o = run({"ordered_failure"}, 2);
  const RankOutcome* f = first_failure(o);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->rank, 1) << describe(o);
  EXPECT_NE(f->describe().find("the real cause"), std::string::npos);
  EXPECT_LT(o[1].ended, o[0].ended);
}

TEST_F(Dist, AFloodedStandardErrorGivesABoundedTail) {
  const auto o = run({"flood"}, 2);
  EXPECT_EQ(o[0].status, RankOutcome::Status::failed);
  EXPECT_LT(o[0].stderr_tail.size(), 1000u);
  EXPECT_NE(o[0].stderr_tail.find("the end"), std::string::npos) << o[0].stderr_tail.substr(0, 200);
}

// A rank stopped from outside (SIGSTOP) is reported as seen stopped, and only that rank, whether the
// ranks are exec'd or forked by a server; a rank never stopped is not.
TEST_F(Dist, ARankStoppedFromOutsideIsSeenStopped) {
  for (RankForkServer* via : {static_cast<RankForkServer*>(nullptr), servers.main.get()}) {
    via_ = via;
    const auto o = run({"self_stop"}, 2, 60000, 1000);
    ASSERT_EQ(o.size(), 2u);
    EXPECT_EQ(o[0].status, RankOutcome::Status::failed) << describe(o);
    EXPECT_EQ(o[1].status, RankOutcome::Status::stopped_after_failure) << describe(o);
    EXPECT_FALSE(o[0].seen_stopped) << (via ? "server" : "exec");
    EXPECT_TRUE(o[1].seen_stopped) << (via ? "server" : "exec");
  }
  via_ = nullptr;
  const auto o = run({"all_reduce"}, 2);
  ASSERT_EQ(first_failure(o), nullptr) << describe(o);
  EXPECT_FALSE(o[0].seen_stopped || o[1].seen_stopped);
}

// /proc as the stop checks read it: a stopped child is seen stopped, with its parent; a process that
// ends between the open of its stat and the read is gone, not an error (std::ifstream threw there,
// seen in CI as "internal error: basic_filebuf::underflow error reading the file").
TEST(Proc, StateParentAndAProcessThatEndsWhileRead) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::raise(SIGSTOP);
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_TRUE(process_stopped(child));
  EXPECT_EQ(stopped_child({::getpid()}), child);
  const std::optional<ProcStat> s = proc_stat(child);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->parent, ::getpid());
  const int fd = ::open(("/proc/" + std::to_string(child) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(read_proc_stat(fd).has_value());
  ::close(fd);
  EXPECT_FALSE(proc_stat(child).has_value());
  EXPECT_FALSE(process_stopped(child));
  EXPECT_EQ(stopped_child({::getpid()}), 0);
}

// Two disjoint subgroups of one name are two groups: {0,1} sums 1+2, {2,3} sums 3+4.
TEST_F(Dist, SubgroupsOfOneNameDoNotMeet) {
  const auto o = run({"same_name"}, 4);
  ASSERT_EQ(first_failure(o), nullptr) << describe(o);
  EXPECT_EQ(result(0), "3");
  EXPECT_EQ(result(1), "3");
  EXPECT_EQ(result(2), "7");
  EXPECT_EQ(result(3), "7");
}

TEST_F(Dist, CollectivesOfDifferentSizesAreRefusedOnEveryRank) {
  expect_every_rank({"shape_mismatch"}, 2, "refused");
  // Tensors too large to travel with their check, one on each side of that line, and ranks in other
  // collectives.
  expect_every_rank({"exchange", "large_mismatch"}, 2, "refused");
  expect_every_rank({"exchange", "straddle"}, 3, "refused");
  expect_every_rank({"exchange", "kinds"}, 3, "refused");
}

// Small tensors are summed on every rank, larger ones by Gloo: both give the sum, the same bytes on every
// rank, and on two ranks the same bytes as each other; messages longer than a block arrive whole; and
// none of it is charged to the memory account of the run whose step it is.
TEST_F(Dist, SumsAreTheSameOnEveryRankWhicheverWayTheyTravel) {
  for (const int world : {2, 3}) {
    const auto o = run({"exchange", "sums"}, world);
    ASSERT_EQ(first_failure(o), nullptr) << describe(o);
    EXPECT_EQ(result(0).rfind("summed ", 0), 0u) << world << " ranks: " << result(0);
    for (int r = 1; r < world; ++r) EXPECT_EQ(result(r), result(0)) << world << " ranks, rank " << r;
  }
  expect_every_rank({"exchange", "bytes"}, 3, "gathered");
  expect_every_rank({"exchange_memory"}, 2, "uncharged");
}

TEST_F(Dist, CreateGraphThroughARegionIsRefusedNotFirstOrder) {
  expect_every_rank({"create_graph"}, 2, "refused");
}

TEST_F(Dist, TheRanksDieWithTheProcessThatStartedThem) {
  const pid_t starter = ::fork();
  if (starter == 0) {
    const RankLaunch l = launch({"sleep_pid"}, 2, 120000);
    try {
      run_ranks(l);
    } catch (...) {
    }
    ::_exit(0);
  }
  ASSERT_GT(starter, 0);
  std::vector<int> ranks;
  for (int i = 0; i < 1000 && ranks.size() < 2; ++i) {
    ranks.clear();
    for (int r = 0; r < 2; ++r)
      if (!result(r).empty()) ranks.push_back(std::stoi(result(r)));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(starter, SIGKILL);
  ::waitpid(starter, nullptr, 0);
  ASSERT_EQ(ranks.size(), 2u) << "the ranks did not start";
  for (int pid : ranks) EXPECT_TRUE(process_gone(pid)) << "rank process " << pid << " outlived its starter";
}

TEST_F(Dist, RefusedLaunches) {
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGCHLD, &ignore, &old);
  EXPECT_THROW(run({"all_reduce"}, 2), std::logic_error);
  ::sigaction(SIGCHLD, &old, nullptr);
  RankLaunch l;
  l.exe = CKVERIFY_DIST_RANK;
  l.dir = (dir_ / "missing").string();
  EXPECT_THROW(run_ranks(l), std::invalid_argument);
  l.dir = dir_.string();
  l.exe = (dir_ / "no-such-program").string();
  try {
    run_ranks(l);
    ADD_FAILURE() << "a missing program started";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start rank 0"), std::string::npos) << e.what();
  }
}

// Gloo gathers a list of tensors at once (one collective when small): every dtype and shape comes back as it was
// sent, from every rank; lists of other lengths, or a tensor of another size, are refused on every rank,
// naming the difference.
TEST_F(Dist, AListOfTensorsIsGatheredAtOnceOrRefused) {
  expect_every_rank({"gather_many"}, 3, "gathered");
  expect_every_rank({"gather_many", "mismatch"}, 2, "refused");
  expect_every_rank({"gather_many", "length"}, 2, "refused");
}

// A rank forked by the server is the program afresh, not a copy of the launcher as it is now: the
// server's memory from when it started (the creator's pid, which an exec'd program would not know), no
// descriptor but 0, 1 and 2, one thread, no handler the starter had installed, and the environment the
// launcher has at the launch (a variable set since then is there, byte for byte, one unset since is not).
TEST_F(Dist, AForkServerStartsEachRankAsTheProgramAfresh) {
  ASSERT_NE(servers.main, nullptr) << "the fork server did not start";
  via_ = servers.main.get();
  ::setenv("CKV_TEST_LATE", "yes\xff", 1);  // not UTF-8: it must arrive byte for byte
  const auto o = run({"fork_facts"}, 2);
  ::unsetenv("CKV_TEST_LATE");
  ASSERT_EQ(first_failure(o), nullptr) << describe(o);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(result(r), "creator=" + std::to_string(::getpid()) + " parent=" + std::to_string(via_->pid()) +
                             " fds=0,1,2 threads=1 late=yes\xff gone=unset usr1=default rank=" + std::to_string(r) +
                             " world=2");
}

// Through the server the outcomes are run_ranks's own: collectives, a failure with its message, a crash
// blamed on its rank, a hang killed at the deadline; while_waiting is called as the ranks run.
TEST_F(Dist, AForkServersRanksAreAccountedForAsExecdOnes) {
  ASSERT_NE(servers.main, nullptr);
  via_ = servers.main.get();
  expect_every_rank({"all_reduce"}, 2, "3");
  expect_every_rank({"gather_many"}, 2, "gathered");
  EXPECT_GT(waits_, 0);
  auto o = run({"fail"}, 2);
  ASSERT_NE(first_failure(o), nullptr);
  EXPECT_EQ(first_failure(o)->rank, 1);
  EXPECT_EQ(first_failure(o)->code, 3);
  EXPECT_NE(first_failure(o)->describe().find("planted failure"), std::string::npos) << describe(o);
  o = run({"crash"}, 2, 60000, 1000);
  ASSERT_NE(first_failure(o), nullptr);
  EXPECT_EQ(first_failure(o)->rank, 1) << describe(o);
  EXPECT_EQ(first_failure(o)->status, RankOutcome::Status::crashed);
  EXPECT_EQ(first_failure(o)->code, SIGABRT);
  o = run({"hang"}, 2, 3000);
  EXPECT_EQ(o[0].status, RankOutcome::Status::ok) << describe(o);
  EXPECT_EQ(o[1].status, RankOutcome::Status::timed_out) << describe(o);
  EXPECT_THROW(run({"all_reduce"}, 0), std::invalid_argument);  // run_ranks's refusal, passed on
  EXPECT_TRUE(via_->alive());
}

bool process_gone(int pid);

// A server killed from outside takes its ranks with it and says so (ForkServerKilled: nothing judged),
// and launch_ranks execs the ranks itself from then on.
TEST_F(Dist, AForkServerKilledFromOutsideTakesItsRanksAndIsNotUsedAgain) {
  ASSERT_NE(servers.victim, nullptr);
  const pid_t server = servers.victim->pid();
  install_fork_server(std::move(servers.victim));
  RankLaunch l = launch({"sleep_pid"}, 2);
  l.while_waiting = [&] {
    if (!result(0).empty() && !result(1).empty()) ::kill(server, SIGKILL);
  };
  try {
    launch_ranks(l);
    ADD_FAILURE() << "a killed server went unreported";
  } catch (const ForkServerKilled& e) {
    EXPECT_EQ(e.signal, SIGKILL);
    EXPECT_NE(std::string(e.what()).find("rank fork server (pid " + std::to_string(server) + ")"), std::string::npos)
        << e.what();
  }
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(process_gone(std::stoi(result(r)))) << "rank " << r << " outlived the server";
  ASSERT_NE(installed_fork_server(), nullptr);
  EXPECT_FALSE(installed_fork_server()->alive());
  fs::remove(dir_ / "result0.txt"), fs::remove(dir_ / "result1.txt");
  l.args = {"all_reduce"};
  l.while_waiting = nullptr;
  const auto again = launch_ranks(l);
  install_fork_server(nullptr);
  EXPECT_EQ(first_failure(again), nullptr) << describe(again);
  EXPECT_EQ(result(0), "3");
}

// With a second thread in the process a fork could copy a lock that thread holds: no server.
TEST(RankForkServer, IsNotStartedInAProcessWithThreads) {
  std::promise<void> done;
  std::thread other([f = done.get_future()]() mutable { f.wait(); });
  EXPECT_EQ(RankForkServer::start(server_entry), nullptr);
  done.set_value();
  other.join();
}

TEST(RngTracker, AStreamIsForkedOnceAtATime) {
  RngTracker t;
  t.add("mp", 3);
  EXPECT_THROW(t.add("mp", 4), std::invalid_argument);
  {
    const auto f = t.fork("mp");
    EXPECT_THROW(t.fork("mp"), std::logic_error);
  }
  EXPECT_NO_THROW(t.fork("mp"));
  EXPECT_THROW(t.fork("other"), std::invalid_argument);
}

// A process a rank started and left running dies with the ranks.
TEST_F(Dist, NothingARankStartedOutlivesTheRun) {
  const auto o = run({"orphan"}, 2);
  ASSERT_EQ(first_failure(o), nullptr) << describe(o);
  const int child = std::stoi(result(0));
  ASSERT_GT(child, 0);
  EXPECT_TRUE(process_gone(child)) << "process " << child << " is still running";
}

// A launch's directory exists while it is in scope and goes, with what the ranks wrote, after.
TEST(LaunchDir, IsMadeAndRemovedWithItsContents) {
  std::string path;
  {
    const LaunchDir dir("ckverify-test-launch");
    ASSERT_TRUE(dir.made()) << dir.path();
    path = dir.path();
    EXPECT_TRUE(std::filesystem::is_directory(path));
    EXPECT_NE(path.find("ckverify-test-launch-"), std::string::npos);
    std::filesystem::create_directory(path + "/sub");
    std::ofstream(path + "/sub/rank0.out") << "x";
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace ckv::dist
