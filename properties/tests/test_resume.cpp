// properties/tests/test_resume.cpp: resume consistency as a state machine (RapidCheck's rc::state) over
// the commands advance (k micro-batches), save, and restore-into-a-fresh-run, checked against the
// uninterrupted run's state digest at every position; the state file refusing truncated, corrupted,
// wrong-version and wrong-model input. (The resume faults are in test_properties.cpp's catalogue.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>
#include <filesystem>
#include <fstream>

#include "properties/generators.hpp"
#include "properties/property.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv {
namespace {

// ---- the state machine ----
struct Model {
  int position = 0, saved = -1, end = 0, micro = 1;
  bool whole_steps = false;  // sched=ffbb: only step boundaries
};

struct Sut {
  Case c;
  std::unique_ptr<CheckpointImpl> impl;
  std::unique_ptr<TrainingRun> run;
  std::string saved;                 // the encoded state file
  std::vector<std::string> digests;  // the uninterrupted run's digest at every position
};
using Cmd = rc::state::Command<Model, Sut>;

struct Advance : Cmd {
  int k = 0;
  explicit Advance(const Model& m) {
    const int left = m.end - m.position;
    if (left <= 0) return;
    k = m.whole_steps ? m.micro * *rc::gen::inRange(1, left / m.micro + 1) : *rc::gen::inRange(1, left + 1);
  }
  void checkPreconditions(const Model& m) const override { RC_PRE(k > 0 && m.position + k <= m.end); }
  void apply(Model& m) const override { m.position += k; }
  void run(const Model& m, Sut& s) const override {
    s.run->advance_to(m.position + k);
    RC_ASSERT(s.run->position() == m.position + k);
    RC_ASSERT(s.run->digest() == s.digests.at(static_cast<size_t>(m.position + k)));
  }
  void show(std::ostream& os) const override { os << "advance " << k; }
};

struct Save : Cmd {
  explicit Save(const Model&) {}
  void apply(Model& m) const override { m.saved = m.position; }
  void run(const Model&, Sut& s) const override { s.saved = encode_state(s.run->state(StateFault::none)); }
  void show(std::ostream& os) const override { os << "save"; }
};

struct RestoreFresh : Cmd {
  explicit RestoreFresh(const Model&) {}
  void checkPreconditions(const Model& m) const override { RC_PRE(m.saved >= 0); }
  void apply(Model& m) const override { m.position = m.saved; }
  void run(const Model& m, Sut& s) const override {
    s.impl = make_impl(s.c.impl);  // a fresh implementation, model and optimizer, as a new process has
    s.run = std::make_unique<TrainingRun>(s.c, s.impl.get());
    s.run->load(decode_state(s.saved, s.c));
    RC_ASSERT(s.run->position() == m.saved);
    RC_ASSERT(s.run->digest() == s.digests.at(static_cast<size_t>(m.saved)));
  }
  void show(std::ostream& os) const override { os << "restore-fresh"; }
};

RC_GTEST_PROP(Resume, AnySequenceOfStepsSavesAndFreshRestoresMatchesTheUninterruptedRun, ()) {
  CaseGenOptions o;
  o.force_dropout = true;
  Case c = *gen_case(o);
  c.steps = *rc::gen::inRange(2, 4);
  c.resume = 0;
  if (c.model.has(kExternal)) c.model.effects &= ~kExternal;  // never checkpointable: not a resume question
  c.opt = *rc::gen::element(Optimizer::sgd, Optimizer::adam);
  RC_TAG(c.opt == Optimizer::adam ? "adam" : "sgd");
  Sut s;
  s.c = c;
  {  // the uninterrupted run, one micro-batch (ffbb: one step) at a time
    auto impl = make_impl(c.impl);
    TrainingRun full(c, impl.get());
    const int stride = c.sched == Schedule::ffbb ? c.micro : 1;
    s.digests.assign(static_cast<size_t>(full.end() + 1), "");
    s.digests[0] = full.digest();
    while (full.position() < full.end()) {
      full.advance_to(full.position() + stride);
      s.digests[static_cast<size_t>(full.position())] = full.digest();
    }
  }
  s.impl = make_impl(c.impl);
  s.run = std::make_unique<TrainingRun>(c, s.impl.get());
  Model m;
  m.end = c.steps * c.micro, m.micro = c.micro, m.whole_steps = c.sched == Schedule::ffbb;
  rc::state::check(m, s, rc::state::gen::execOneOfWithArgs<Advance, Advance, Save, RestoreFresh>());
}

// ---- the state file ----
const char* kLine =
    "layers=2 d=8 heads=2 ffn=2 vocab=5 drop=0.2 fx=counter,log,bn,cache,noise batch=2 seq=4 steps=3 micro=2 "
    "opt=adam plan=block seed=3";

std::string saved_mid_step(const Case& c) {
  auto impl = make_builtin();
  TrainingRun run(c, impl.get());
  run.advance_to(3);  // step 1, after micro-batch 0
  return encode_state(run.state(StateFault::none));
}

void expect_refused(const std::string& bytes, const Case& c, const std::string& must_mention) {
  try {
    decode_state(bytes, c);
    ADD_FAILURE() << "accepted a state that should be refused (" << must_mention << ")";
  } catch (const StateError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(must_mention), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(StateFile, RoundTripsAndContinuesBitwise) {
  const Case c = case_from_line(kLine);
  const std::string bytes = saved_mid_step(c);
  auto impl = make_builtin();
  TrainingRun resumed(c, impl.get());
  resumed.load(decode_state(bytes, c));
  EXPECT_EQ(encode_state(resumed.state(StateFault::none)), bytes);
  resumed.advance_to(resumed.end());
  auto impl2 = make_builtin();
  TrainingRun full(c, impl2.get());
  full.advance_to(full.end());
  EXPECT_EQ(resumed.digest(), full.digest());
}

TEST(StateFile, TruncatedCorruptedWrongVersionAndWrongModelAreRefused) {
  const Case c = case_from_line(kLine);
  const std::string bytes = saved_mid_step(c);
  for (size_t n : {size_t{0}, size_t{5}, size_t{20}, bytes.find('\n', 16), bytes.size() / 2, bytes.size() - 1})
    expect_refused(bytes.substr(0, n), c, n < 15 ? "not a ckverify state file" : "truncated");
  for (size_t at : {bytes.size() / 3, bytes.size() / 2, bytes.size() - 20, bytes.size() - 3}) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    expect_refused(bad, c, "corrupted");
  }
  std::string v2 = bytes;
  v2.replace(v2.find("\"version\":1"), 11, "\"version\":2");
  expect_refused(v2, c, "format version 2");
  Case other = c;
  other.model.d_model = 16;
  expect_refused(bytes, other, "another model or data");
  Case other_seed = c;
  other_seed.seed = 4;
  expect_refused(bytes, other_seed, "another model or data");
  // What may change across a resume: the plan, the implementation, the number of steps.
  Case replanned = c;
  replanned.plan = Plan{PlanKind::none, 0};
  replanned.steps = 5;
  EXPECT_NO_THROW(decode_state(bytes, replanned));
}

TEST(StateFile, AFileLargerThanAnyStateOfTheCaseIsRefusedBeforeItIsRead) {
  const Case c = case_from_line(kLine);
  const std::string bytes = saved_mid_step(c);
  EXPECT_LT(bytes.size(), state_bytes_bound(c));
  Case big = c;
  big.model.layers = 24, big.model.d_model = 64;
  EXPECT_GT(state_bytes_bound(big), state_bytes_bound(c));
  const auto dir = std::filesystem::temp_directory_path() / ("ckv-state-bound-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "huge.state").string();
  { std::ofstream(path, std::ios::binary) << bytes; }
  EXPECT_NO_THROW(load_state_file(path, c));
  std::filesystem::resize_file(path, state_bytes_bound(c) + 1);  // sparse: nothing is written
  try {
    load_state_file(path, c);
    ADD_FAILURE() << "a file larger than the bound was read";
  } catch (const StateError& e) {
    EXPECT_NE(std::string(e.what()).find("more than a state of this Case can take"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckv
