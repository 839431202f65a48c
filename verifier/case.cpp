// verifier/case.cpp: Case validation, line form and JSON (see case.hpp). Both the line form and the
// JSON form go through one reader (from_object) so that there is one validation path.
#include "verifier/case.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ckv {
using nlohmann::json;

namespace {
constexpr std::array<std::pair<DropoutImpl, std::string_view>, 2> kDropImpl{
    {{DropoutImpl::explicit_mask, "explicit"}, {DropoutImpl::native, "native"}}};
constexpr std::array<std::pair<Precision, std::string_view>, 3> kPrec{
    {{Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"}}};

// Shortest decimal that reads back as the same double, so lines stay readable and still round-trip.
std::string shortest(double v) {
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

[[noreturn]] void fail(const std::string& msg) {
  throw CaseError("case: " + msg);
}

template <class E, size_t N>
E parse_table(const std::array<std::pair<E, std::string_view>, N>& t, const std::string& field, const std::string& s) {
  std::string allowed;
  for (const auto& [v, name] : t) {
    if (name == s) return v;
    allowed += (allowed.empty() ? "" : "|") + std::string(name);
  }
  fail(field + "=\"" + s + "\" is not one of " + allowed);
}

template <class E>
E parse_model_enum(const std::string& field, const std::string& s) {
  E out{};
  if (!parse_enum(s, out)) fail(field + "=\"" + s + "\" is not one of " + allowed_names<E>());
  return out;
}

// Typed readers that name the field on a type error.
int get_int(const json& j, const std::string& field, int lo, int hi) {
  if (!j.is_number_integer())
    fail(field + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + j.dump());
  const auto v = j.get<int64_t>();
  if (v < lo || v > hi)
    fail(field + "=" + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(v);
}
std::string get_string(const json& j, const std::string& field) {
  if (!j.is_string()) fail(field + " must be a string, got " + j.dump());
  return j.get<std::string>();
}
double get_rate(const json& j, const std::string& field) {
  if (!j.is_number()) fail(field + " must be a number in [0, 1), got " + j.dump());
  const double v = j.get<double>();
  if (!(v >= 0.0 && v < 1.0)) fail(field + "=" + j.dump() + " is outside [0, 1)");
  return v;
}
bool get_bool(const json& j, const std::string& field) {
  if (!j.is_boolean()) fail(field + " must be true or false, got " + j.dump());
  return j.get<bool>();
}
void reject_unknown(const json& obj, const std::string& where, std::initializer_list<const char*> known) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    std::string allowed;
    for (const char* k : known) {
      ok |= it.key() == k;
      allowed += (allowed.empty() ? "" : "|") + std::string(k);
    }
    if (!ok) fail("unknown field " + where + it.key() + " (allowed: " + allowed + ")");
  }
}

json to_object(const Case& c) {
  json dropout = json::object();
  for (DropoutSite s : kAllDropoutSites) dropout[std::string(to_string(s))] = c.p(s);
  return json{{"model",
               {{"layers", c.model.layers},
                {"d_model", c.model.d_model},
                {"heads", c.model.heads},
                {"ffn_mult", c.model.ffn_mult},
                {"vocab", c.model.vocab},
                {"norm", to_string(c.model.norm)},
                {"placement", to_string(c.model.placement)},
                {"attention", c.model.attention},
                {"causal", c.model.causal},
                {"activation", to_string(c.model.activation)},
                {"loss", to_string(c.model.loss)}}},
              {"dropout", dropout},
              {"dropout_impl", to_string(c.dropout_impl)},
              {"seed", c.seed},
              {"batch", c.batch},
              {"seq", c.seq},
              {"steps", c.steps},
              {"lr", c.lr},
              {"precision", to_string(c.precision)},
              {"device", c.device},
              {"plan", c.plan.to_string()},
              {"impl", c.impl}};
}

Case from_object(const json& j) {
  if (!j.is_object()) fail("a case must be a JSON object, got " + std::string(j.type_name()));
  reject_unknown(j, "",
                 {"model", "dropout", "dropout_impl", "seed", "batch", "seq", "steps", "lr", "precision", "device",
                  "plan", "impl"});
  Case c;
  if (j.contains("model")) {
    const json& m = j.at("model");
    if (!m.is_object()) fail("model must be an object");
    reject_unknown(m, "model.",
                   {"layers", "d_model", "heads", "ffn_mult", "vocab", "norm", "placement", "attention", "causal",
                    "activation", "loss"});
    if (m.contains("layers")) c.model.layers = get_int(m["layers"], "model.layers", 1, 64);
    if (m.contains("d_model")) c.model.d_model = get_int(m["d_model"], "model.d_model", 1, 8192);
    if (m.contains("heads")) c.model.heads = get_int(m["heads"], "model.heads", 1, 256);
    if (m.contains("ffn_mult")) c.model.ffn_mult = get_int(m["ffn_mult"], "model.ffn_mult", 1, 16);
    if (m.contains("vocab")) c.model.vocab = get_int(m["vocab"], "model.vocab", 1, 1 << 20);
    if (m.contains("norm"))
      c.model.norm = parse_model_enum<NormKind>("model.norm", get_string(m["norm"], "model.norm"));
    if (m.contains("placement"))
      c.model.placement =
          parse_model_enum<NormPlacement>("model.placement", get_string(m["placement"], "model.placement"));
    if (m.contains("attention")) c.model.attention = get_bool(m["attention"], "model.attention");
    if (m.contains("causal")) c.model.causal = get_bool(m["causal"], "model.causal");
    if (m.contains("activation"))
      c.model.activation =
          parse_model_enum<Activation>("model.activation", get_string(m["activation"], "model.activation"));
    if (m.contains("loss"))
      c.model.loss = parse_model_enum<LossKind>("model.loss", get_string(m["loss"], "model.loss"));
  }
  if (j.contains("dropout")) {
    const json& d = j.at("dropout");
    if (!d.is_object()) fail("dropout must be an object with keys " + allowed_names<DropoutSite>());
    reject_unknown(d, "dropout.", {"attn_probs", "attn_out", "ffn_hidden", "ffn_out"});
    for (DropoutSite s : kAllDropoutSites) {
      const std::string key(to_string(s));
      if (d.contains(key)) c.dropout[static_cast<size_t>(s)] = get_rate(d[key], "dropout." + key);
    }
  }
  if (j.contains("dropout_impl"))
    c.dropout_impl = parse_table(kDropImpl, "dropout_impl", get_string(j["dropout_impl"], "dropout_impl"));
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned() && !(j["seed"].is_number_integer() && j["seed"].get<int64_t>() >= 0))
      fail("seed must be a non-negative integer, got " + j["seed"].dump());
    c.seed = j["seed"].get<uint64_t>();
  }
  if (j.contains("batch")) c.batch = get_int(j["batch"], "batch", 1, 4096);
  if (j.contains("seq")) c.seq = get_int(j["seq"], "seq", 1, 1 << 16);
  if (j.contains("steps")) c.steps = get_int(j["steps"], "steps", 1, 10000);
  if (j.contains("lr")) {
    if (!j["lr"].is_number() || !(j["lr"].get<double>() > 0.0) || !std::isfinite(j["lr"].get<double>()))
      fail("lr must be a positive finite number, got " + j["lr"].dump());
    c.lr = j["lr"].get<double>();
  }
  if (j.contains("precision")) c.precision = parse_table(kPrec, "precision", get_string(j["precision"], "precision"));
  if (j.contains("device")) c.device = get_string(j["device"], "device");
  if (j.contains("plan")) {
    std::string err;
    if (!Plan::parse(get_string(j["plan"], "plan"), c.plan, err)) fail(err);
  }
  if (j.contains("impl")) c.impl = get_string(j["impl"], "impl");
  validate(c);
  return c;
}
}  // namespace

std::string_view to_string(DropoutImpl v) {
  for (const auto& [e, n] : kDropImpl)
    if (e == v) return n;
  return "?";
}
std::string_view to_string(Precision v) {
  for (const auto& [e, n] : kPrec)
    if (e == v) return n;
  return "?";
}

bool Case::operator==(const Case& o) const {
  return model == o.model && dropout == o.dropout && dropout_impl == o.dropout_impl && seed == o.seed &&
         batch == o.batch && seq == o.seq && steps == o.steps && lr == o.lr && precision == o.precision &&
         device == o.device && plan == o.plan && impl == o.impl;
}

void validate(const Case& c) {
  const auto& m = c.model;
  if (m.layers < 1) fail("model.layers=" + std::to_string(m.layers) + " must be >= 1");
  if (m.d_model < 1) fail("model.d_model=" + std::to_string(m.d_model) + " must be >= 1");
  if (m.heads < 1) fail("model.heads=" + std::to_string(m.heads) + " must be >= 1");
  if (m.d_model % m.heads != 0)
    fail("model.heads=" + std::to_string(m.heads) + " must divide model.d_model=" + std::to_string(m.d_model));
  if (m.ffn_mult < 1) fail("model.ffn_mult=" + std::to_string(m.ffn_mult) + " must be >= 1");
  if (m.vocab < 1) fail("model.vocab=" + std::to_string(m.vocab) + " must be >= 1");
  if (c.batch < 1) fail("batch=" + std::to_string(c.batch) + " must be >= 1");
  if (c.seq < 1) fail("seq=" + std::to_string(c.seq) + " must be >= 1");
  if (c.steps < 1) fail("steps=" + std::to_string(c.steps) + " must be >= 1");
  for (DropoutSite s : kAllDropoutSites)
    if (!(c.p(s) >= 0.0 && c.p(s) < 1.0))
      fail("dropout." + std::string(to_string(s)) + "=" + std::to_string(c.p(s)) + " is outside [0, 1)");
  const bool cuda_index = c.device.rfind("cuda:", 0) == 0 && c.device.size() > 5 &&
                          c.device.find_first_not_of("0123456789", 5) == std::string::npos && c.device.size() <= 8;
  if (c.device != "cpu" && c.device != "cuda" && !cuda_index)
    fail("device=\"" + c.device + "\" is not one of cpu|cuda|cuda:N");
  if (const std::string e = c.plan.invalid_for(m.layers); !e.empty()) fail(e);
  if (c.impl.empty()) fail("impl must not be empty (builtin, a fault name, or a plugin path)");
}

std::string to_line(const Case& c) {
  std::ostringstream os;
  const auto& m = c.model;
  os << "layers=" << m.layers << " d=" << m.d_model << " heads=" << m.heads << " ffn=" << m.ffn_mult
     << " vocab=" << m.vocab << " norm=" << to_string(m.norm) << " pos=" << to_string(m.placement) << " attn="
     << (!m.attention ? "off"
         : m.causal   ? "causal"
                      : "bidir")
     << " act=" << to_string(m.activation) << " loss=" << to_string(m.loss) << " drop=";
  for (size_t i = 0; i < c.dropout.size(); ++i) os << (i ? "," : "") << shortest(c.dropout[i]);
  os << " dropimpl=" << to_string(c.dropout_impl) << " batch=" << c.batch << " seq=" << c.seq << " steps=" << c.steps
     << " lr=" << shortest(c.lr) << " prec=" << to_string(c.precision) << " device=" << c.device
     << " plan=" << c.plan.to_string() << " impl=" << c.impl << " seed=" << c.seed;
  return os.str();
}

Case case_from_line(const std::string& line) {
  json j = json::object();
  json model = json::object();
  std::istringstream is(line);
  std::string tok;
  auto number = [](const std::string& key, const std::string& v) -> json {
    json n = json::parse(v, nullptr, false);
    if (n.is_discarded() || !n.is_number()) fail(key + "=\"" + v + "\" is not a number");
    return n;
  };
  while (is >> tok) {
    const auto eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) fail("\"" + tok + "\" is not key=value");
    const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
    if (k == "layers")
      model["layers"] = number(k, v);
    else if (k == "d")
      model["d_model"] = number(k, v);
    else if (k == "heads")
      model["heads"] = number(k, v);
    else if (k == "ffn")
      model["ffn_mult"] = number(k, v);
    else if (k == "vocab")
      model["vocab"] = number(k, v);
    else if (k == "norm")
      model["norm"] = v;
    else if (k == "pos")
      model["placement"] = v;
    else if (k == "act")
      model["activation"] = v;
    else if (k == "loss")
      model["loss"] = v;
    else if (k == "attn") {
      if (v == "off")
        model["attention"] = false;
      else if (v == "causal" || v == "bidir") {
        model["attention"] = true;
        model["causal"] = v == "causal";
      } else
        fail("attn=\"" + v + "\" is not one of causal|bidir|off");
    } else if (k == "drop") {
      json rates = json::object();
      std::vector<std::string> parts;
      std::stringstream ps(v);
      for (std::string p; std::getline(ps, p, ',');) parts.push_back(p);
      if (parts.size() != 1 && parts.size() != kNumDropoutSites)
        fail("drop=\"" + v + "\" must be one rate or 4 comma-separated rates (" + allowed_names<DropoutSite>() + ")");
      for (DropoutSite s : kAllDropoutSites)
        rates[std::string(to_string(s))] = number(k, parts[parts.size() == 1 ? 0 : static_cast<size_t>(s)]);
      j["dropout"] = rates;
    } else if (k == "dropimpl")
      j["dropout_impl"] = v;
    else if (k == "batch" || k == "seq" || k == "steps" || k == "lr" || k == "seed")
      j[k] = number(k, v);
    else if (k == "prec")
      j["precision"] = v;
    else if (k == "device" || k == "plan" || k == "impl")
      j[k] = v;
    else
      fail("unknown key \"" + k +
           "\" (allowed: "
           "layers|d|heads|ffn|vocab|norm|pos|attn|act|loss|drop|dropimpl|batch|seq|steps|lr|prec|device|plan|impl|"
           "seed)");
  }
  if (!model.empty()) j["model"] = model;
  return from_object(j);
}

std::string to_json(const Case& c) {
  return to_object(c).dump(2) + "\n";
}

Case case_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    for (auto& ch : what)
      if (ch == '\n') ch = ' ';
    fail("malformed JSON: " + what);
  }
  return from_object(j);
}

Case load_case_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read case file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return case_from_json(ss.str());
}

}  // namespace ckv
