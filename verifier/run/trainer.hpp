// verifier/run/trainer.hpp: the run stage's training loop, private to verifier/run/ (run.hpp is the
// interface). One Trainer is one training run of a Case: the model on its device, the micro-batch loop in
// either schedule, the gradient hooks, the optimizer, the training state's save and load, and the
// experiments' modes (a throwing recompute, an input changed in place). observe.cpp runs the lockstep
// pair and the experiments with it; run.cpp exposes it as train() and TrainingRun.
#pragma once

#include <fmt/format.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "verifier/dist/collectives.hpp"
#include "verifier/dist/reducer.hpp"
#include "verifier/dist/rng_tracker.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/impls/traced_error.hpp"
#include "verifier/model/memory.hpp"
#include "verifier/model/model.hpp"
#include "verifier/run/optimizer.hpp"
#include "verifier/run/parallel.hpp"
#include "verifier/run/progress.hpp"
#include "verifier/run/run.hpp"
#include "verifier/run/state.hpp"

namespace ckv::run_detail {

// The process-wide state an implementation must leave as it found it: grad mode, the autocast state and
// the default dtype. One that does not makes everything after it wrong, the baseline's runs included, so
// it is the implementation's finding, reported where it happened (the state is put back first).
struct GlobalStateCheck {
  bool grad = torch::GradMode::is_enabled();
  compat::AutocastState autocast = compat::AutocastState::current();
  caffe2::TypeMeta dtype = c10::get_default_dtype();
  void expect_unchanged(const std::string& where) const {
    std::string what;
    if (torch::GradMode::is_enabled() != grad)
      what = grad ? "grad mode disabled" : "grad mode enabled";
    else if (compat::AutocastState::current() != autocast)
      what = "the autocast state changed";
    else if (c10::get_default_dtype() != dtype)
      what = "the default dtype set to " + std::string(c10::get_default_dtype().name());
    if (what.empty()) return;
    restore();
    throw std::runtime_error("the implementation left " + what + " after " + where +
                             " (it must restore the global state it changes)");
  }
  void restore() const {
    torch::GradMode::set_enabled(grad);
    autocast.apply();
    c10::set_default_dtype(dtype);
  }
};
// Puts the state back when a run of the implementation ends, however it ended (a run that threw may
// have left it changed; the runs after it, the baseline's included, must not inherit that).
struct RestoreGlobalState {
  const GlobalStateCheck& state;
  ~RestoreGlobalState() { state.restore(); }
};

inline std::string first_line(const std::string& s) {
  return sanitize(s.substr(0, s.find('\n')), 400);
}

inline torch::Tensor to_tensor(const std::vector<double>& v, std::vector<int64_t> shape, const torch::Device& d) {
  return torch::from_blob(const_cast<double*>(v.data()), shape, torch::kDouble).to(torch::kFloat).to(d);
}

// Which parameters train (freeze=alt / blocks), in layout order.
std::vector<bool> trainable_mask(const Case& c, const ParamSet& layout);
// Whether any input or parameter of each segment requires grad (so backward must reach through it).
std::vector<bool> gradient_flow(const Case& c, const std::vector<Segment>& segments,
                                const std::vector<bool>& trainable);
// A private directory for one run's files (the log module writes there).
std::string make_temp_dir();
// The Case validated, cut into its plan's segments, with its parameters, trainable mask and data.
Observations prepare(const Case& c);
// A strategy's Case: blocks as whole units, each its own segment, taking and returning the hidden state.
void check_strategy_case(const Case& c);

// The experiments' modes: a recompute made to throw; a segment input changed in place between forward
// and backward; the same forward and backward with the input left alone (the gradients of the forward
// an implementation ran, for one that recomputes from its own copy of the input).
enum class Mode { normal, throw_in_recompute, inplace_input, inplace_reference };

// One training run. The members live as long as the run: segment functions handed to the
// implementation capture references to them. With `par` (a Case with tp or dp > 1, parallel.hpp) the run
// is that rank's: under tp > 1 its model holds the rank's slice in a process group of the run's own,
// dropout inside the tensor-parallel regions draws from the run's model-parallel stream (seeded per
// rank), every SegmentCall shows that stream's generator, and the run's generator states include it;
// under dp > 1 it runs its replica's micro-batches of every step, and a reducer (dist/reducer.hpp)
// averages the gradients over the replicas after every accumulation.
class Trainer {
 public:
  Trainer(const Case& c, const Observations& o, CheckpointImpl* impl, Mode mode, int target_segment,
          const ParallelRun* par = nullptr)
      : c_(c),
        o_(o),
        impl_(impl),
        strategy_(impl != nullptr && impl->is_strategy()),
        mode_(mode),
        target_(target_segment),
        device_(c.device),
        account_(device_.type()),
        tap_(c.dropout_impl, c.dropout),
        parallel_fault_(parallel_fault_of(c)),
        dp_(par ? par->dp() : 1),
        micros_(par ? par->micro_count() : c.micro),
        first_local_(par ? par->first_micro() : 0),
        groups_(par ? par->run_groups() : RunGroups{}),
        tracker_(par && c.tp > 1 ? make_tracker(*par, c, parallel_fault_) : nullptr),
        collectives_(par ? std::make_shared<dist::CollectiveLedger>() : nullptr),
        model_(c.model, &tap_, &effects_,
               par && c.tp > 1 ? make_shard(*par, c, groups_.tp, tracker_.get(), collectives_, parallel_fault_)
                               : TensorShard{}) {
    const size_t layers = static_cast<size_t>(c.model.layers);
    effects_.counter.assign(layers, 0);
    effects_.external.assign(layers, 0);
    effects_.cache_calls.assign(layers, 0);
    if (c.ranks() > 1 && !par)
      throw EnvironmentError(
          "tp=" + std::to_string(c.tp) + " dp=" + std::to_string(c.dp) +
          ": a Case with tp or dp > 1 runs as ranks, under `ckverify check`, `repro` and `bench` only");
    if (c.model.has(kLog) || c.model.has(kExternal)) {
      log_dir_ = make_temp_dir();
      effects_.log_path = log_dir_ + "/effects.log";
      std::ofstream(effects_.log_path).flush();
    }
    torch::manual_seed(c.seed);  // dropout draws from the device's default generator
    rng_ = capture_rng();        // this run's own random streams (runs interleave step by step)
    model_.to(device_);
    model_.load(o.initial_params);
    model_.train();
    for (const auto& kv : model_.named_params()) params_.push_back(kv.second);
    hook_calls_ = std::make_shared<std::vector<int>>(params_.size(), 0);
    hook_input_max_ = std::make_shared<double>(0.0);
    optimizer_ = std::make_unique<OptimizerState>(c, params_);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!o.trainable[i]) {
        params_[i].requires_grad_(false);
        continue;
      }
      if (c.hook == Hook::none) continue;
      params_[i].register_hook([calls = hook_calls_, seen = hook_input_max_, i, h = c.hook](const torch::Tensor& g) {
        ++(*calls)[i];
        *seen = std::max(*seen, g.detach().abs().max().item<double>());
        return h == Hook::scale ? g * 0.5 : g.clamp(-kClipHook, kClipHook);
      });
    }
    // dp > 1: the replicas' gradients averaged after every accumulation (the hooks above run before it,
    // on each micro-batch's own gradient, as in one process).
    if (groups_.dp) {
      std::vector<std::string> names;
      for (const auto& kv : model_.named_params()) names.push_back(kv.first);
      reducer_ = std::make_unique<dist::GradReducer>(groups_.dp, params_, collectives_, std::move(names));
    }
    for (const auto& d : o.data) {  // one per micro-batch, each of its own sequence length (seqvar)
      x_.push_back(to_tensor(d.x, {d.batch, d.seq, c.model.input_width()}, device_));
      targets_.push_back(
          torch::from_blob(const_cast<int64_t*>(d.targets.data()), {d.batch, d.seq}, torch::kLong).clone().to(device_));
      y_.push_back(to_tensor(d.y, {d.batch, d.seq, c.model.vocab}, device_));
      if (c.model.key_padding) {
        torch::Tensor valid = torch::zeros({d.batch, d.seq}, torch::kBool);
        for (int b = 0; b < d.batch; ++b) valid[b].slice(0, 0, key_length(b, d.seq)).fill_(true);
        key_valid_.push_back(valid.to(device_));
      }
    }
    for (const auto& seg : o.segments) {
      units_.insert(units_.end(), seg.units.begin(), seg.units.end());
      // Every parameter the segment reads, shared ones once (the parameters are updated in place, so
      // the list holds for the whole run).
      std::vector<torch::Tensor> ps;
      for (const Unit& u : seg.units)
        for (const auto& p : model_.unit_params(u))
          if (std::none_of(ps.begin(), ps.end(), [&](const torch::Tensor& q) { return q.is_same(p); })) ps.push_back(p);
      segment_params_.push_back(std::move(ps));
    }
  }

  ~Trainer() {
    if (!log_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(log_dir_, ec);
    }
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step (the next one); throws what the step throws.
  StepRecord step(int step) {
    if (position_ != step * micros_) throw std::logic_error("Trainer::step out of order");
    std::vector<StepRecord> r = advance_to(position_ + micros_);
    return std::move(r.at(0));
  }
  // The position of this run after `global` micro-batches of the Case (each replica runs micro/dp of
  // every step: a position at a step boundary).
  int local_position(int global) const { return global / dp_; }
  // Runs this run's micro-batches until `position` of them are done (whole steps under sched=ffbb);
  // returns the records of the steps completed. The run's own generators are installed around it. Under
  // dp > 1 the run's micro-batches are its replica's: micro-batches first_local_ .. first_local_ +
  // micros_ - 1 of each step.
  std::vector<StepRecord> advance_to(int position) {
    const int M = micros_;
    std::vector<StepRecord> out;
    ChargeTo charge(&account_);
    rng_.restore();
    while (position_ < position) {
      progress();
      step_ = position_ / M;
      const int m = first_local_ + position_ % M;
      if (!in_step_) begin_step(/*fresh=*/position_ % M == 0);
      if (c_.sched == Schedule::ffbb) {
        for (int k = first_local_; k < first_local_ + M; ++k) forward(k);
        for (int k = first_local_ + M - 1; k >= first_local_; --k) backward(k);
        position_ += M;
      } else {
        forward(m), backward(m);
        ++position_;
      }
      if (position_ % M == 0) {
        StepRecord rec = end_step();
        rng_ = capture_rng();
        rec.ledger = ledger();
        out.push_back(std::move(rec));
      }
    }
    rng_ = capture_rng();
    return out;
  }
  int position() const { return position_; }
  void record_sites(bool on) { tap_.set_recording(on); }
  const TransformerImpl& model() const { return model_; }
  // tp > 1: the collectives the run issued, in order (empty otherwise).
  std::vector<dist::CollectiveRecord> collectives() const {
    return collectives_ ? collectives_->records() : std::vector<dist::CollectiveRecord>{};
  }

  // Continues from these parameters, running statistics and optimizer state (the baseline follows the
  // run under test step by step). On a sharded model: the unsharded record (gathered, parallel.hpp), or
  // with `shard_record` one of this rank's own runs.
  void load(const StepRecord& r, bool shard_record = false) {
    const TensorShard& sh = model_.shard();
    model_.load(r.params_after, shard_record);
    model_.load_batchnorm_state(r.ledger.batchnorm);
    optimizer_->load_moments(sh.sharded() && !shard_record ? shard_params(r.optimizer, sh.rank, sh.size) : r.optimizer,
                             params_);
  }

  // The training state as a saver with fault `f` writes it (state.hpp).
  TrainingState save_state(StateFault f) const {
    const int M = micros_;
    TrainingState s;
    s.case_key = state_key(c_);
    s.position = f == StateFault::no_accumulation ? position_ - position_ % M : position_;
    s.params = model_.values();
    if (position_ % M != 0) {
      s.grads = model_.grads();
      for (bool d : model_.grads_defined()) s.grad_defined.push_back(d ? 1 : 0);
      s.hook_calls.assign(hook_calls_->begin(), hook_calls_->end());
    }
    if (optimizer_->adam() && f != StateFault::no_optimizer) {
      const ParamSet st = optimizer_->moments(model_.values());
      for (const auto& a : st.items) (a.name.rfind("exp_avg_sq.", 0) == 0 ? s.adam_v : s.adam_m).items.push_back(a);
      s.adam_steps = optimizer_->steps();
    }
    if (f != StateFault::no_running_stats) s.batchnorm = model_.batchnorm_state();
    s.counter = effects_.counter, s.external = effects_.external, s.cache_calls = effects_.cache_calls;
    s.log = read_log();
    if (f == StateFault::rng_before)
      s.rng = rng_before_step_.bytes();
    else if (f != StateFault::no_rng)
      s.rng = rng_.bytes();
    if (tracker_ && f != StateFault::no_streams)
      for (const auto& [name, state] : tracker_->states()) {
        const torch::Tensor b = state.contiguous().to(torch::kUInt8);
        s.streams.emplace_back(name, std::vector<uint8_t>(b.data_ptr<uint8_t>(), b.data_ptr<uint8_t>() + b.numel()));
      }
    return s;
  }
  // Continues from a loaded state (this trainer must be fresh). Throws StateError when the state does
  // not fit the model.
  void load_state(const TrainingState& s) {
    const ParamSet layout = model_.values();
    auto same_layout = [&](const ParamSet& a, const std::string& what) {
      bool ok = a.items.size() == layout.items.size();
      for (size_t i = 0; ok && i < a.items.size(); ++i)
        ok = a.items[i].shape == layout.items[i].shape &&
             (a.items[i].name == layout.items[i].name ||
              a.items[i].name.find(layout.items[i].name) != std::string::npos);
      if (!ok) throw StateError("state file: its " + what + " do not fit this model's parameters");
    };
    same_layout(s.params, "parameters");
    if (s.position < 0 || s.position > c_.steps * micros_)
      throw StateError("state file: position " + std::to_string(s.position) + " is outside this Case's " +
                       std::to_string(c_.steps * micros_) + " micro-batches" +
                       (dp_ > 1 ? " (of a data-parallel replica)" : ""));
    const size_t P = params_.size(), L = static_cast<size_t>(c_.model.layers);
    model_.load(s.params, /*shard_values=*/true);  // a rank's state holds its own shard (save_state)
    if (!s.grads.items.empty()) {
      same_layout(s.grads, "gradients");
      if (s.grad_defined.size() != P || s.hook_calls.size() != P)
        throw StateError("state file: its gradient flags do not fit this model");
      for (size_t i = 0; i < P; ++i) {
        (*hook_calls_)[i] = static_cast<int>(s.hook_calls[i]);
        if (s.grad_defined[i])
          params_[i].mutable_grad() = to_tensor(s.grads.items[i].data, params_[i].sizes().vec(), device_);
      }
    }
    if (optimizer_->adam() && !s.adam_m.items.empty()) {
      same_layout(s.adam_m, "Adam first moments");
      same_layout(s.adam_v, "Adam second moments");
      if (s.adam_steps.size() != P) throw StateError("state file: its Adam step counts do not fit this model");
      optimizer_->load(s.adam_m, s.adam_v, s.adam_steps, params_);
    }
    if (!s.batchnorm.items.empty()) {
      const ParamSet bn = model_.batchnorm_state();
      if (bn.items.size() != s.batchnorm.items.size())
        throw StateError("state file: its BatchNorm statistics do not fit this model");
      model_.load_batchnorm_state(s.batchnorm);
    }
    if (s.counter.size() != L || s.external.size() != L || s.cache_calls.size() != L)
      throw StateError("state file: its per-layer counters do not fit this model");
    effects_.counter = s.counter, effects_.external = s.external, effects_.cache_calls = s.cache_calls;
    if (!effects_.log_path.empty()) std::ofstream(effects_.log_path, std::ios::binary | std::ios::trunc) << s.log;
    if (!s.rng.empty()) {
      try {
        rng_ = RngState::from_bytes(s.rng);
      } catch (const std::invalid_argument& e) {
        throw StateError(std::string("state file: ") + e.what());
      }
    }
    if (!s.streams.empty()) {
      if (!tracker_) throw StateError("state file: it holds random streams of a tensor-parallel run (tp > 1)");
      std::vector<std::pair<std::string, torch::Tensor>> states;
      for (const auto& [name, bytes] : s.streams)
        states.emplace_back(name, torch::tensor(std::vector<int64_t>(bytes.begin(), bytes.end())).to(torch::kUInt8));
      try {
        tracker_->set_states(states);
      } catch (const std::exception& e) {
        throw StateError(std::string("state file: its random streams do not fit this run: ") + first_line(e.what()));
      }
    }
    position_ = s.position;
    step_ = position_ / micros_;
  }

  // Fills the records of every call so far; `error` when the run stopped on an exception.
  void finish(RunRecord& r, const std::exception* error) {
    r.completed = error == nullptr;
    if (error) {
      r.error = first_line(error->what());
      r.error_trace = exception_trace(*error);
      r.error_step = step_, r.error_micro = micro_, r.error_phase = phase_;
    }
    r.sites = tap_.calls();
    r.relu = tap_.relu_calls();
    r.noise = tap_.noise_calls();
    r.jitter = tap_.jitter_calls();
    r.segment_calls = segment_calls_;
    r.memory = memory_;
    r.times = times_;
    for (const auto& p : params_) {
      r.memory.params += static_cast<int64_t>(p.nbytes());
      if (p.grad().defined()) r.memory.grads += static_cast<int64_t>(p.grad().nbytes());
    }
    r.memory.optimizer += optimizer_->bytes();
    if (device_.is_cpu()) r.memory.rng_state = static_cast<int64_t>(rng_.bytes().at(0).size());
  }
  // The experiment of the trainer's mode; fills throw_result / inplace_result. The throw experiment runs
  // step 0, micro-batch 0. The in-place one edits after the forward of micro-batch k = c.inplace_micro:
  // under sched=fb the micro-batches before it run forward and backward first; under sched=ffbb every
  // forward of the step runs, then the edit, then the backwards in reverse order, so later calls of the
  // same segments wait for backward beside the edited one.
  void experiment() {
    rng_.restore();
    if (impl_) impl_->begin_step(0);
    const bool inplace = mode_ == Mode::inplace_input || mode_ == Mode::inplace_reference;
    if (inplace && c_.inplace_on == InplaceOn::param) return parameter_experiment();
    const int k = inplace ? c_.inplace_micro : 0;
    const bool all_forwards_first = inplace && c_.sched == Schedule::ffbb;
    const int n = all_forwards_first ? c_.micro : k + 1;
    live_.assign(static_cast<size_t>(n), {});
    for (int m = 0; m < k && !all_forwards_first; ++m) {
      forward(m);
      backward(m);
    }
    for (int m = all_forwards_first ? 0 : k; m < n; ++m) forward(m);
    if (mode_ == Mode::inplace_input) {
      torch::NoGradGuard no_grad;
      if (c_.inplace_on == InplaceOn::mask) {
        // Every key but the first flips (the first stays valid, so no query is left without a key). Plain
        // autograd keeps only logical_not's copy of the mask: the forward that ran is unchanged by this.
        torch::Tensor& valid = key_valid_.at(static_cast<size_t>(k));
        valid.narrow(1, 1, valid.size(1) - 1).logical_not_();
      } else {
        // A ramp, not a constant: LayerNorm and RMSNorm are blind to a uniform shift or scale, so a
        // recompute from add_(1)'s value could yield the very gradients of the forward that ran.
        torch::Tensor& in = live_[static_cast<size_t>(k)].segment_inputs.at(static_cast<size_t>(target_));
        if (!in.defined()) throw std::runtime_error("the strategy did not run block " + std::to_string(target_));
        in.add_(torch::linspace(0.5, 1.5, in.numel(), in.options()).reshape(in.sizes()));
      }
    } else if (!inplace) {
      move_generators_on();
      throw_result.before = GlobalState::current();
    }
    bool threw = false;
    std::string msg;
    try {
      for (int m = n; m-- > (all_forwards_first ? 0 : k);) backward(m);
    } catch (const std::exception& e) {
      threw = true;
      msg = e.what();
    }
    if (inplace) {
      record_inplace_result(threw, msg);
    } else {
      throw_result.after = GlobalState::current();
      throw_result.threw = threw;
      throw_result.planted_message_seen = msg.find(kPlantedFailure) != std::string::npos;
      throw_result.message = first_line(msg);
    }
    live_.clear();
    if (impl_) impl_->end_step(0);
  }

  // The in-place experiment under inplace_on=param: step 0 in two groups of micro-batches, each in the
  // Case's schedule, with the target segment's parameters edited in place between them (before micro-batch
  // k = c.inplace_micro's forward, every earlier backward done, so no forward waits for backward across
  // the edit). Plain autograd gives the later micro-batches the new values' gradients, and so must a
  // checkpoint: its recompute is of a forward that ran after the edit. Mode::inplace_reference runs the
  // same micro-batches without the edit (plain autograd's and the implementation's, for the judge).
  void parameter_experiment() {
    const int k = c_.inplace_micro;
    live_.assign(static_cast<size_t>(c_.micro), {});
    auto run_group = [&](int first, int end) {
      if (c_.sched == Schedule::ffbb) {
        for (int m = first; m < end; ++m) forward(m);
        for (int m = end; m-- > first;) backward(m);
      } else {
        for (int m = first; m < end; ++m) forward(m), backward(m);
      }
    };
    run_group(0, k);
    if (mode_ == Mode::inplace_input) {
      torch::NoGradGuard no_grad;
      // A ramp per parameter, not a constant: a LayerNorm or RMSNorm after a shifted or uniformly scaled
      // weight could hide it.
      for (const torch::Tensor& p : segment_params_.at(static_cast<size_t>(target_)))
        p.add_(torch::linspace(0.05, 0.25, p.numel(), p.options()).reshape(p.sizes()));
    }
    bool threw = false;
    std::string msg;
    try {
      run_group(k, c_.micro);
    } catch (const std::exception& e) {
      threw = true;
      msg = e.what();
    }
    record_inplace_result(threw, msg);
    live_.clear();
    if (impl_) impl_->end_step(0);
  }
  // What an in-place experiment's run came to: whether it raised (and what), else its gradients.
  void record_inplace_result(bool threw, const std::string& msg) {
    inplace_result.threw = threw;
    inplace_result.message = first_line(msg);
    if (threw) return;
    inplace_result.grads = model_.grads();
    inplace_result.grad_defined = model_.grads_defined();
    for (const Live& l : live_) inplace_result.dx.insert(inplace_result.dx.end(), l.dx.begin(), l.dx.end());
  }

  // Whether this run kept the target segment's step 0, micro-batch 0 arguments for throw_experiment() (a
  // run in Mode::normal with a target segment, not under a strategy, that got that far).
  bool kept_target_args() const { return !target_args_.empty(); }
  // The throw experiment on this run's own trainer, after its last step: the target segment handed to
  // the implementation once more, on copies of the arguments it received in step 0, micro-batch 0 (kept
  // then, charged to no run), the generators moved on, and backward from its outputs with the recompute
  // made to throw. exception-safe judges what a throwing recompute leaves behind, which needs neither a
  // new trainer nor the segments around the target (the whole-forward form, experiment(), stays for
  // strategies, which checkpoint inside one call over the whole block stack).
  void throw_experiment() {
    if (target_args_.empty()) throw std::logic_error("throw_experiment without the target's arguments");
    mode_ = Mode::throw_in_recompute;
    rng_.restore();
    step_ = 0, micro_ = 0, phase_ = 0;
    tap_.set_context(0, 0, 0);
    if (impl_) impl_->begin_step(0);
    std::vector<torch::Tensor> outs;
    {
      const bool autocast = c_.precision != Precision::fp32;
      compat::ScopedAutocastState ac(
          compat::AutocastState::current().with(device_.type(), autocast, autocast_dtype(c_.precision)));
      SegmentCall call;
      call.fn = segment_fn(static_cast<size_t>(target_), 0);
      call.args = target_args_;
      call.segment = target_, call.step = 0, call.micro = 0;
      call.params = segment_params_.at(static_cast<size_t>(target_));
      call.generators = generators();
      const GlobalStateCheck before;
      outs = impl_->run(call);
      before.expect_unchanged("checkpointing segment " + std::to_string(target_));
    }
    move_generators_on();
    throw_result.before = GlobalState::current();
    phase_ = 1;
    tap_.set_context(0, 0, 1);
    try {
      torch::Tensor root;
      for (const auto& t : outs)
        if (t.defined() && t.requires_grad()) root = root.defined() ? root + t.sum() : t.sum();
      if (root.defined()) root.backward();
    } catch (const std::exception& e) {
      throw_result.threw = true;
      throw_result.message = first_line(e.what());
      throw_result.planted_message_seen = std::string(e.what()).find(kPlantedFailure) != std::string::npos;
    }
    throw_result.after = GlobalState::current();
    if (impl_) impl_->end_step(0);
  }

  ThrowExperiment throw_result;
  InplaceExperiment inplace_result;

 private:
  // Moves every generator on, so that a recompute that leaves the forward's state behind shows.
  void move_generators_on() {
    torch::rand({1});
    if (tracker_) {
      const dist::RngTracker::Fork fork = tracker_->fork(kModelParallelStream);
      torch::rand({1});
    }
    const size_t devices = torch::cuda::is_available() ? static_cast<size_t>(torch::cuda::device_count()) : 0;
    for (size_t i = 0; i < devices; ++i)
      torch::rand({1}, torch::TensorOptions().device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i))));
  }

  Ledger ledger() const {
    Ledger l;
    l.counter = effects_.counter;
    l.external = effects_.external;
    l.cache_calls = effects_.cache_calls;
    l.log = read_log();
    l.batchnorm = model_.batchnorm_state();
    l.rng = rng_;
    return l;
  }

  std::string read_log() const {
    if (effects_.log_path.empty()) return {};
    std::ifstream in(effects_.log_path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  // Starts step step_: a fresh step zeroes the gradients and the per-step counts; a step resumed from a
  // state file keeps what was loaded.
  void begin_step(bool fresh) {
    rng_before_step_ = capture_rng();
    if (impl_) impl_->begin_step(step_);
    if (fresh) {
      std::fill(effects_.cache_calls.begin(), effects_.cache_calls.end(), 0);
      for (auto& p : params_) p.mutable_grad().reset();
      std::fill(hook_calls_->begin(), hook_calls_->end(), 0);
      *hook_input_max_ = 0.0;
    }
    first_micro_ = first_local_ + position_ % micros_;
    live_.assign(static_cast<size_t>(c_.micro), {});
    in_step_ = true;
    step_memory_ = StepMemory{};
    step_time_ = StepTime{};
    step_memory_.carried = account_.next_epoch();
    if (memory_.steps.empty()) step_memory_.carried = 0;  // the epoch before the first step is the set-up
    step_memory_.before = account_.live();
    account_.reset_peak();
  }

  StepRecord end_step() {
    step_memory_.peak = account_.peak();
    memory_.steps.push_back(step_memory_);
    StepRecord rec;
    rec.first_micro = first_micro_;
    for (int m = first_local_; m < first_local_ + micros_; ++m) {
      const auto& l = live_[static_cast<size_t>(m)];
      rec.losses.push_back(l.loss_value);
      rec.dx.push_back(c_.input_frozen ? std::vector<double>{} : l.dx);
    }
    if (reducer_) {
      // The replicas hold the average of their accumulated gradients; the step's gradient is that of
      // the mean loss over every micro-batch of the step (each loss is scaled by 1/micro, as in one
      // process): their sum. (dp is a power of two: exact.)
      torch::NoGradGuard no_grad;
      for (auto& p : params_)
        if (p.grad().defined()) p.mutable_grad().mul_(static_cast<double>(dp_));
    }
    rec.grads = model_.grads();
    rec.grad_defined = model_.grads_defined();
    rec.hook_calls = *hook_calls_;
    rec.hook_input_max = *hook_input_max_;
    const double update_start = now();
    optimizer_->update(params_);
    step_time_.optimizer = now() - update_start;
    times_.push_back(step_time_);
    rec.params_after = model_.values();
    rec.optimizer = optimizer_->moments(rec.params_after);
    live_.clear();
    in_step_ = false;
    if (impl_) impl_->end_step(step_);
    // What the previous step allocated and this one (its end_step included) did not release.
    if (memory_.steps.size() > 1) memory_.steps.back().kept = account_.live_from_previous_epoch();
    return rec;
  }

  // The non-tensor arguments of a segment call, for SegmentCallRecord::scalars.
  static std::string describe_scalars(const std::vector<c10::IValue>& args) {
    std::string out;
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& a = args[i];
      if (a.isTensor()) continue;
      std::string v = a.isNone()     ? "None"
                      : a.isBool()   ? (a.toBool() ? "true" : "false")
                      : a.isInt()    ? std::to_string(a.toInt())
                      : a.isDouble() ? fmt::format("{}", a.toDouble())
                                     : std::string("a ") + a.tagKind();
      out += fmt::format("{}arg {} = {}", out.empty() ? "" : ", ", i, v);
    }
    return out;
  }

  // The segment function of segment s in micro-batch m: the functions the implementation receives.
  SegmentFunction segment_fn(size_t s, int m) {
    const Segment& seg = o_.segments[s];
    const int step = step_;
    return [this, s, m, step, &seg](const std::vector<c10::IValue>& args) -> std::vector<torch::Tensor> {
      segment_calls_.push_back(
          {step, m, static_cast<int>(s), phase_, torch::GradMode::is_enabled(), describe_scalars(args)});
      // Under a strategy the run stage sees a block's input only when the block runs (the in-place
      // experiment changes it).
      // (Only the target's, and only in the in-place modes: holding every block's input would keep
      // tensors alive that a checkpoint frees, and move the memory that memory-saved judges.)
      if (strategy_ && phase_ == 0 && static_cast<int>(s) == target_ && !args.empty() && args[0].isTensor() &&
          (mode_ == Mode::inplace_input || mode_ == Mode::inplace_reference)) {
        auto& inputs = live_.at(static_cast<size_t>(m)).segment_inputs;
        if (inputs.size() > s) inputs[s] = args[0].toTensor();
      }
      if (mode_ == Mode::throw_in_recompute && static_cast<int>(s) == target_ && phase_ > 0) {
        throw_result.recomputed = true;
        throw std::runtime_error(kPlantedFailure);
      }
      if (c_.segio() == SegIO::single) {
        torch::Tensor h = segment_input(args.at(0).toTensor());
        for (const Unit& u : seg.units) {
          h = model_.run_unit(u, h, {});
          note_unit();
        }
        if (c_.model.segout != SegOut::plain) return {h, carried(args.at(1).toTensor())};
        return {h};
      }
      torch::Tensor h = segment_input(args.at(0).toTensor());
      const torch::Tensor key_valid = args.at(1).toTensor();
      const int64_t start = args.at(2).toInt(), stop = args.at(3).toInt();
      const double aux_weight = args.at(4).toDouble();
      torch::Tensor sq_mean;
      for (int64_t i = start; i < stop; ++i) {
        h = model_.run_unit(units_.at(static_cast<size_t>(i)), h, key_valid, &sq_mean);
        note_unit();
      }
      const torch::Tensor aux =
          sq_mean.defined() ? sq_mean * aux_weight : torch::zeros({}, torch::TensorOptions().device(device_));
      if (c_.model.segout != SegOut::plain) return {h, aux, carried(args.at(5).toTensor())};
      return {h, aux};
    };
  }

  void forward(int m) {
    micro_ = m, phase_ = 0;
    tap_.set_context(step_, m, 0);
    Live& live = live_[static_cast<size_t>(m)];
    const double forward_start = now();
    unit_mark_ = forward_start;
    unit_timing_ = m == first_micro_;
    live.x = x_[static_cast<size_t>(m)].clone().requires_grad_(!c_.input_frozen);
    first_forward_ = !first_forward_done_;
    if (first_forward_) memory_.forward_start = account_.live() - step_memory_.before;
    const bool autocast = c_.precision != Precision::fp32;
    compat::ScopedAutocastState ac(
        compat::AutocastState::current().with(device_.type(), autocast, autocast_dtype(c_.precision)));
    torch::Tensor h = live.x, aux;
    torch::Tensor skip = live.x;  // segout: the tensor every segment returns unchanged
    int64_t unit = 0;
    if (strategy_) {
      // The strategy gets the whole block stack and decides what to checkpoint.
      StackCall stack;
      stack.x = segment_input(h), stack.step = step_, stack.micro = m;
      for (size_t s = 0; s < o_.segments.size(); ++s) {
        SegmentCall call;
        call.fn = segment_fn(s, m);
        call.segment = static_cast<int>(s), call.step = step_, call.micro = m;
        call.params = segment_params_.at(s);
        call.generators = generators();
        stack.blocks.push_back(std::move(call));
      }
      live.segment_inputs.assign(o_.segments.size(), torch::Tensor());
      const GlobalStateCheck before;
      h = impl_->run_stack(stack);
      before.expect_unchanged("the strategy's forward of micro-batch " + std::to_string(m));
      if (!h.defined() || h.sizes() != live.x.sizes())
        throw std::runtime_error("the strategy returned " +
                                 (h.defined() ? "a tensor of shape " + c10::str(h.sizes()) : std::string("no tensor")) +
                                 " for a block stack whose input and output have shape " + c10::str(live.x.sizes()));
    }
    for (size_t s = 0; !strategy_ && s < o_.segments.size(); ++s) {
      const Segment& seg = o_.segments[s];
      SegmentCall call;
      call.fn = segment_fn(s, m);
      call.args = {segment_input(h)};
      if (c_.segio() == SegIO::multi) {
        call.args.emplace_back(key_valid_.at(static_cast<size_t>(m)));
        call.args.emplace_back(unit);
        call.args.emplace_back(unit + static_cast<int64_t>(seg.units.size()));
        call.args.emplace_back(kAuxWeight);
      }
      const bool carry = c_.model.segout != SegOut::plain;
      if (carry) call.args.emplace_back(skip);
      unit += static_cast<int64_t>(seg.units.size());
      live.segment_inputs.push_back(call.args[0].toTensor());  // the tensor the segment received
      if (mode_ == Mode::normal && impl_ && seg.checkpointed && static_cast<int>(s) == target_ && step_ == 0 &&
          m == first_local_ && target_args_.empty()) {
        ChargeTo instrument(nullptr);  // ckverify's copy for throw_experiment(), not the run's memory
        torch::NoGradGuard no_grad;
        for (const c10::IValue& a : call.args) {
          if (!a.isTensor()) {
            target_args_.push_back(a);
            continue;
          }
          const torch::Tensor& t = a.toTensor();
          target_args_.emplace_back(t.detach().clone().requires_grad_(t.requires_grad()));
        }
      }
      std::vector<torch::Tensor> outs;
      if (seg.checkpointed && impl_) {
        call.segment = static_cast<int>(s), call.step = step_, call.micro = m;
        call.params = segment_params_.at(s);
        call.generators = generators();
        const GlobalStateCheck before;
        outs = impl_->run(call);
        before.expect_unchanged("checkpointing segment " + std::to_string(s));
      } else {
        outs = call.fn(call.args);
      }
      const size_t want = (c_.segio() == SegIO::multi ? 2 : 1) + (carry ? 1 : 0);
      if (outs.size() != want)
        throw std::runtime_error("segment " + std::to_string(s) + " returned " + std::to_string(outs.size()) +
                                 " tensor(s), expected " + std::to_string(want));
      if (first_forward_) {
        // A carried alias counts too: the next segment's inputs include it, and a correct checkpoint may
        // copy every input it is given (memory-saved's per-call allowance).
        int64_t bytes = 0;
        for (const auto& t : outs) bytes += static_cast<int64_t>(t.nbytes());
        memory_.segment_output.push_back(bytes);
      }
      h = outs[0];
      if (c_.segio() == SegIO::multi) aux = aux.defined() ? aux + outs[1] : outs[1];
      if (carry) skip = outs.back();
    }
    if (c_.model.segout != SegOut::plain) h = h + kSkipScale * skip;
    torch::Tensor loss = model_.head_loss(h, targets_[static_cast<size_t>(m)], y_[static_cast<size_t>(m)]);
    if (aux.defined()) loss = loss + aux;
    live.loss = loss * (1.0 / c_.micro);
    if (m == first_micro_) step_memory_.after_forward = account_.live();
    first_forward_done_ = true;
    first_forward_ = false;
    unit_timing_ = false;
    step_time_.forward += now() - forward_start;
  }

  // The carried tensor as segout returns it: the argument itself (alias) or a view of it (view).
  torch::Tensor carried(const torch::Tensor& skip) const {
    return c_.model.segout == SegOut::view ? skip.view(skip.sizes()) : skip;
  }

  // A segment's hidden-state input as the Case has it arrive (segin): under segin=view, the same values
  // as a slice of a buffer padded by one element per row, so a non-contiguous view (for more than one
  // row) with storage offset 1; one extra element per row of memory, in every run alike. The segment
  // function applies it again to what it is given: a correct checkpoint may save or pass on a contiguous
  // copy (clone(), contiguous()), and fp32 kernels round differently on another layout (a matmul with
  // another leading dimension), so the segment computes on this layout whatever layout reaches it, and a
  // strategy's blocks (given one another's outputs) compute as the baseline's segments do.
  torch::Tensor segment_input(const torch::Tensor& h) const {
    if (c_.segin != SegIn::view) return h;
    return torch::constant_pad_nd(h, {1, 0}).narrow(-1, 1, h.size(-1));
  }

  // Seconds on a steady clock, after the device's queued work is done.
  double now() const {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // The run's generators, recorded by ckverify (charged to no run: memory.hpp): the devices' defaults
  // and the model-parallel stream.
  RngState capture_rng() const {
    ChargeTo instrument(nullptr);
    return RngState::capture(generators());
  }
  // The generators besides the devices' defaults that a checkpoint must replay (SegmentCall::generators).
  std::vector<at::Generator> generators() const {
    return tracker_ ? tracker_->generators() : std::vector<at::Generator>{};
  }
  static ParallelFault parallel_fault_of(const Case& c) {
    const ImplInfo* info = find_impl(c.impl);
    return info ? info->parallel_fault : ParallelFault::none;
  }
  static std::unique_ptr<dist::RngTracker> make_tracker(const ParallelRun& par, const Case& c, ParallelFault f) {
    auto t = std::make_unique<dist::RngTracker>();
    // The fault tracker-same-seed: the seed without the rank, as a framework that forgot to add it.
    t->add(kModelParallelStream, f == ParallelFault::same_stream_seed ? c.seed + 2718 : par.stream_seed());
    return t;
  }
  static TensorShard make_shard(const ParallelRun& par, const Case& c, std::shared_ptr<dist::Group> tp,
                                dist::RngTracker* tracker, std::shared_ptr<dist::CollectiveLedger> ledger,
                                ParallelFault f) {
    TensorShard s;
    s.rank = par.tp_rank(), s.size = par.tp(), s.tracker = tracker;
    s.replicated_from_stream = f == ParallelFault::replicated_from_stream;
    s.keep_reduced = c.tpkeep == TpKeep::reduced;
    s.region = std::make_shared<dist::ParallelRegion>();
    s.region->group = std::move(tp);
    s.region->ledger = std::move(ledger);
    return s;
  }

  // Level after a unit of the first forward (not during a recompute, which runs in backward).
  void note_unit() {
    if (phase_ != 0) return;
    if (first_forward_) memory_.unit_levels.push_back(account_.live() - step_memory_.before);
    if (unit_timing_) {
      const double t = now();
      step_time_.unit_forward.push_back(t - unit_mark_);
      unit_mark_ = t;
    }
  }

  void backward(int m) {
    const double backward_start = now();
    micro_ = m;
    Live& live = live_[static_cast<size_t>(m)];
    phase_ = 1;
    tap_.set_context(step_, m, 1);
    const GlobalStateCheck before;
    if (reducer_) reducer_->begin_backward();
    if (c_.gp > 0.0) {
      const torch::Tensor g = torch::autograd::grad({live.loss}, {live.x}, {}, /*retain_graph=*/true,
                                                    /*create_graph=*/true)[0];
      const torch::Tensor total = live.loss + g.pow(2).sum() * c_.gp;
      phase_ = 2;
      tap_.set_context(step_, m, 2);
      total.backward();
    } else {
      live.loss.backward();
    }
    if (impl_) before.expect_unchanged("the backward of micro-batch " + std::to_string(m) + " (its recomputes)");
    step_time_.backward += now() - backward_start;
    live.loss_value = live.loss.item<double>();
    if (!c_.input_frozen && live.x.grad().defined()) {
      ChargeTo instrument(nullptr);
      live.dx = to_doubles(live.x.grad());
    }
    live.loss = torch::Tensor();
    live.segment_inputs.clear();
    step_memory_.after_backward = account_.live();
  }

  struct Live {
    torch::Tensor x, loss;
    std::vector<torch::Tensor> segment_inputs;
    double loss_value = 0.0;
    std::vector<double> dx;
  };

  const Case& c_;
  const Observations& o_;
  CheckpointImpl* impl_;
  bool strategy_;
  Mode mode_;
  int target_;
  torch::Device device_;
  MemoryAccount account_;
  MemoryRecord memory_;
  StepMemory step_memory_;
  StepTime step_time_;
  std::vector<StepTime> times_;
  double unit_mark_ = 0.0;
  bool unit_timing_ = false;
  bool first_forward_ = false, first_forward_done_ = false;
  SiteTap tap_;
  EffectState effects_;
  std::string log_dir_;
  ParallelFault parallel_fault_;
  int dp_;                                               // data-parallel replicas (1 in one process)
  int micros_;                                           // the micro-batches of each step this run runs (micro / dp)
  int first_local_;                                      // the first of them (its replica's)
  RunGroups groups_;                                     // on ranks: the run's own process groups
  std::unique_ptr<dist::RngTracker> tracker_;            // tp > 1: the model-parallel stream
  std::shared_ptr<dist::CollectiveLedger> collectives_;  // on ranks: every collective the run issued
  TransformerImpl model_;
  std::vector<torch::Tensor> params_;
  std::shared_ptr<std::vector<int>> hook_calls_;
  std::shared_ptr<double> hook_input_max_;  // see StepRecord::hook_input_max
  std::vector<torch::Tensor> x_, targets_, y_;
  std::vector<torch::Tensor> key_valid_;  // per micro-batch (segio=multi)
  std::vector<Unit> units_;
  std::vector<std::vector<torch::Tensor>> segment_params_;
  std::vector<Live> live_;
  std::vector<SegmentCallRecord> segment_calls_;
  std::vector<c10::IValue> target_args_;  // see throw_experiment()
  RngState rng_, rng_before_step_;
  std::unique_ptr<OptimizerState> optimizer_;
  int step_ = 0, micro_ = 0, phase_ = 0;
  int position_ = 0, first_micro_ = 0;
  bool in_step_ = false;
  // dp > 1, last: its hooks are disarmed before the model they are on goes.
  std::unique_ptr<dist::GradReducer> reducer_;
};

}  // namespace ckv::run_detail
