// verifier/run/run.cpp: see run.hpp.
#include "verifier/run/run.hpp"
#include "properties/tolerance.hpp"

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

#include "verifier/impls/faults/reentrant.hpp"
#include "verifier/impls/registry.hpp"
#include "verifier/impls/traced_error.hpp"
#include "verifier/model/memory.hpp"
#include "verifier/model/model.hpp"
#include "verifier/run/progress.hpp"
#include "verifier/run/state.hpp"

namespace ckv {
namespace {

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

std::string first_line(const std::string& s) {
  return sanitize(s.substr(0, s.find('\n')), 400);
}

torch::Tensor to_tensor(const std::vector<double>& v, std::vector<int64_t> shape, const torch::Device& d) {
  return torch::from_blob(const_cast<double*>(v.data()), shape, torch::kDouble).to(torch::kFloat).to(d);
}

std::vector<bool> trainable_mask(const Case& c, const ParamSet& layout) {
  std::vector<bool> out;
  for (size_t i = 0; i < layout.items.size(); ++i) {
    const std::string& n = layout.items[i].name;
    bool frozen = false;
    if (c.freeze == Freeze::alt) frozen = i % 2 == 1;
    if (c.freeze == Freeze::blocks) frozen = n.rfind("layer", 0) == 0;
    out.push_back(!frozen);
  }
  return out;
}

// Whether any input or parameter of each segment requires grad (so backward must reach through it).
std::vector<bool> gradient_flow(const Case& c, const std::vector<Segment>& segments,
                                const std::vector<bool>& trainable) {
  const ParamSet layout = param_layout(c.model);
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < layout.items.size(); ++i)
      if (layout.items[i].name == name) return i;
    return layout.items.size();
  };
  std::vector<bool> out;
  bool upstream = !c.input_frozen;
  for (const auto& seg : segments) {
    bool any = false;
    for (const Unit& u : seg.units) {
      std::vector<std::string> names;
      auto add = [&](ModelPart p) {
        for (auto& n : part_param_names(c.model, p, u.layer)) names.push_back(n);
      };
      if (u.part == BlockPart::embed) add(ModelPart::input_projection);
      if (u.part == BlockPart::whole || u.part == BlockPart::attn) add(ModelPart::block_attn);
      if (u.part == BlockPart::whole || u.part == BlockPart::ffn) add(ModelPart::block_ffn);
      for (const auto& n : names) any |= trainable.at(index_of(n));
    }
    out.push_back(upstream || any);
    upstream = upstream || any;
  }
  return out;
}

// A private directory for one run's files (the log module writes there).
std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ckverify-run-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw EnvironmentError("cannot create a temporary directory in " + tmpl);
  return tmpl;
}

// The experiments' modes: a recompute made to throw; a segment input changed in place between forward
// and backward; the same forward and backward with the input left alone (the gradients of the forward
// an implementation ran, for one that recomputes from its own copy of the input).
enum class Mode { normal, throw_in_recompute, inplace_input, inplace_reference };

// One training run. The members live as long as the run: segment functions handed to the
// implementation capture references to them.
class Trainer {
 public:
  Trainer(const Case& c, const Observations& o, CheckpointImpl* impl, Mode mode, int target_segment)
      : c_(c),
        o_(o),
        impl_(impl),
        strategy_(impl != nullptr && impl->is_strategy()),
        mode_(mode),
        target_(target_segment),
        device_(c.device),
        account_(device_.type()),
        tap_(c.dropout_impl, c.dropout),
        model_(c.model, &tap_, &effects_) {
    const size_t layers = static_cast<size_t>(c.model.layers);
    effects_.counter.assign(layers, 0);
    effects_.external.assign(layers, 0);
    effects_.cache_calls.assign(layers, 0);
    if (c.model.has(kLog) || c.model.has(kExternal)) {
      log_dir_ = make_temp_dir();
      effects_.log_path = log_dir_ + "/effects.log";
      std::ofstream(effects_.log_path).flush();
    }
    torch::manual_seed(c.seed);  // dropout draws from the device's default generator
    rng_ = RngState::capture();  // this run's own random stream (runs interleave step by step)
    model_.to(device_);
    model_.load(o.initial_params);
    model_.train();
    params_ = model_.parameters();
    hook_calls_ = std::make_shared<std::vector<int>>(params_.size(), 0);
    hook_input_max_ = std::make_shared<double>(0.0);
    if (c.opt == Optimizer::adam) {
      for (const auto& p : params_) {
        adam_m_.push_back(torch::zeros_like(p));
        adam_v_.push_back(torch::zeros_like(p));
      }
      adam_steps_.assign(params_.size(), 0);
    }
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
    if (position_ != step * c_.micro) throw std::logic_error("Trainer::step out of order");
    std::vector<StepRecord> r = advance_to(position_ + c_.micro);
    return std::move(r.at(0));
  }
  // Runs micro-batches until `position` of them are done (whole steps under sched=ffbb); returns the
  // records of the steps completed. The run's own generators are installed around it.
  std::vector<StepRecord> advance_to(int position) {
    const int M = c_.micro;
    std::vector<StepRecord> out;
    ChargeTo charge(&account_);
    rng_.restore();
    while (position_ < position) {
      progress();
      step_ = position_ / M;
      const int m = position_ % M;
      if (!in_step_) begin_step(/*fresh=*/m == 0);
      if (c_.sched == Schedule::ffbb) {
        for (int k = 0; k < M; ++k) forward(k);
        for (int k = M - 1; k >= 0; --k) backward(k);
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

  // Continues from these parameters, running statistics and optimizer state (the baseline follows the
  // run under test step by step).
  void load(const StepRecord& r) {
    model_.load(r.params_after);
    model_.load_batchnorm_state(r.ledger.batchnorm);
    for (size_t i = 0; i < adam_m_.size(); ++i) {
      adam_m_[i] = to_tensor(r.optimizer.items.at(2 * i).data, params_[i].sizes().vec(), device_);
      adam_v_[i] = to_tensor(r.optimizer.items.at(2 * i + 1).data, params_[i].sizes().vec(), device_);
    }
  }

  // The training state as a saver with fault `f` writes it (state.hpp).
  TrainingState save_state(StateFault f) const {
    const int M = c_.micro;
    TrainingState s;
    s.case_key = state_key(c_);
    s.position = f == StateFault::no_accumulation ? position_ - position_ % M : position_;
    s.params = model_.values();
    if (position_ % M != 0) {
      s.grads = model_.grads();
      for (bool d : model_.grads_defined()) s.grad_defined.push_back(d ? 1 : 0);
      s.hook_calls.assign(hook_calls_->begin(), hook_calls_->end());
    }
    if (c_.opt == Optimizer::adam && f != StateFault::no_optimizer) {
      const ParamSet st = optimizer_state();
      for (const auto& a : st.items) (a.name.rfind("exp_avg_sq.", 0) == 0 ? s.adam_v : s.adam_m).items.push_back(a);
      s.adam_steps = adam_steps_;
    }
    if (f != StateFault::no_running_stats) s.batchnorm = model_.batchnorm_state();
    s.counter = effects_.counter, s.external = effects_.external, s.cache_calls = effects_.cache_calls;
    s.log = read_log();
    if (f == StateFault::rng_before)
      s.rng = rng_before_step_.bytes();
    else if (f != StateFault::no_rng)
      s.rng = rng_.bytes();
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
    if (s.position < 0 || s.position > c_.steps * c_.micro)
      throw StateError("state file: position " + std::to_string(s.position) + " is outside this Case's " +
                       std::to_string(c_.steps * c_.micro) + " micro-batches");
    const size_t P = params_.size(), L = static_cast<size_t>(c_.model.layers);
    model_.load(s.params);
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
    if (c_.opt == Optimizer::adam && !s.adam_m.items.empty()) {
      same_layout(s.adam_m, "Adam first moments");
      same_layout(s.adam_v, "Adam second moments");
      if (s.adam_steps.size() != P) throw StateError("state file: its Adam step counts do not fit this model");
      for (size_t i = 0; i < P; ++i) {
        adam_m_[i] = to_tensor(s.adam_m.items[i].data, params_[i].sizes().vec(), device_);
        adam_v_[i] = to_tensor(s.adam_v.items[i].data, params_[i].sizes().vec(), device_);
      }
      adam_steps_ = s.adam_steps;
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
    position_ = s.position;
    step_ = position_ / c_.micro;
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
    r.segment_calls = segment_calls_;
    r.memory = memory_;
    r.times = times_;
    for (const auto& p : params_) {
      r.memory.params += static_cast<int64_t>(p.nbytes());
      if (p.grad().defined()) r.memory.grads += static_cast<int64_t>(p.grad().nbytes());
    }
    for (const auto* v : {&adam_m_, &adam_v_})
      for (const auto& t : *v) r.memory.optimizer += static_cast<int64_t>(t.nbytes());
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
      // Move every generator on, so that a recompute that leaves the forward's state behind shows.
      torch::rand({1});
      const size_t devices = torch::cuda::is_available() ? static_cast<size_t>(torch::cuda::device_count()) : 0;
      for (size_t i = 0; i < devices; ++i)
        torch::rand({1}, torch::TensorOptions().device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i))));
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
      inplace_result.threw = threw;
      inplace_result.message = first_line(msg);
      if (!threw) {
        inplace_result.grads = model_.grads();
        inplace_result.grad_defined = model_.grads_defined();
        for (const Live& l : live_) inplace_result.dx.insert(inplace_result.dx.end(), l.dx.begin(), l.dx.end());
      }
    } else {
      throw_result.after = GlobalState::current();
      throw_result.threw = threw;
      throw_result.planted_message_seen = msg.find(kPlantedFailure) != std::string::npos;
      throw_result.message = first_line(msg);
    }
    live_.clear();
    if (impl_) impl_->end_step(0);
  }

  ThrowExperiment throw_result;
  InplaceExperiment inplace_result;

 private:
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

  // Adam's moments in layout order: exp_avg.<name>, exp_avg_sq.<name> per parameter (empty for SGD).
  ParamSet optimizer_state() const {
    ParamSet out;
    const ParamSet layout = model_.values();
    for (size_t i = 0; i < adam_m_.size(); ++i) {
      const NamedArray& a = layout.items[i];
      out.items.push_back({"exp_avg." + a.name, a.shape, to_doubles(adam_m_[i])});
      out.items.push_back({"exp_avg_sq." + a.name, a.shape, to_doubles(adam_v_[i])});
    }
    return out;
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
    first_micro_ = position_ % c_.micro;
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
    for (int m = 0; m < c_.micro; ++m) {
      const auto& l = live_[static_cast<size_t>(m)];
      rec.losses.push_back(l.loss_value);
      rec.dx.push_back(c_.input_frozen ? std::vector<double>{} : l.dx);
    }
    rec.grads = model_.grads();
    rec.grad_defined = model_.grads_defined();
    rec.hook_calls = *hook_calls_;
    rec.hook_input_max = *hook_input_max_;
    const double update_start = now();
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) {
        torch::Tensor& p = params_[i];
        if (!p.grad().defined()) continue;
        const torch::Tensor g = p.grad();
        if (c_.opt == Optimizer::sgd) {
          p.sub_(g * c_.lr);
          continue;
        }
        // Adam (Kingma & Ba), bias-corrected, per-parameter step counts as torch.optim.Adam keeps them.
        const double t = static_cast<double>(++adam_steps_[i]);
        adam_m_[i].mul_(kAdamBeta1).add_(g, 1.0 - kAdamBeta1);
        adam_v_[i].mul_(kAdamBeta2).addcmul_(g, g, 1.0 - kAdamBeta2);
        const double bc1 = 1.0 - std::pow(kAdamBeta1, t), bc2 = 1.0 - std::pow(kAdamBeta2, t);
        const torch::Tensor denom = (adam_v_[i].sqrt() / std::sqrt(bc2)).add_(kAdamEps);
        p.addcdiv_(adam_m_[i], denom, -c_.lr / bc1);
      }
    }
    step_time_.optimizer = now() - update_start;
    times_.push_back(step_time_);
    rec.params_after = model_.values();
    rec.optimizer = optimizer_state();
    live_.clear();
    in_step_ = false;
    if (impl_) impl_->end_step(step_);
    // What the previous step allocated and this one (its end_step included) did not release.
    if (memory_.steps.size() > 1) memory_.steps.back().kept = account_.live_from_previous_epoch();
    return rec;
  }

  // The segment function of segment s in micro-batch m: the functions the implementation receives.
  SegmentFunction segment_fn(size_t s, int m) {
    const Segment& seg = o_.segments[s];
    const int step = step_;
    return [this, s, m, step, &seg](const std::vector<c10::IValue>& args) -> std::vector<torch::Tensor> {
      segment_calls_.push_back({step, m, static_cast<int>(s), phase_, torch::GradMode::is_enabled()});
      // Under a strategy the run stage sees a block's input only when the block runs (the in-place
      // experiment changes it).
      // (Only the target's, and only in the in-place modes: holding every block's input would keep
      // tensors alive that a checkpoint frees, and move the memory that memory-saved judges.)
      if (strategy_ && phase_ == 0 && static_cast<int>(s) == target_ && !args.empty() && args[0].isTensor() &&
          (mode_ == Mode::inplace_input || mode_ == Mode::inplace_reference)) {
        auto& inputs = live_.at(static_cast<size_t>(m)).segment_inputs;
        if (inputs.size() > s) inputs[s] = args[0].toTensor();
      }
      if (mode_ == Mode::throw_in_recompute && static_cast<int>(s) == target_ && phase_ > 0)
        throw std::runtime_error(kPlantedFailure);
      if (c_.segio() == SegIO::single) {
        torch::Tensor h = segment_input(args.at(0).toTensor());
        for (const Unit& u : seg.units) {
          h = model_.run_unit(u, h, {});
          note_unit();
        }
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
      unit += static_cast<int64_t>(seg.units.size());
      live.segment_inputs.push_back(call.args[0].toTensor());  // the tensor the segment received
      std::vector<torch::Tensor> outs;
      if (seg.checkpointed && impl_) {
        call.segment = static_cast<int>(s), call.step = step_, call.micro = m;
        call.params = segment_params_.at(s);
        const GlobalStateCheck before;
        outs = impl_->run(call);
        before.expect_unchanged("checkpointing segment " + std::to_string(s));
      } else {
        outs = call.fn(call.args);
      }
      const size_t want = c_.segio() == SegIO::multi ? 2 : 1;
      if (outs.size() != want)
        throw std::runtime_error("segment " + std::to_string(s) + " returned " + std::to_string(outs.size()) +
                                 " tensor(s), expected " + std::to_string(want));
      if (first_forward_) {
        int64_t bytes = 0;
        for (const auto& t : outs) bytes += static_cast<int64_t>(t.nbytes());
        memory_.segment_output.push_back(bytes);
      }
      h = outs[0];
      if (want == 2) aux = aux.defined() ? aux + outs[1] : outs[1];
    }
    torch::Tensor loss = model_.head_loss(h, targets_[static_cast<size_t>(m)], y_[static_cast<size_t>(m)]);
    if (aux.defined()) loss = loss + aux;
    live.loss = loss * (1.0 / c_.micro);
    if (m == first_micro_) step_memory_.after_forward = account_.live();
    first_forward_done_ = true;
    first_forward_ = false;
    unit_timing_ = false;
    step_time_.forward += now() - forward_start;
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

  // The run's generators, recorded by ckverify (charged to no run: memory.hpp).
  static RngState capture_rng() {
    ChargeTo instrument(nullptr);
    return RngState::capture();
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
  RngState rng_, rng_before_step_;
  std::vector<torch::Tensor> adam_m_, adam_v_;
  std::vector<int64_t> adam_steps_;
  int step_ = 0, micro_ = 0, phase_ = 0;
  int position_ = 0, first_micro_ = 0;
  bool in_step_ = false;
};

// The running statistics every BatchNorm module starts from (mean 0, variance 1, no batches).
ParamSet initial_batchnorm(const ModelConfig& c) {
  ParamSet out;
  if (!c.has(kBatchNorm)) return out;
  for (int l = 0; l < c.layers; ++l) {
    if (c.param_layer(l) != l) continue;
    const std::string L = "layer" + std::to_string(l) + ".bn.";
    out.items.push_back({L + "running_mean", {c.d_model}, std::vector<double>(static_cast<size_t>(c.d_model), 0.0)});
    out.items.push_back({L + "running_var", {c.d_model}, std::vector<double>(static_cast<size_t>(c.d_model), 1.0)});
    out.items.push_back({L + "num_batches_tracked", {1}, {0.0}});
  }
  return out;
}

Observations prepare(const Case& c) {
  validate(c);
  Observations o;
  o.c = c;
  o.segments = c.plan.segments(c.model.layers, c.model.attention, c.model.tie == Tie::head);
  o.initial_params = make_params(c.model, c.seed);
  o.trainable = trainable_mask(c, o.initial_params);
  o.grad_flows = gradient_flow(c, o.segments, o.trainable);
  o.passes = c.gp > 0.0 ? 2 : 1;
  for (int m = 0; m < c.micro; ++m) o.data.push_back(make_case_data(c.model, c.batch, seq_of(c, m), c.seed, m));
  return o;
}

// A strategy's Case: blocks as whole units, each its own segment, taking and returning the hidden state.
void check_strategy_case(const Case& c) {
  std::string need;
  if (c.plan.kind != PlanKind::every_block)
    need = "plan=block (one segment per block)";
  else if (c.segio() != SegIO::single)
    need = "segio=single (blocks over the hidden state alone)";
  else if (c.model.tie == Tie::head)
    need = "tie=none or tie=blocks (the tied input projection is no block)";
  if (!need.empty())
    throw EnvironmentError("a strategy is gated on Cases whose blocks are whole units: this Case needs " + need);
}

// What the strategy made of the block stack, read off what the run under test recomputed.
void apply_effective_plan(Observations& o) {
  o.strategy = true;
  const size_t S = o.segments.size();
  std::vector<bool> recomputed(S, false);
  for (const auto& r : o.test.segment_calls)
    if (r.phase > 0 && r.segment >= 0 && static_cast<size_t>(r.segment) < S)
      recomputed[static_cast<size_t>(r.segment)] = true;
  for (size_t s = 0; s < S; ++s) o.segments[s].checkpointed = recomputed[s];
  // Which blocks each (step, micro-batch) recomputed: a strategy may change its plan as it goes.
  std::map<std::pair<int, int>, std::set<int>> per_call;
  for (const auto& r : o.test.segment_calls)
    if (r.phase > 0) per_call[{r.step, r.micro}].insert(r.segment);
  for (int step = 0; step < o.c.steps && !o.strategy_plan_varies; ++step)
    for (int m = 0; m < o.c.micro; ++m)
      if (per_call[{step, m}] != per_call[{0, 0}]) o.strategy_plan_varies = true;
  // The checkpoints it made in step 0, micro-batch 0 (the one the experiments replay).
  int previous = -2;
  for (const auto& r : o.test.segment_calls) {
    if (r.step != 0 || r.phase != 1 || r.micro != 0) continue;
    if (o.strategy_groups.empty() || r.segment != previous + 1)
      o.strategy_groups.push_back({r.segment, r.segment});
    else
      o.strategy_groups.back().second = r.segment;
    previous = r.segment;
  }
  std::sort(o.strategy_groups.begin(), o.strategy_groups.end());
}

// The last checkpointed segment through which gradient flows (recomputed first in backward), or -1.
// Under a strategy: the first block of the last checkpoint it made in step 0, micro-batch 0 (what the
// experiments replay), so that the in-place change reaches a checkpoint's own input, not a tensor
// inside it.
int experiment_segment(const Observations& o) {
  if (o.strategy) {
    for (auto g = o.strategy_groups.rbegin(); g != o.strategy_groups.rend(); ++g)
      if (g->first >= 0 && static_cast<size_t>(g->first) < o.grad_flows.size() &&
          o.grad_flows[static_cast<size_t>(g->second)])
        return g->first;
    return -1;
  }
  for (size_t s = o.segments.size(); s-- > 0;)
    if (o.segments[s].checkpointed && o.grad_flows[s]) return static_cast<int>(s);
  return -1;
}

}  // namespace

std::string off_case_shapes(const Case& c, const RunRecord& r) {
  auto off = [&](const char* what, int step, int micro, int layer, const torch::Tensor& t,
                 const std::vector<int64_t>& want) -> std::string {
    if (!t.defined() || t.sizes().vec() == want) return "";
    return fmt::format("step {} micro-batch {}: the {} of layer {} has shape {} where the Case's is {}", step, micro,
                       what, layer, c10::str(t.sizes()), c10::str(c10::IntArrayRef(want)));
  };
  const int64_t dff = c.model.d_ff();
  for (const auto& x : r.sites)
    if (x.call == 0 && x.phase == 0)
      if (auto e = off(("dropout mask at " + std::string(to_string(x.site))).c_str(), x.step, x.micro, x.layer, x.mask,
                       dropout_site_shape(c.model, c.batch, seq_of(c, x.micro), x.site));
          !e.empty())
        return e;
  for (const auto& x : r.relu)
    if (x.call == 0)
      if (auto e = off("ReLU pattern", x.step, x.micro, x.layer, x.positive, {c.batch, seq_of(c, x.micro), dff});
          !e.empty())
        return e;
  for (const auto& x : r.noise)
    if (x.call == 0)
      if (auto e = off("noise", x.step, x.micro, x.layer, x.eps, {c.batch, seq_of(c, x.micro), c.model.d_model});
          !e.empty())
        return e;
  return "";
}

ExpectedStep expected_step(const Observations& o, int step, RefScalar scalar, const ReferenceFaults& faults,
                           bool perturb) {
  const Case& c = o.c;
  ParamSet params = step == 0 ? o.initial_params : o.test.steps.at(static_cast<size_t>(step - 1)).params_after;
  std::vector<CaseData> data = o.data;
  if (perturb) {
    SplitMix64 sign(stream_seed(c.seed, "perturb.step" + std::to_string(step)));
    auto nudge = [&](double& v) { v *= 1.0 + ((sign.next() & 1) ? 1.0 : -1.0) * 0x1p-21; };
    for (auto& a : params.items) std::for_each(a.data.begin(), a.data.end(), nudge);
    for (auto& d : data) std::for_each(d.x.begin(), d.x.end(), nudge);
  }
  ExpectedStep e;
  e.grads = zeros_like(params);
  e.batchnorm =
      step == 0 ? initial_batchnorm(c.model) : o.test.steps.at(static_cast<size_t>(step - 1)).ledger.batchnorm;
  for (int m = 0; m < c.micro; ++m) {
    const DropoutMasks masks = reference_masks(o.test.sites, o.test.relu, o.test.noise, c.model, c.dropout, step, m);
    const ReferenceResult r = reference_forward_backward(c.model, params, data[static_cast<size_t>(m)], masks,
                                                         ReferenceOptions{faults, scalar, 1.0 / c.micro, m});
    // BatchNorm's running statistics: one update per layer per forward, in forward order.
    for (size_t l = 0; l < r.bn_mean.size(); ++l) {
      const std::string L = "layer" + std::to_string(c.model.param_layer(static_cast<int>(l))) + ".bn.";
      auto& mean = e.batchnorm.at(L + "running_mean").data;
      auto& var = e.batchnorm.at(L + "running_var").data;
      for (size_t j = 0; j < mean.size(); ++j) {
        mean[j] = (1.0 - kBatchNormMomentum) * mean[j] + kBatchNormMomentum * r.bn_mean[l][j];
        var[j] = (1.0 - kBatchNormMomentum) * var[j] + kBatchNormMomentum * r.bn_var[l][j];
      }
      e.batchnorm.at(L + "num_batches_tracked").data[0] += 1.0;
    }
    e.losses.push_back(r.loss);
    e.dx.push_back(r.dx);
    for (const auto& out : r.layer_out)
      for (double v : out) e.max_activation = std::max(e.max_activation, std::abs(v));
    for (double v : r.logits) e.max_activation = std::max(e.max_activation, std::abs(v));
    for (size_t k = 0; k < r.grads.items.size(); ++k)
      for (size_t i = 0; i < r.grads.items[k].data.size(); ++i)
        e.grads.items[k].data[i] += apply_hook(c.hook, r.grads.items[k].data[i]);
  }
  return e;
}

double apply_hook(Hook h, double g) {
  switch (h) {
    case Hook::none:
      return g;
    case Hook::scale:
      return g * 0.5;
    case Hook::clip:
      return std::min(std::max(g, -kClipHook), kClipHook);
  }
  return g;
}

GlobalState GlobalState::current() {
  return {RngState::capture(), compat::AutocastState::current(), torch::GradMode::is_enabled()};
}

void check_environment(const Case& c) {
  validate(c);
  if (c.device != "cpu") {
    if (!torch::cuda::is_available())
      throw EnvironmentError("device=" + c.device + ": no CUDA device is available here");
    const torch::Device d(c.device);
    if (d.has_index() && d.index() >= static_cast<int>(torch::cuda::device_count()))
      throw EnvironmentError("device=" + c.device + ": this machine has " +
                             std::to_string(torch::cuda::device_count()) + " CUDA device(s)");
  }
  if (c.precision == Precision::fp16 && c.device == "cpu" && !compat::kCpuFp16Autocast)
    throw EnvironmentError("prec=fp16 on cpu needs LibTorch >= 2.3 (CPU autocast to fp16); this build has " +
                           std::string(TORCH_VERSION));
#if !CKV_TORCH_AT_LEAST(2, 0)
  // LibTorch 1.13's CPU autocast leaves the tied head's matmul against a bf16 input in fp32: the plain
  // run itself fails ("expected scalar type BFloat16 but found Float").
  if (c.precision == Precision::bf16 && c.device == "cpu" && c.model.tie == Tie::head)
    throw EnvironmentError(
        "tie=head with prec=bf16 on cpu needs LibTorch >= 2.0 (1.13's CPU autocast fails the "
        "plain run); this build has " +
        std::string(TORCH_VERSION));
#endif
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kb = 0;
    meminfo >> kb;
    if (key == "MemAvailable:") {
      const double need = estimated_bytes(c), have = kb * 1024.0;
      if (need > 0.8 * have)
        throw EnvironmentError("the case needs about " + std::to_string(static_cast<long>(need / (1 << 20))) +
                               " MiB and this machine has " + std::to_string(static_cast<long>(have / (1 << 20))) +
                               " MiB available");
      break;
    }
    meminfo.ignore(1 << 10, '\n');
  }
}

RunRecord train(const Case& c, CheckpointImpl* impl, const TrainOptions& options) {
  if (impl && impl->is_strategy()) check_strategy_case(c);
  MemoryReporting reporting;
  const Observations o = prepare(c);
  Trainer t(c, o, impl, Mode::normal, -1);
  t.record_sites(options.record_sites);
  RunRecord r;
  try {
    for (int s = 0; s < c.steps; ++s) r.steps.push_back(t.step(s));
    t.finish(r, nullptr);
  } catch (const std::exception& e) {
    if (is_out_of_memory(e))
      throw EnvironmentError("the run ran out of memory (" + first_line(e.what()) + "): give it more memory");
    t.finish(r, &e);
  }
  return r;
}

double step_gradient_scale(const StepRecord& b) {
  double scale = b.hook_input_max;
  for (size_t k = 0; k < b.grads.items.size(); ++k)
    if (b.grad_defined[k])
      for (double v : b.grads.items[k].data) scale = std::max(scale, std::abs(v));
  for (const auto& d : b.dx)
    for (double v : d) scale = std::max(scale, std::abs(v));
  return scale;
}

namespace {
// Whether every gradient and x.grad of the run under test is within the tightest fixed bound
// grad-baseline applies (reorder_tolerance of the step's largest gradient): then the measured floor
// cannot change the verdict, and the reference design is not run (a correct implementation pays for it
// only on ill-conditioned steps).
bool within_fixed_bound(const Observations& o) {
  const int paths = o.c.gp > 0.0 ? 2 : 1;
  auto within = [](const std::vector<double>& t, const std::vector<double>& b, double atol) {
    if (t.size() != b.size()) return true;  // judged by grad-baseline itself (defined vs undefined)
    for (size_t i = 0; i < t.size(); ++i)
      if (!(std::abs(t[i] - b[i]) <= atol) && !(t[i] == b[i])) return false;
    return true;
  };
  for (size_t s = 0; s < o.test.steps.size() && s < o.baseline.steps.size(); ++s) {
    const StepRecord &t = o.test.steps[s], &b = o.baseline.steps[s];
    const double atol = reorder_tolerance(o.c.precision, paths, step_gradient_scale(b)).atol;
    for (size_t k = 0; k < b.grads.items.size() && k < t.grads.items.size(); ++k)
      if (b.grad_defined[k] && t.grad_defined[k] && !within(t.grads.items[k].data, b.grads.items[k].data, atol))
        return false;
    for (size_t m = 0; m < b.dx.size() && m < t.dx.size(); ++m)
      if (!within(t.dx[m], b.dx[m], atol)) return false;
  }
  return true;
}

// Observations::design: the reference reentrant checkpoint in lockstep with the run under test's
// parameters, on Cases where its gradients can be judged against the baseline's.
void run_design_floor(Observations& o, const GlobalStateCheck& entry) {
  const Case& c = o.c;
  if (o.test.steps.empty()) {
    o.design_why_not = "the run under test completed no step";
  } else if (within_fixed_bound(o)) {
    o.design_why_not = "every gradient of the run under test is within the fixed rounding bound";
  } else if (c.hook != Hook::none) {
    o.design_why_not =
        "a reentrant checkpoint runs gradient hooks once per nested backward (hook=" + std::string(to_string(c.hook)) +
        ")";
  } else if (o.strategy) {
    o.design_why_not = "a strategy chose what to checkpoint";
  }
  if (!o.design_why_not.empty()) return;
  try {
    const RestoreGlobalState restore{entry};
    // A reentrant design can cost far more than the run under test (nested backwards through shared
    // parameters under a gradient penalty): it stops between steps past a budget, and the fixed bound
    // alone judges, so that the floor never turns a Case into a per-case timeout.
    double test_s = 0.0;
    for (const StepTime& t : o.test.times) test_s += t.forward + t.backward + t.optimizer;
    const double budget_s = std::max(5.0, 4.0 * test_s);
    const auto start = std::chrono::steady_clock::now();
    faults::ReentrantCheckpoint reentrant;
    Trainer d(c, o, &reentrant, Mode::normal, -1);
    for (size_t s = 0; s < o.test.steps.size(); ++s) {
      o.design.steps.push_back(d.step(static_cast<int>(s)));
      d.load(o.test.steps[s]);
      const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s + 1 < o.test.steps.size() && spent > budget_s) {
        o.design = RunRecord{};
        o.design_why_not =
            fmt::format("the reference reentrant run took {:.1f} s, past its budget of {:.1f} s", spent, budget_s);
        return;
      }
    }
    d.finish(o.design, nullptr);
    o.design_ran = true;
  } catch (const std::exception& e) {
    o.design = RunRecord{};
    o.design_why_not = "the reference reentrant run failed: " + first_line(e.what());
  }
}
}  // namespace

std::vector<ReferenceTensor> reference_tensors(const Observations& o, size_t s) {
  const ReferenceRecord& ref = o.reference;
  const Case& c = o.c;
  const StepRecord& t = o.test.steps.at(s);
  const ExpectedStep& e64 = ref.fp64.at(s);
  std::vector<const ExpectedStep*> e32;
  if (s < ref.fp32.size() && ref.fp32[s]) e32 = {&ref.fp32[s]->plain, &ref.fp32[s]->perturbed};
  auto evaluations = [&](auto pick) {
    std::vector<std::vector<double>> out;
    for (const ExpectedStep* e : e32) out.push_back(pick(*e));
    return out;
  };
  std::vector<ReferenceTensor> out;
  for (size_t m = 0; m < t.losses.size(); ++m)
    out.push_back({{fmt::format("loss (micro {})", m), {}, {}},
                   {t.losses[m]},
                   {e64.losses.at(m)},
                   evaluations([m](const ExpectedStep& e) { return std::vector<double>{e.losses.at(m)}; })});
  for (size_t k = e64.grads.items.size(); k-- > 0;) {
    if (!o.trainable.at(k)) continue;
    const NamedArray& g = e64.grads.items[k];
    const std::vector<std::string> dims =
        g.shape.size() == 2 ? std::vector<std::string>{"row", "col"} : std::vector<std::string>{"i"};
    out.push_back(
        {{g.name + ".grad", g.shape, dims}, t.grads.items.at(k).data, g.data, evaluations([k](const ExpectedStep& e) {
           return e.grads.items.at(k).data;
         })});
  }
  if (!c.input_frozen)
    for (size_t m = 0; m < t.dx.size(); ++m)
      out.push_back({{fmt::format("x.grad (micro {})", m),
                      {c.batch, seq_of(c, static_cast<int>(m)), c.model.input_width()},
                      {"b", "t", "c"}},
                     t.dx[m],
                     e64.dx.at(m),
                     evaluations([m](const ExpectedStep& e) { return e.dx.at(m); })});
  for (size_t k = 0; k < e64.batchnorm.items.size(); ++k) {
    const NamedArray& a = e64.batchnorm.items[k];
    out.push_back({{a.name + " (after the step)", a.shape, {"i"}},
                   t.ledger.batchnorm.items.at(k).data,
                   a.data,
                   evaluations([k](const ExpectedStep& e) { return e.batchnorm.items.at(k).data; })});
  }
  return out;
}

bool reference_needs_fp32(const Observations& o, size_t s) {
  const std::vector<ReferenceTensor> tensors = reference_tensors(o, s);
  std::vector<const std::vector<double>*> all64;
  for (const auto& x : tensors) all64.push_back(&x.e64);
  const double model_scale = reference_model_scale(all64);
  for (const auto& x : tensors) {
    if (!std::all_of(x.e64.begin(), x.e64.end(), [](double v) { return std::isfinite(v); })) return true;
    if (!compare_values(x.view, x.actual, x.e64, reference_floor_tolerance(x.e64, model_scale)).ok()) return true;
  }
  return false;
}

Observations observe(const Case& c, CheckpointImpl& impl) {
  check_environment(c);
  if (impl.is_strategy()) check_strategy_case(c);
  Observations o = prepare(c);
  // The two runs advance in lockstep, and the baseline takes each step from the parameters the run
  // under test reached: every step is then compared on its own, even after a tolerated difference
  // (a shared parameter's gradient summed in another order) has moved the parameters apart.
  const GlobalStateCheck entry;
  Trainer base(c, o, nullptr, Mode::normal, -1), test(c, o, &impl, Mode::normal, -1);
  const std::exception* test_error = nullptr;
  std::unique_ptr<TracedError> saved;  // the test run's exception, its traceback taken while it is there
  std::optional<MemoryReporting> reporting(std::in_place);  // the two runs' memory (memory-saved)
  for (int s = 0; s < c.steps && !test_error; ++s) {
    try {
      o.baseline.steps.push_back(base.step(s));
    } catch (const std::exception& e) {
      const std::string msg = first_line(e.what());
      if (is_out_of_memory(e)) throw EnvironmentError("the baseline run ran out of memory: " + msg);
      throw std::runtime_error("the baseline run (no checkpointing) failed: " + msg);
    }
    try {
      o.test.steps.push_back(test.step(s));
    } catch (const std::exception& e) {
      if (is_out_of_memory(e))
        throw EnvironmentError("the run under test ran out of memory (" + first_line(e.what()) +
                               ") where the baseline did not: give the run more memory (memory-saved judges how "
                               "much a checkpoint keeps on Cases that fit)");
      saved = std::make_unique<TracedError>(e.what(), exception_trace(e));
      entry.restore();
      test_error = saved.get();
      break;
    }
    const StepRecord &t = o.test.steps.back(), &b = o.baseline.steps.back();
    if (t.params_after.items != b.params_after.items || t.ledger.batchnorm.items != b.ledger.batchnorm.items ||
        t.optimizer.items != b.optimizer.items)
      base.load(t);
  }
  reporting.reset();
  base.finish(o.baseline, nullptr);
  test.finish(o.test, test_error);
  if (impl.is_strategy()) apply_effective_plan(o);
  run_design_floor(o, entry);

  const int target = experiment_segment(o);
  if (target < 0) {
    o.throw_exp.why_not = o.inplace_exp.why_not =
        o.strategy ? "the strategy checkpointed no block with gradient flowing through it in step 0, micro-batch 0"
                   : "no checkpointed segment has gradient flowing through it";
  } else {
    try {
      const RestoreGlobalState restore{entry};
      Trainer t(c, o, &impl, Mode::throw_in_recompute, target);
      t.experiment();
      o.throw_exp = t.throw_result;
      o.throw_exp.ran = true, o.throw_exp.segment = target;
    } catch (const std::exception& e) {
      o.throw_exp.why_not = "its forward failed: " + first_line(e.what());
    }
    if (c.inplace) {
      try {
        const RestoreGlobalState restore{entry};
        Trainer t(c, o, &impl, Mode::inplace_input, target);
        t.experiment();
        o.inplace_exp = t.inplace_result;
        o.inplace_exp.ran = true, o.inplace_exp.segment = target;
        if (!o.inplace_exp.threw) {
          // Backward went through: correct only if the implementation recomputed from its own copy of
          // the input, i.e. its gradients are those of the forward it ran (the input left alone).
          try {
            Trainer r(c, o, &impl, Mode::inplace_reference, target);
            r.experiment();
            o.inplace_exp.reference_ran = !r.inplace_result.threw;
            o.inplace_exp.reference_error = r.inplace_result.message;
            o.inplace_exp.expected_grads = std::move(r.inplace_result.grads);
            o.inplace_exp.expected_grad_defined = std::move(r.inplace_result.grad_defined);
            o.inplace_exp.expected_dx = std::move(r.inplace_result.dx);
          } catch (const std::exception& e) {
            o.inplace_exp.reference_ran = false;
            o.inplace_exp.reference_error = "its forward failed: " + first_line(e.what());
          }
        }
      } catch (const std::exception& e) {
        o.inplace_exp.why_not = "its forward failed: " + first_line(e.what());
      }
    } else {
      o.inplace_exp.why_not = "the case does not ask for it (inplace=false)";
    }
  }

  if (c.resume == 0) {
    o.resume_exp.why_not = "the case does not ask for it (resume=0)";
  } else if (!o.test.completed) {
    o.resume_exp.why_not = "the run under test did not complete";
  } else {
    const ImplInfo* info = find_impl(c.impl);
    const StateFault fault = info ? info->state_fault : StateFault::none;
    o.resume_exp.ran = true;
    o.resume_exp.position = c.resume;
    try {
      const RestoreGlobalState restore{entry};
      // The state goes through the file format (encoded, verified, decoded) in memory: no file I/O per
      // case; cli_tests carries it through real files and separate processes.
      std::string bytes;
      {
        Trainer first(c, o, &impl, Mode::normal, -1);
        first.advance_to(c.resume);
        bytes = encode_state(first.save_state(fault));
      }
      Trainer second(c, o, &impl, Mode::normal, -1);
      second.load_state(decode_state(bytes, c));
      o.resume_exp.steps = second.advance_to(c.steps * c.micro);
    } catch (const std::exception& e) {
      o.resume_exp.error = first_line(e.what());
    }
  }

  if (!o.test.completed)
    o.reference.why_not = "the run under test did not complete";
  else if (c.precision != Precision::fp32)
    o.reference.why_not = "prec=" + std::string(to_string(c.precision)) +
                          ": the reference does not model autocast's casts (grad-baseline is the AMP check)";
  else if (c.gp > 0.0)
    o.reference.why_not = "gp>0: the reference has no second derivatives (grad-baseline checks the penalty)";
  else if (std::string off = off_case_shapes(c, o.test); !off.empty())
    o.reference.why_not = o.reference.off_shape = off + " (the run under test's forward ran at other shapes)";
  else {
    for (int s = 0; s < c.steps; ++s) {
      o.reference.fp64.push_back(expected_step(o, s, RefScalar::fp64));
      o.reference.fp32.emplace_back();
      if (reference_needs_fp32(o, static_cast<size_t>(s)))
        o.reference.fp32.back() =
            Fp32Evaluation{expected_step(o, s, RefScalar::fp32), expected_step(o, s, RefScalar::fp32, {}, true)};
    }
    o.reference.computed = true;
  }
  return o;
}

struct TrainingRun::Impl {
  Observations o;
  std::unique_ptr<Trainer> t;
};

TrainingRun::TrainingRun(const Case& c, CheckpointImpl* impl) : impl_(std::make_unique<Impl>()) {
  check_environment(c);
  if (impl && impl->is_strategy()) check_strategy_case(c);
  impl_->o = prepare(c);
  impl_->t = std::make_unique<Trainer>(impl_->o.c, impl_->o, impl, Mode::normal, -1);
}
TrainingRun::~TrainingRun() = default;
int TrainingRun::position() const {
  return impl_->t->position();
}
int TrainingRun::end() const {
  return impl_->o.c.steps * impl_->o.c.micro;
}
std::vector<StepRecord> TrainingRun::advance_to(int position) {
  return impl_->t->advance_to(std::min(position, end()));
}
void TrainingRun::record_sites(bool on) {
  impl_->t->record_sites(on);
}
RunRecord TrainingRun::record(const std::exception* error) {
  RunRecord r;
  impl_->t->finish(r, error);
  return r;
}
TrainingState TrainingRun::state(StateFault fault) const {
  return impl_->t->save_state(fault);
}
void TrainingRun::load(const TrainingState& s) {
  if (s.case_key != state_key(impl_->o.c)) throw StateError("state file: saved from another model or data");
  impl_->t->load_state(s);
}
std::string TrainingRun::digest() const {
  TrainingState s = impl_->t->save_state(StateFault::none);
  s.case_key.clear();
  const std::string bytes = encode_state(s);
  const uint64_t h = fnv1a(bytes.data(), bytes.size());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string describe_effective_plan(const Observations& o) {
  auto span = [](int a, int b) { return a == b ? std::to_string(a) : fmt::format("{}..{}", a, b); };
  std::string ck, plain;
  if (o.strategy && !o.strategy_groups.empty()) {
    for (const auto& [a, b] : o.strategy_groups) ck += (ck.empty() ? "" : ", ") + span(a, b);
  } else {
    for (size_t s = 0; s < o.segments.size(); ++s)
      if (o.segments[s].checkpointed) ck += (ck.empty() ? "" : ", ") + std::to_string(s);
  }
  for (size_t s = 0; s < o.segments.size(); ++s)
    if (!o.segments[s].checkpointed) plain += (plain.empty() ? "" : ", ") + std::to_string(s);
  if (ck.empty()) return "no block checkpointed";
  return "block(s) " + ck + " checkpointed" + (plain.empty() ? "" : "; " + plain + " plain");
}

}  // namespace ckv
