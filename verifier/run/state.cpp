// verifier/run/state.cpp: see state.hpp.
#include "verifier/run/state.hpp"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ckv {
namespace {
using json = nlohmann::json;
constexpr const char* kMagic = "ckverify-state\n";

[[noreturn]] void fail(const std::string& m) {
  throw StateError("state file: " + m);
}

}  // namespace

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

namespace {
// One payload array: float64 (with a shape), int64 or bytes.
struct Entry {
  std::string name, type;
  std::vector<int64_t> shape;
  size_t count = 0;
};

class Writer {
 public:
  void f64(const std::string& name, const std::vector<int64_t>& shape, const std::vector<double>& v) {
    entries.push_back({name, "f64", shape, v.size()});
    append(v.data(), v.size() * sizeof(double));
  }
  void i64(const std::string& name, const std::vector<int64_t>& v) {
    entries.push_back({name, "i64", {}, v.size()});
    append(v.data(), v.size() * sizeof(int64_t));
  }
  void bytes(const std::string& name, const void* p, size_t n) {
    entries.push_back({name, "u8", {}, n});
    append(p, n);
  }
  void params(const std::string& prefix, const ParamSet& s) {
    for (const auto& a : s.items) f64(prefix + a.name, a.shape, a.data);
  }
  std::vector<Entry> entries;
  std::string payload;

 private:
  void append(const void* p, size_t n) { payload.append(static_cast<const char*>(p), n); }
};

size_t entry_bytes(const Entry& e) {
  return e.count * (e.type == "u8" ? 1 : 8);
}

}  // namespace

std::string state_key(const Case& c) {
  Case k = c;
  k.steps = 1, k.resume = 0, k.plan = Plan{}, k.impl = "builtin", k.device = "cpu";
  return to_line(k);
}

std::string encode_state(const TrainingState& s) {
  static_assert(sizeof(double) == 8 && sizeof(int64_t) == 8);
  Writer w;
  w.i64("position", {s.position});
  w.params("param.", s.params);
  w.params("grad.", s.grads);
  w.i64("grad_defined", s.grad_defined);
  w.i64("hook_calls", s.hook_calls);
  w.params("adam_m.", s.adam_m);
  w.params("adam_v.", s.adam_v);
  w.i64("adam_steps", s.adam_steps);
  w.params("bn.", s.batchnorm);
  w.i64("counter", s.counter);
  w.i64("external", s.external);
  w.i64("cache_calls", s.cache_calls);
  w.bytes("log", s.log.data(), s.log.size());
  for (size_t i = 0; i < s.rng.size(); ++i) w.bytes("rng." + std::to_string(i), s.rng[i].data(), s.rng[i].size());
  for (const auto& [name, state] : s.streams) w.bytes("stream." + name, state.data(), state.size());
  json entries = json::array();
  for (const auto& e : w.entries) {
    json j = {{"name", e.name}, {"type", e.type}, {"count", e.count}};
    if (e.type == "f64") j["shape"] = e.shape;
    entries.push_back(j);
  }
  const json header = {{"format", "ckverify-state"}, {"version", kStateFormatVersion},
                       {"case", s.case_key},         {"position", s.position},
                       {"entries", entries},         {"payload_bytes", w.payload.size()}};
  std::string out = kMagic + header.dump() + "\n" + w.payload;
  const uint64_t h = fnv1a(out.data(), out.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((h >> (8 * i)) & 0xff));
  return out;
}

TrainingState decode_state(const std::string& bytes, const Case& c) {
  const size_t magic = std::strlen(kMagic);
  if (bytes.size() < magic || bytes.compare(0, magic, kMagic) != 0) fail("not a ckverify state file (no header)");
  const size_t eol = bytes.find('\n', magic);
  if (eol == std::string::npos) fail("truncated (the header is incomplete)");
  json header;
  try {
    header = json::parse(bytes.begin() + static_cast<std::ptrdiff_t>(magic),
                         bytes.begin() + static_cast<std::ptrdiff_t>(eol));
  } catch (const std::exception&) {
    fail("corrupted (the header is not valid JSON)");
  }
  if (!header.is_object() || !header.contains("version") || !header["version"].is_number_integer())
    fail("corrupted (the header has no format version)");
  if (header["version"].get<int64_t>() != kStateFormatVersion)
    fail("format version " + sanitize(header["version"].dump()) + ", this ckverify reads version " +
         std::to_string(kStateFormatVersion));
  size_t payload_bytes = 0;
  std::vector<Entry> entries;
  try {
    payload_bytes = header.at("payload_bytes").get<size_t>();
    for (const auto& j : header.at("entries")) {
      Entry e{j.at("name").get<std::string>(), j.at("type").get<std::string>(), {}, j.at("count").get<size_t>()};
      if (e.type != "f64" && e.type != "i64" && e.type != "u8") fail("corrupted (an entry has type " + e.type + ")");
      if (e.type == "f64") e.shape = j.at("shape").get<std::vector<int64_t>>();
      if (e.count > bytes.size()) fail("corrupted (an entry claims " + std::to_string(e.count) + " values)");
      entries.push_back(std::move(e));
    }
  } catch (const StateError&) {
    throw;
  } catch (const std::exception&) {
    fail("corrupted (the header's entries are malformed)");
  }
  const size_t body = eol + 1;
  if (bytes.size() != body + payload_bytes + 8)
    fail(bytes.size() < body + payload_bytes + 8 ? "truncated (" + std::to_string(bytes.size()) + " bytes, expected " +
                                                       std::to_string(body + payload_bytes + 8) + ")"
                                                 : "corrupted (trailing bytes after the checksum)");
  uint64_t stored = 0;
  for (int i = 0; i < 8; ++i)
    stored |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[body + payload_bytes + static_cast<size_t>(i)]))
              << (8 * i);
  if (stored != fnv1a(bytes.data(), body + payload_bytes)) fail("corrupted (checksum mismatch)");
  const std::string key = header.value("case", std::string());
  if (const std::string here = state_key(c); key != here) {
    // Name the fields that differ, not two long lines.
    auto fields = [](const std::string& line) {
      std::map<std::string, std::string> m;
      std::istringstream is(line);
      for (std::string tok; is >> tok;) m[tok.substr(0, tok.find('='))] = tok;
      return m;
    };
    const auto a = fields(key), b = fields(here);
    std::string diff;
    for (const auto& [k, v] : b) {
      const auto it = a.find(k);
      // A field at its default is left out of a Case line.
      const std::string was = it == a.end() ? k + " at its default" : it->second;
      if (was != v) diff += (diff.empty() ? "" : ", ") + was + " in the state, " + v + " here";
    }
    for (const auto& [k, v] : a)
      if (!b.count(k)) diff += (diff.empty() ? "" : ", ") + v + " in the state, " + k + " at its default here";
    fail("saved from another model or data: " + sanitize(diff.empty() ? key : diff, 300));
  }

  TrainingState s;
  s.case_key = key;
  size_t off = body, sum = 0;
  for (const auto& e : entries) sum += entry_bytes(e);
  if (sum != payload_bytes) fail("corrupted (the entries do not add up to the payload)");
  for (const Entry& e : entries) {
    const char* p = bytes.data() + off;
    off += entry_bytes(e);
    auto i64s = [&] {
      std::vector<int64_t> v(e.count);
      std::memcpy(v.data(), p, e.count * 8);
      return v;
    };
    auto into = [&](ParamSet& set, size_t prefix) {
      NamedArray a{e.name.substr(prefix), e.shape, std::vector<double>(e.count)};
      std::memcpy(a.data.data(), p, e.count * 8);
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      if (n != static_cast<int64_t>(e.count)) fail("corrupted (" + sanitize(e.name) + ": shape and length disagree)");
      set.items.push_back(std::move(a));
    };
    const std::string& n = e.name;
    if (n == "position" && e.count == 1)
      s.position = static_cast<int>(i64s()[0]);
    else if (n.rfind("param.", 0) == 0 && e.type == "f64")
      into(s.params, 6);
    else if (n.rfind("grad.", 0) == 0 && e.type == "f64")
      into(s.grads, 5);
    else if (n.rfind("adam_m.", 0) == 0 && e.type == "f64")
      into(s.adam_m, 7);
    else if (n.rfind("adam_v.", 0) == 0 && e.type == "f64")
      into(s.adam_v, 7);
    else if (n.rfind("bn.", 0) == 0 && e.type == "f64")
      into(s.batchnorm, 3);
    else if (n == "grad_defined" && e.type == "i64")
      s.grad_defined = i64s();
    else if (n == "hook_calls" && e.type == "i64")
      s.hook_calls = i64s();
    else if (n == "adam_steps" && e.type == "i64")
      s.adam_steps = i64s();
    else if (n == "counter" && e.type == "i64")
      s.counter = i64s();
    else if (n == "external" && e.type == "i64")
      s.external = i64s();
    else if (n == "cache_calls" && e.type == "i64")
      s.cache_calls = i64s();
    else if (n == "log" && e.type == "u8")
      s.log.assign(p, e.count);
    else if (n.rfind("rng.", 0) == 0 && e.type == "u8")
      s.rng.emplace_back(reinterpret_cast<const uint8_t*>(p), reinterpret_cast<const uint8_t*>(p) + e.count);
    else if (n.rfind("stream.", 0) == 0 && n.size() > 7 && e.type == "u8")
      s.streams.emplace_back(n.substr(7), std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(p),
                                                               reinterpret_cast<const uint8_t*>(p) + e.count));
    else
      fail("corrupted (unknown entry \"" + sanitize(n) + "\" of type " + e.type + ")");
  }
  if (header.value("position", -1) != s.position)
    fail("corrupted (the header and the payload disagree on the position)");
  return s;
}

size_t state_bytes_bound(const Case& c) {
  const double values = estimated_parameters(c) + 2.0 * c.model.layers * c.model.d_model;
  return static_cast<size_t>(8.0 * 8.0 * 4.0 * values) + (size_t{64} << 20);
}

TrainingState load_state_file(const std::string& path, const Case& c) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) fail(sanitize(path) + " does not exist");
  if (!std::filesystem::is_regular_file(st)) fail(sanitize(path) + " is not a regular file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read " + sanitize(path));
  if (const size_t bound = state_bytes_bound(c); size > bound)
    fail(
        fmt::format("{} is {} bytes, more than a state of this Case can take ({} at most): it was not saved from "
                    "this Case, or it is corrupted",
                    sanitize(path), size, bound));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + sanitize(path));
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<size_t>(in.gcount()) != size) fail("cannot read " + sanitize(path) + " whole");
  return decode_state(bytes, c);
}

}  // namespace ckv
