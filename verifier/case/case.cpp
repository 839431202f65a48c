// verifier/case/case.cpp: the Case field table and everything it drives (see case.hpp). The line form
// and the JSON form both go through the table's setters, so there is one validation path.
#include "verifier/case/case.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace ckv {
using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw CaseError("case: " + msg);
}

// Shortest decimal that reads back as the same double, so lines stay readable and still round-trip.
std::string shortest(double v) {
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string quoted(const json& j) {
  return sanitize(j.is_string() ? "\"" + j.get<std::string>() + "\"" : j.dump());
}

template <class E, size_t N>
using Names = std::array<std::pair<E, std::string_view>, N>;

template <class E, size_t N>
std::string joined(const Names<E, N>& t) {
  std::string out;
  for (const auto& r : t) out += (out.empty() ? "" : "|") + std::string(r.second);
  return out;
}

constexpr Names<DropoutImpl, 2> kDropImpl{{{DropoutImpl::explicit_mask, "explicit"}, {DropoutImpl::native, "native"}}};
constexpr Names<Precision, 3> kPrec{{{Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"}}};
constexpr Names<Freeze, 3> kFreeze{{{Freeze::none, "none"}, {Freeze::alt, "alt"}, {Freeze::blocks, "blocks"}}};
constexpr Names<Hook, 3> kHook{{{Hook::none, "none"}, {Hook::scale, "scale"}, {Hook::clip, "clip"}}};
constexpr Names<Schedule, 2> kSched{{{Schedule::fb, "fb"}, {Schedule::ffbb, "ffbb"}}};
constexpr Names<Optimizer, 2> kOpt{{{Optimizer::sgd, "sgd"}, {Optimizer::adam, "adam"}}};
constexpr Names<InplaceOn, 3> kInplaceOn{
    {{InplaceOn::input, "input"}, {InplaceOn::mask, "mask"}, {InplaceOn::param, "param"}}};
constexpr Names<SegIn, 2> kSegIn{{{SegIn::plain, "plain"}, {SegIn::view, "view"}}};
constexpr Names<TpKeep, 2> kTpKeep{{{TpKeep::none, "none"}, {TpKeep::reduced, "reduced"}}};
constexpr Names<SegIO, 2> kSegIO{{{SegIO::single, "single"}, {SegIO::multi, "multi"}}};
// The model's enums are spelled once, in reference/config.hpp.
constexpr const Names<NormKind, 2>& kNorm = kNormNames;
constexpr const Names<NormPlacement, 2>& kPos = kPlacementNames;
constexpr const Names<Activation, 4>& kAct = kActivationNames;
constexpr const Names<LossKind, 2>& kLoss = kLossNames;
constexpr const Names<Tie, 3>& kTie = kTieNames;
constexpr const Names<SegOut, 3>& kSegOut = kSegOutNames;
constexpr const Names<RandOp, 2>& kRand = kRandOpNames;
constexpr std::array<std::pair<unsigned, std::string_view>, 6> kEffects{{{kCounter, "counter"},
                                                                         {kLog, "log"},
                                                                         {kBatchNorm, "bn"},
                                                                         {kNoise, "noise"},
                                                                         {kCache, "cache"},
                                                                         {kExternal, "external"}}};

template <class E, size_t N>
std::string_view name_of(const Names<E, N>& t, E v) {
  for (const auto& r : t)
    if (r.first == v) return r.second;
  return "?";
}

// A field: its key, documentation, and how it moves between Case, JSON and line text.
struct Field {
  std::string key, values, help;
  bool always = true;
  std::function<json(const Case&)> get;
  std::function<void(Case&, const json&)> set;  // type- and range-checked; throws CaseError naming the key
  std::function<json(const std::string&)> parse_text = [](const std::string& v) { return json(v); };
  std::function<std::string(const json&)> print_text = [](const json& j) { return j.get<std::string>(); };
};

json parse_int_text(const std::string& key, const std::string& v, const std::string& range) {
  const bool digits =
      !v.empty() && v.find_first_not_of("0123456789", v[0] == '-' ? 1 : 0) == std::string::npos && v != "-";
  if (!digits) fail(key + "=\"" + sanitize(v) + "\" is not an integer");
  errno = 0;
  const long long n = std::strtoll(v.c_str(), nullptr, 10);
  if (errno == ERANGE) fail(key + "=" + sanitize(v) + " is outside " + range);  // beyond 64 bits
  return json(n);
}
json parse_double_text(const std::string& key, const std::string& v) {
  char* end = nullptr;
  // Overflow reads as inf; underflow (ERANGE with a subnormal or zero) is accepted, as the JSON form does.
  const double d = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(d))
    fail(key + "=\"" + sanitize(v) + "\" is not a finite number");
  return json(d);
}

Field int_field(std::string key, std::string help, int lo, int hi, std::function<int&(Case&)> ref, bool always = true) {
  Field f;
  f.key = key;
  f.values = std::to_string(lo) + ".." + std::to_string(hi);
  f.help = std::move(help);
  f.always = always;
  f.get = [ref](const Case& c) { return json(ref(const_cast<Case&>(c))); };
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  f.set = [key, lo, hi, range, ref](Case& c, const json& j) {
    if (!j.is_number_integer()) fail(key + " must be an integer in " + range + ", got " + quoted(j));
    const bool in_range = j.is_number_unsigned() ? j.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                                 : j.get<int64_t>() >= lo && j.get<int64_t>() <= hi;
    if (!in_range || j.get<int64_t>() < lo) fail(key + "=" + quoted(j) + " is outside " + range);
    ref(c) = static_cast<int>(j.get<int64_t>());
  };
  f.parse_text = [key, range](const std::string& v) { return parse_int_text(key, v, range); };
  f.print_text = [](const json& j) { return j.dump(); };
  return f;
}

// A number in [lo, hi) (or [lo, hi] when `hi_closed`), with `lo` excluded when `lo_open`.
Field double_field(std::string key, std::string help, double lo, double hi, bool lo_open, bool hi_closed,
                   std::function<double&(Case&)> ref, bool always = true) {
  Field f;
  f.key = key;
  f.values = std::string(lo_open ? "(" : "[") + shortest(lo) + ", " + shortest(hi) + (hi_closed ? "]" : ")");
  f.help = std::move(help);
  f.always = always;
  const std::string range = f.values;
  f.get = [ref](const Case& c) { return json(ref(const_cast<Case&>(c))); };
  f.set = [key, lo, hi, lo_open, hi_closed, range, ref](Case& c, const json& j) {
    if (!j.is_number()) fail(key + " must be a number in " + range + ", got " + quoted(j));
    const double v = j.get<double>();
    const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_closed ? v <= hi : v < hi);
    if (!ok) fail(key + "=" + quoted(j) + " is outside " + range);
    ref(c) = v + 0.0;  // -0 reads as 0: the line leaves a field at its default out, and a Case is its JSON
  };
  f.parse_text = [key](const std::string& v) { return parse_double_text(key, v); };
  f.print_text = [](const json& j) { return shortest(j.get<double>()); };
  return f;
}

template <class E, size_t N, class Ref>
Field enum_field(std::string key, std::string help, const Names<E, N>& names, Ref ref, bool always = true) {
  Field f;
  f.key = key;
  f.values = joined(names);
  f.help = std::move(help);
  f.always = always;
  f.get = [names, ref](const Case& c) { return json(std::string(name_of(names, ref(const_cast<Case&>(c))))); };
  f.set = [key, names, ref](Case& c, const json& j) {
    if (j.is_string())
      for (const auto& r : names)
        if (r.second == j.get<std::string>()) {
          ref(c) = r.first;
          return;
        }
    fail(key + "=" + quoted(j) + " is not one of " + joined(names));
  };
  return f;
}

Field bool_field(std::string key, std::string help, std::function<bool&(Case&)> ref) {
  Field f;
  f.key = key;
  f.values = "true|false";
  f.help = std::move(help);
  f.always = false;
  f.get = [ref](const Case& c) { return json(ref(const_cast<Case&>(c))); };
  f.set = [key, ref](Case& c, const json& j) {
    if (!j.is_boolean()) fail(key + " must be true or false, got " + quoted(j));
    ref(c) = j.get<bool>();
  };
  f.parse_text = [key](const std::string& v) -> json {
    if (v == "true") return true;
    if (v == "false") return false;
    fail(key + "=\"" + sanitize(v) + "\" is not one of true|false");
  };
  f.print_text = [](const json& j) { return j.dump(); };
  return f;
}

constexpr int kMaxDevice = 999;

const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::vector<Field> t;
    t.push_back(
        int_field("layers", "Transformer blocks", 1, kMaxLayers, [](Case& c) -> int& { return c.model.layers; }));
    t.push_back(int_field("d", "model width d_model (heads must divide it)", 1, 4096,
                          [](Case& c) -> int& { return c.model.d_model; }));
    t.push_back(int_field("heads", "attention heads", 1, 64, [](Case& c) -> int& { return c.model.heads; }));
    t.push_back(int_field("ffn", "FFN width multiplier (hidden = ffn * d)", 1, 16,
                          [](Case& c) -> int& { return c.model.ffn_mult; }));
    t.push_back(int_field("vocab", "head width: classes (ce) or regression outputs (mse)", 1, 65536,
                          [](Case& c) -> int& { return c.model.vocab; }));
    t.push_back(enum_field("norm", "normalisation", kNorm, [](Case& c) -> NormKind& { return c.model.norm; }));
    t.push_back(enum_field("pos", "norm placement (pre-LN or post-LN)", kPos,
                           [](Case& c) -> NormPlacement& { return c.model.placement; }));
    {
      Field f;
      f.key = "attn";
      f.values = "causal|bidir|off";
      f.help = "attention: causal, bidirectional, or none (the block is norm -> FFN -> residual, seed 001's lab)";
      f.get = [](const Case& c) { return json(!c.model.attention ? "off" : c.model.causal ? "causal" : "bidir"); };
      f.set = [](Case& c, const json& j) {
        const std::string v = j.is_string() ? j.get<std::string>() : "";
        if (v == "off")
          c.model.attention = false;
        else if (v == "causal" || v == "bidir")
          c.model.attention = true, c.model.causal = v == "causal";
        else
          fail("attn=" + quoted(j) + " is not one of causal|bidir|off");
      };
      t.push_back(f);
    }
    t.push_back(enum_field("act", "FFN activation", kAct, [](Case& c) -> Activation& { return c.model.activation; }));
    t.push_back(enum_field("loss", "loss: cross-entropy or mean squared error", kLoss,
                           [](Case& c) -> LossKind& { return c.model.loss; }));
    t.push_back(enum_field(
        "tie", "weight tying: blocks share layer 0's parameters, or the head is also the input projection", kTie,
        [](Case& c) -> Tie& { return c.model.tie; }, false));
    {
      Field f;
      f.key = "segio";
      f.values = joined(kSegIO);
      f.help = "segment signature: fn(h) -> h, or fn(h, key_mask, start, stop, aux_weight) -> (h, aux_loss)";
      f.always = false;
      f.get = [](const Case& c) { return json(std::string(to_string(c.segio()))); };
      f.set = [](Case& c, const json& j) {
        const std::string v = j.is_string() ? j.get<std::string>() : "";
        if (v != "single" && v != "multi") fail("segio=" + quoted(j) + " is not one of " + joined(kSegIO));
        c.model.key_padding = v == "multi";
        c.model.aux_weight = v == "multi" ? kAuxWeight : 0.0;
      };
      t.push_back(f);
    }
    {
      Field f;
      f.key = "drop";
      f.values = "4 rates in [0, 1)";
      f.help = "dropout rates of the sites attn_probs, attn_out, ffn_hidden, ffn_out (one rate: all four)";
      f.get = [](const Case& c) { return json(std::vector<double>(c.dropout.begin(), c.dropout.end())); };
      f.set = [](Case& c, const json& j) {
        const json a = j.is_number() ? json::array({j, j, j, j}) : j;
        if (!a.is_array() || a.size() != kNumDropoutSites)
          fail("drop must be one rate or 4 rates (" + allowed_names<DropoutSite>() + "), got " + quoted(j));
        for (DropoutSite s : kAllDropoutSites) {
          const json& r = a[static_cast<size_t>(s)];
          const std::string key = "drop." + std::string(to_string(s));
          if (!r.is_number() || !std::isfinite(r.get<double>()) || !(r.get<double>() >= 0.0 && r.get<double>() < 1.0))
            fail(key + "=" + quoted(r) + " is outside [0, 1)");
          c.dropout[static_cast<size_t>(s)] = r.get<double>() + 0.0;  // -0 reads as 0
        }
      };
      f.parse_text = [](const std::string& v) {
        json rates = json::array();
        std::stringstream ps(v);
        for (std::string part; std::getline(ps, part, ',');) rates.push_back(parse_double_text("drop", part));
        if (rates.size() == 1) return rates[0];
        return rates;
      };
      f.print_text = [](const json& j) {
        std::string out;
        for (const auto& r : j) out += (out.empty() ? "" : ",") + shortest(r.get<double>());
        return out;
      };
      t.push_back(f);
    }
    {
      Field f;
      f.key = "fx";
      f.values = "none|counter,log,bn,noise,cache,external";
      f.help = "side-effecting modules after every block's FFN half (a comma list; see docs/side-effects.md)";
      f.always = false;
      f.get = [](const Case& c) { return json(effects_to_string(c.model.effects)); };
      f.set = [](Case& c, const json& j) {
        std::string err;
        if (!j.is_string() || !effects_from_string(j.get<std::string>(), c.model.effects, err))
          fail("fx=" + quoted(j) + " " + (err.empty() ? "must be a string" : err));
      };
      t.push_back(f);
    }
    t.push_back(enum_field("dropimpl", "dropout: ckverify's explicit bernoulli mask, or torch::dropout", kDropImpl,
                           [](Case& c) -> DropoutImpl& { return c.dropout_impl; }));
    t.push_back(int_field("batch", "batch size per micro-batch", 1, 1024, [](Case& c) -> int& { return c.batch; }));
    t.push_back(int_field("seq", "sequence length", 1, 4096, [](Case& c) -> int& { return c.seq; }));
    t.push_back(int_field(
        "seqvar", "0, or micro-batch m is seqvar x m tokens shorter than seq (shapes that vary across micro-batches)",
        0, 4095, [](Case& c) -> int& { return c.seqvar; }, false));
    t.push_back(int_field("steps", "optimizer steps", 1, 1000, [](Case& c) -> int& { return c.steps; }));
    t.push_back(int_field(
        "micro", "micro-batches accumulated per step (no zero_grad between them)", 1, 16,
        [](Case& c) -> int& { return c.micro; }, false));
    t.push_back(enum_field(
        "sched", "micro-batch order: forward+backward each, or all forwards then all backwards", kSched,
        [](Case& c) -> Schedule& { return c.sched; }, false));
    t.push_back(double_field("lr", "learning rate", 0.0, 1e6, true, true, [](Case& c) -> double& { return c.lr; }));
    t.push_back(enum_field(
        "opt", "optimizer: SGD, or Adam (betas 0.9/0.999, eps 1e-8; its moments are training state)", kOpt,
        [](Case& c) -> Optimizer& { return c.opt; }, false));
    t.push_back(int_field(
        "resume", "0, or save the run under test after this many micro-batches, reload it fresh and continue", 0, 16000,
        [](Case& c) -> int& { return c.resume; }, false));
    {
      Field f = bool_field("input", "whether the block-stack input x requires grad",
                           [](Case& c) -> bool& { return c.input_frozen; });
      f.values = "trainable|frozen";
      f.get = [](const Case& c) { return json(c.input_frozen ? "frozen" : "trainable"); };
      f.set = [](Case& c, const json& j) {
        const std::string v = j.is_string() ? j.get<std::string>() : "";
        if (v != "trainable" && v != "frozen") fail("input=" + quoted(j) + " is not one of trainable|frozen");
        c.input_frozen = v == "frozen";
      };
      f.parse_text = [](const std::string& v) { return json(v); };
      f.print_text = [](const json& j) { return j.get<std::string>(); };
      t.push_back(f);
    }
    t.push_back(enum_field(
        "freeze", "frozen parameters: none, every other tensor (LoRA-style), or all block parameters", kFreeze,
        [](Case& c) -> Freeze& { return c.freeze; }, false));
    t.push_back(enum_field(
        "hook", "gradient hook on every trainable parameter: x0.5, or clamp to +-0.01", kHook,
        [](Case& c) -> Hook& { return c.hook; }, false));
    t.push_back(double_field(
        "gp", "gradient penalty weight: loss + gp * |dloss/dx|^2 through create_graph (0: none)", 0.0, 1e6, false, true,
        [](Case& c) -> double& { return c.gp; }, false));
    t.push_back(bool_field("inplace", "also modify a checkpointed segment's input in place before backward",
                           [](Case& c) -> bool& { return c.inplace; }));
    t.push_back(enum_field(
        "inplace_on",
        "what inplace=true modifies: the hidden state a checkpointed segment received, the key mask, or that "
        "segment's parameters between micro-batches",
        kInplaceOn, [](Case& c) -> InplaceOn& { return c.inplace_on; }, false));
    t.push_back(int_field(
        "inplace_micro",
        "the micro-batch inplace=true modifies after its forward (under ffbb: with later ones waiting); under "
        "inplace_on=param the one before whose forward the parameters change",
        0, 15, [](Case& c) -> int& { return c.inplace_micro; }, false));
    t.push_back(enum_field(
        "segin", "a segment's hidden-state input: as produced, or a non-contiguous view with a storage offset", kSegIn,
        [](Case& c) -> SegIn& { return c.segin; }, false));
    t.push_back(enum_field(
        "segout",
        "a tensor every segment returns unchanged: none, the stack input itself, or a view of it (outputs that alias "
        "inputs; the stack output gains 0.5 x)",
        kSegOut, [](Case& c) -> SegOut& { return c.model.segout; }, false));
    t.push_back(enum_field(
        "rand",
        "random ops other than dropout: none, or jitter (every FFN output scaled per token by 1 + 0.1 eps, eps ~ "
        "N(0,1) of shape (batch, seq, 1): an odd number of normal draws where batch x seq is odd)",
        kRand, [](Case& c) -> RandOp& { return c.model.rand; }, false));
    {
      Field f = int_field(
          "tp",
          "tensor-parallel degree: 1, or the Case runs as 2 or 4 processes joined over Gloo, each holding heads/tp of "
          "the attention heads and d_ff/tp of the FFN (docs/parallel.md)",
          1, 4, [](Case& c) -> int& { return c.tp; }, false);
      f.values = "1|2|4";
      t.push_back(f);
    }
    t.push_back(enum_field(
        "tpkeep",
        "tp > 1: what a checkpointed segment keeps of its tensor-parallel regions: nothing, or each forward "
        "all-reduce's output (the recompute then runs only local ops, no collective)",
        kTpKeep, [](Case& c) -> TpKeep& { return c.tpkeep; }, false));
    {
      Field f = int_field(
          "dp",
          "data-parallel replicas: 1, or the step's micro-batches are split between 2 replicas (tp ranks each) "
          "whose gradients a DDP-style reducer averages after every backward (docs/parallel.md)",
          1, 2, [](Case& c) -> int& { return c.dp; }, false);
      f.values = "1|2";
      t.push_back(f);
    }
    t.push_back(enum_field("prec", "precision: fp32, or the forward under bf16 / fp16 autocast", kPrec,
                           [](Case& c) -> Precision& { return c.precision; }));
    {
      Field f;
      f.key = "device";
      f.values = "cpu|cuda|cuda:N";
      f.help = "device of the LibTorch runs";
      f.get = [](const Case& c) { return json(c.device); };
      f.set = [](Case& c, const json& j) {
        const std::string v = j.is_string() ? j.get<std::string>() : "";
        const bool indexed = v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.size() <= 8 &&
                             v.find_first_not_of("0123456789", 5) == std::string::npos;
        if (v != "cpu" && v != "cuda" && !indexed) fail("device=" + quoted(j) + " is not one of cpu|cuda|cuda:N");
        c.device = v;
      };
      t.push_back(f);
    }
    {
      Field f;
      f.key = "plan";
      f.values = kPlanSpellings;
      f.help = "checkpoint plan (see docs/case-fields.md, Plans)";
      f.get = [](const Case& c) { return json(c.plan.to_string()); };
      f.set = [](Case& c, const json& j) {
        if (!j.is_string()) fail("plan must be a string (" + std::string(kPlanSpellings) + "), got " + quoted(j));
        std::string err;
        if (!Plan::parse(j.get<std::string>(), c.plan, err)) fail(sanitize(err, 160));
      };
      t.push_back(f);
    }
    {
      Field f;
      f.key = "impl";
      f.values = "name";
      f.help =
          "implementation under test: builtin, a fault (ckverify list), a plugin PATH.so[:k=v,...] or "
          "py:MODULE:CALLABLE[:k=v,...]";
      f.get = [](const Case& c) { return json(c.impl); };
      f.set = [](Case& c, const json& j) {
        const std::string v = j.is_string() ? j.get<std::string>() : "";
        const bool printable = v.find_first_of(" \t\r\n") == std::string::npos && sanitize(v, 512) == v;
        if (v.empty() || !printable)
          fail("impl=" + quoted(j) +
               " must be a non-empty name or spec of at most 512 printable ASCII characters, no blanks");
        c.impl = v;
      };
      t.push_back(f);
    }
    {
      Field f;
      f.key = "seed";
      f.values = "0..2^64-1";
      f.help = "seed of weights, inputs and the generators";
      f.get = [](const Case& c) { return json(c.seed); };
      f.set = [](Case& c, const json& j) {
        const bool ok = j.is_number_unsigned() || (j.is_number_integer() && j.get<int64_t>() >= 0);
        if (!ok) fail("seed must be an integer in [0, 2^64), got " + quoted(j));
        c.seed = j.get<uint64_t>();
      };
      f.parse_text = [](const std::string& v) -> json {
        errno = 0;
        char* end = nullptr;
        const unsigned long long s = std::strtoull(v.c_str(), &end, 10);
        if (v.empty() || v[0] == '-' || end != v.c_str() + v.size() || errno == ERANGE)
          fail("seed=\"" + sanitize(v) + "\" is not an integer in [0, 2^64)");
        return json(static_cast<uint64_t>(s));
      };
      f.print_text = [](const json& j) { return j.dump(); };
      t.push_back(f);
    }
    return t;
  }();
  return table;
}

const Field* find_field(const std::string& key) {
  for (const auto& f : fields())
    if (f.key == key) return &f;
  return nullptr;
}

std::string all_keys() {
  std::string out;
  for (const auto& f : fields()) out += (out.empty() ? "" : "|") + f.key;
  return out;
}

Case from_object(const json& j) {
  if (!j.is_object()) fail("a case must be a JSON object, got " + std::string(j.type_name()));
  // The --json report of a run, given where its repro file belongs.
  if (const auto tool = j.find("tool"); tool != j.end() && *tool == "ckverify")
    fail("this is a ckverify report (--json), not a Case file: replay the file a failing run wrote with --repro-file");
  Case c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const Field* f = find_field(it.key());
    if (!f) fail("unknown field \"" + sanitize(it.key()) + "\" (allowed: " + all_keys() + ")");
    f->set(c, it.value());
  }
  validate(c);
  return c;
}

}  // namespace

std::string effects_to_string(unsigned effects) {
  std::string out;
  for (const auto& [bit, name] : kEffects)
    if (effects & bit) out += (out.empty() ? "" : ",") + std::string(name);
  return out.empty() ? "none" : out;
}

bool effects_from_string(const std::string& s, unsigned& out, std::string& error) {
  unsigned effects = 0;
  if (s != "none") {
    // Every comma-separated part must name an effect once: no empty parts ("", "counter,"), no repeats.
    size_t start = 0;
    while (true) {
      const size_t end = std::min(s.find(',', start), s.size());
      const std::string part = s.substr(start, end - start);
      unsigned bit = 0;
      for (const auto& [b, name] : kEffects)
        if (part == name) bit = b;
      if (bit == 0 || (effects & bit) != 0) {
        error = bit == 0 ? "is not none or a comma list of counter|log|bn|noise|cache|external"
                         : "names " + part + " twice";
        return false;
      }
      effects |= bit;
      if (end == s.size()) break;
      start = end + 1;
    }
  }
  out = effects;
  return true;
}

std::string sanitize(const std::string& s, size_t max) {
  std::string out;
  for (unsigned char ch : s) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    out += (ch >= 0x20 && ch < 0x7f) ? static_cast<char>(ch) : '?';
  }
  return out;
}

std::string_view to_string(DropoutImpl v) {
  return name_of(kDropImpl, v);
}
std::string_view to_string(Precision v) {
  return name_of(kPrec, v);
}
std::string_view to_string(Freeze v) {
  return name_of(kFreeze, v);
}
std::string_view to_string(Hook v) {
  return name_of(kHook, v);
}
std::string_view to_string(Schedule v) {
  return name_of(kSched, v);
}
std::string_view to_string(Optimizer v) {
  return name_of(kOpt, v);
}
std::string_view to_string(SegIO v) {
  return name_of(kSegIO, v);
}
std::string_view to_string(InplaceOn v) {
  return name_of(kInplaceOn, v);
}
std::string_view to_string(SegIn v) {
  return name_of(kSegIn, v);
}
std::string_view to_string(TpKeep v) {
  return name_of(kTpKeep, v);
}

std::vector<CaseFieldInfo> case_field_infos() {
  std::vector<CaseFieldInfo> out;
  for (const auto& f : fields()) out.push_back({f.key, f.values, f.help, f.always});
  return out;
}

bool Case::operator==(const Case& o) const {
  return to_json(*this) == to_json(o);
}

double estimated_parameters(const Case& c) {
  const auto& m = c.model;
  const double D = m.d_model, F = m.d_ff(), L = m.layers, V = m.vocab;
  return L * (4 * D * D + (m.activation == Activation::swiglu ? 3 : 2) * D * F) + D * V;
}

double estimated_bytes(const Case& c) {
  const auto& m = c.model;
  const double B = c.batch, T = c.seq, D = m.d_model, F = m.d_ff(), H = m.heads, L = m.layers, V = m.vocab;
  const double N = B * T;
  const double per_layer = N * (10 * D + 4 * F) + (m.attention ? 2 * B * H * T * T : 0);
  const double activations = L * per_layer + N * (3 * D + 3 * V);
  const double params = estimated_parameters(c);
  // The fp64 and fp32 reference keep every activation; LibTorch keeps about as many again per run with
  // autograd's bookkeeping; parameters exist as values, gradients and copies per run.
  return activations * (8 + 4 + 3 * 4) + params * 8 * 8;
}

std::string tp_error(const ModelConfig& m, int tp) {
  const std::string t = "tp=" + std::to_string(tp);
  if (tp < 1) return t + " is not a positive degree";
  if (m.attention && m.heads % tp != 0)
    return t + " needs heads divisible by it (heads=" + std::to_string(m.heads) + ": each rank holds heads/tp)";
  if (m.d_ff() % tp != 0)
    return t + " needs the FFN width divisible by it (d x ffn=" + std::to_string(m.d_ff()) +
           ": each rank holds d_ff/tp hidden units)";
  return "";
}

void validate(const Case& c) {
  for (const auto& f : fields()) {
    Case copy;
    f.set(copy, f.get(c));  // every field within its own limits
  }
  const auto& m = c.model;
  if (m.d_model % m.heads != 0)
    fail("heads=" + std::to_string(m.heads) + " must divide d=" + std::to_string(m.d_model));
  if (const std::string e = c.plan.invalid_for(m.layers); !e.empty()) fail(e);
  if (c.gp > 0.0 && c.input_frozen)
    fail("gp=" + shortest(c.gp) + " needs input=trainable (the penalty is on dloss/dx)");
  if (m.segout != SegOut::plain && m.tie == Tie::head)
    fail("segout=" + std::string(name_of(kSegOut, m.segout)) +
         " needs tie=none or tie=blocks (under tie=head the stack input is (B,T,vocab), no hidden state to carry)");
  if (m.key_padding != (m.aux_weight > 0.0)) fail("segio: key padding and the aux loss come together (segio=multi)");
  if (c.resume > 0 && c.resume >= c.steps * c.micro)
    fail("resume=" + std::to_string(c.resume) + " must be below steps x micro=" + std::to_string(c.steps * c.micro) +
         " (the position of the save, counted in micro-batches)");
  if (c.resume > 0 && c.resume % c.micro != 0 && c.sched != Schedule::fb)
    fail("resume=" + std::to_string(c.resume) +
         " falls inside a step: that needs sched=fb (with sched=ffbb the "
         "forwards of the step are still alive)");
  if (!c.inplace && (c.inplace_on != InplaceOn::input || c.inplace_micro != 0))
    fail("inplace_on and inplace_micro describe the in-place experiment: they need inplace=true");
  if (c.inplace_micro >= c.micro)
    fail("inplace_micro=" + std::to_string(c.inplace_micro) + " must be below micro=" + std::to_string(c.micro));
  if (c.seqvar > 0 && c.micro < 2)
    fail("seqvar=" + std::to_string(c.seqvar) + " needs micro >= 2 (it shortens every micro-batch after the first)");
  if (c.seqvar > 0 && min_seq(c) < 1)
    fail("seqvar=" + std::to_string(c.seqvar) + " leaves micro-batch " + std::to_string(c.micro - 1) + " with " +
         std::to_string(min_seq(c)) + " tokens: seq - seqvar x (micro - 1) must be at least 1");
  if (c.inplace_on == InplaceOn::mask && (!m.key_padding || seq_of(c, c.inplace_micro) < 2))
    fail(
        "inplace_on=mask needs segio=multi (the key mask is a segment input) and seq >= 2 (the edit flips every key "
        "but the first) in the micro-batch it edits");
  if (c.inplace_on == InplaceOn::param && c.inplace_micro < 1)
    fail(
        "inplace_on=param needs micro >= 2 and inplace_micro >= 1 (the parameters change before that micro-batch's "
        "forward, after every earlier one's backward)");
  if (m.has(kBatchNorm) && c.batch * min_seq(c) < 4)
    fail(
        "fx=bn needs batch x seq >= 4 in every micro-batch: over fewer values per channel BatchNorm's output hardly "
        "depends on its input "
        "(one value: undefined; two: always +-1), so every gradient before it is rounding noise");
  if (c.tp != 1 && c.tp != 2 && c.tp != 4) fail("tp=" + std::to_string(c.tp) + " is not one of 1|2|4");
  if (c.tp > 1) {
    if (const std::string e = tp_error(m, c.tp); !e.empty()) fail(e);
    auto needs = [&](bool ok, const std::string& what) {
      if (!ok) fail("tp=" + std::to_string(c.tp) + " " + what);
    };
    needs(c.device == "cpu", "runs its ranks' collectives over Gloo on the CPU: it needs device=cpu");
    needs(c.gp == 0.0, "needs gp=0 (the collectives' backward is not differentiable a second time)");
    needs(!c.inplace, "needs inplace=false (the in-place experiments are not built for ranks yet)");
  }
  if (c.dp > 1) {
    auto needs = [&](bool ok, const std::string& what) {
      if (!ok) fail("dp=" + std::to_string(c.dp) + " " + what);
    };
    needs(!m.has(kBatchNorm) && !m.has(kCache),
          "needs neither fx=bn nor fx=cache (state kept across the micro-batches of a step: each replica's would "
          "see only its own)");
    needs(c.device == "cpu", "runs its replicas' collectives over Gloo on the CPU: it needs device=cpu");
    needs(c.gp == 0.0, "needs gp=0 (the reducer's average is not differentiated a second time)");
    needs(!c.inplace, "needs inplace=false (the in-place experiments are not built for ranks yet)");
    needs(c.micro % c.dp == 0,
          "splits the step's micro-batches between the replicas: it needs micro divisible by "
          "it (micro=" +
              std::to_string(c.micro) + ")");
    needs(c.resume % c.micro == 0,
          "needs resume at a step boundary, a multiple of micro (inside a step the replicas are at other "
          "micro-batches of it)");
  }
  if (c.tpkeep != TpKeep::none && c.tp < 2)
    fail("tpkeep=" + std::string(to_string(c.tpkeep)) +
         " needs tp > 1 (it keeps the tensor-parallel all-reduces' outputs)");
  constexpr double kMaxBytes = 32.0 * (1ull << 30);
  if (const double b = estimated_bytes(c); b > kMaxBytes)
    fail("the case needs about " + shortest(std::round(b / (1 << 30))) +
         " GiB, over the 32 GiB limit (reduce layers, d, batch or seq)");
}

std::string to_line(const Case& c) {
  std::string out;
  const Case defaults;
  for (const auto& f : fields()) {
    const json v = f.get(c);
    if (!f.always && v == f.get(defaults)) continue;
    out += (out.empty() ? "" : " ") + f.key + "=" + f.print_text(v);
  }
  return out;
}

Case case_from_line(const std::string& line) {
  json j = json::object();
  std::istringstream is(line);
  std::string tok;
  while (is >> tok) {
    const auto eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) fail("\"" + sanitize(tok) + "\" is not key=value");
    const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
    const Field* f = find_field(k);
    if (!f) fail("unknown key \"" + sanitize(k) + "\" (allowed: " + all_keys() + ")");
    j[k] = f->parse_text(v);  // a later key overrides an earlier one (a base line plus overrides)
  }
  return from_object(j);
}

void check_field_text(const std::string& key_value) {
  const auto eq = key_value.find('=');
  if (eq == std::string::npos || eq == 0) fail("\"" + sanitize(key_value) + "\" is not key=value");
  const std::string k = key_value.substr(0, eq);
  const Field* f = find_field(k);
  if (!f) fail("unknown key \"" + sanitize(k) + "\" (allowed: " + all_keys() + ")");
  Case c;
  f->set(c, f->parse_text(key_value.substr(eq + 1)));
}

std::string to_json(const Case& c) {
  // nlohmann's object is ordered by key; write the table's order by hand so files read like the line.
  std::string out = "{\n";
  bool first = true;
  for (const auto& f : fields()) {
    out += (first ? "" : ",\n") + std::string("  \"") + f.key + "\": " + f.get(c).dump();
    first = false;
  }
  return out + "\n}\n";
}

Case case_from_json(const std::string& text) {
  // The JSON parser ends its input at a NUL byte: what follows one would be ignored unread.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    fail("a NUL byte at offset " + std::to_string(nul) + ": a Case file is JSON text");
  // Bound the nesting before parsing: no Case is nested deeper than an array in an object.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    if (ch == '{' || ch == '[') ++depth;
    if (ch == '}' || ch == ']') --depth;
    if (depth > 8) fail("JSON nested deeper than 8 levels is not a case");
  }
  json j;
  std::string field;  // the last top-level key read and whether its value was read whole: errors name it
  bool field_done = false;
  std::set<std::string> seen;  // the parser keeps the last of two equal keys: a file that says two things
  std::string twice;
  try {
    j = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 1 && event == json::parse_event_t::key) {
        field = parsed.get<std::string>(), field_done = false;
        if (!seen.insert(field).second && twice.empty()) twice = field;
      } else if (depth == 1 && event != json::parse_event_t::object_start && event != json::parse_event_t::array_start)
        field_done = true;
      return true;
    });
  } catch (const json::exception& e) {
    const std::string where =
        field.empty() ? "" : (field_done ? " after" : " in") + (" field \"" + sanitize(field) + "\"");
    fail("malformed JSON" + where + ": " + sanitize(e.what(), 160));
  }
  if (!twice.empty()) fail("field \"" + sanitize(twice, 60) + "\" is given twice");
  return from_object(j);
}

Case load_case_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("cannot read case file " + sanitize(path, 200) + ": no such file");
  if (!S_ISREG(st.st_mode)) fail("case file " + sanitize(path, 200) + " is not a regular file");
  constexpr off_t kMaxCaseFile = 1 << 20;
  if (st.st_size > kMaxCaseFile) fail("case file " + sanitize(path, 200) + " is larger than 1 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read case file " + sanitize(path, 200));
  std::string text(static_cast<size_t>(kMaxCaseFile) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > static_cast<size_t>(kMaxCaseFile))
    fail("case file " + sanitize(path, 200) + " is larger than 1 MiB");
  return case_from_json(text);
}

}  // namespace ckv
