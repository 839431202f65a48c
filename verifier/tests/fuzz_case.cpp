// verifier/tests/fuzz_case.cpp: RapidCheck-driven fuzzing of the Case parsers (case_from_json,
// case_from_line) with random bytes, mutations of valid Case files and random line-form strings.
// Whatever the input, a parser either returns a Case that passes validate() and round-trips through
// both forms (JSON and line), or throws a CaseError whose message is one printable line of at most 400
// characters; never another exception, never a crash (the sanitizer leg runs this under ASan + UBSan).
// Deterministic: a fixed seed and a fixed number of inputs per property, a few seconds in all.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "verifier/case/case.hpp"

namespace ckv {
namespace {

constexpr uint64_t kSeed = 0x636b7666757a7aULL;  // fixed: the same inputs on every run

// Runs `prop` on `tests` generated inputs from the fixed seed; a failure (shrunk) fails the gtest.
template <class Prop>
void fuzz(const std::string& name, int tests, Prop prop) {
  rc::detail::TestParams params;
  params.seed = kSeed;
  params.maxSuccess = tests;
  params.maxSize = 100;
  rc::detail::TestMetadata meta;
  meta.id = meta.description = "case_fuzz/" + name;
  const auto result = rc::detail::checkProperty(rc::detail::toProperty(prop), meta, params);
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  if (!result.template is<rc::detail::SuccessResult>()) FAIL() << os.str();
  // The log shows how many inputs each property's parser accepted and how many it rejected.
  std::cout << meta.id << " (seed " << kSeed << "): " << os.str() << "\n";
}

// What a parser did with one input: a Case, a CaseError's message, or something else (a bug).
struct Outcome {
  bool accepted = false;
  Case c;
  std::string error;  // CaseError::what()
  std::string other;  // any other exception
};

template <class Parse>
Outcome outcome(Parse parse) {
  Outcome o;
  try {
    o.c = parse();
    o.accepted = true;
  } catch (const CaseError& e) {
    o.error = e.what();
  } catch (const std::exception& e) {
    o.other = std::string(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    o.other = "an exception not derived from std::exception";
  }
  return o;
}

// Empty when `msg` is one printable line of at most 400 characters starting "case: ".
std::string message_problem(const std::string& msg) {
  if (msg.rfind("case: ", 0) != 0) return "does not start with \"case: \"";
  if (msg.size() > 400) return "is " + std::to_string(msg.size()) + " characters long";
  for (unsigned char ch : msg)
    if (ch < 0x20 || ch >= 0x7f) return "has the non-printable byte " + std::to_string(ch);
  return "";
}

// The properties every parse must have (see the file comment).
void check(const Outcome& o, bool tag = true) {
  if (!o.other.empty()) RC_FAIL("threw something other than a CaseError: " + o.other);
  if (tag) RC_TAG(o.accepted ? "accepted" : "rejected");
  if (!o.accepted) {
    if (const std::string p = message_problem(o.error); !p.empty()) RC_FAIL("CaseError message " + p + ": " + o.error);
    return;
  }
  const std::string line = to_line(o.c);
  const Outcome valid = outcome([&] {
    validate(o.c);
    return o.c;
  });
  if (!valid.accepted) RC_FAIL("accepted a case validate() rejects: " + line + " / " + valid.error + valid.other);
  const Outcome json = outcome([&] { return case_from_json(to_json(o.c)); });
  if (!json.accepted) RC_FAIL("its JSON does not parse: " + line + " / " + json.error + json.other);
  RC_ASSERT(to_line(json.c) == line);
  RC_ASSERT(json.c == o.c);
  const Outcome back = outcome([&] { return case_from_line(line); });
  if (!back.accepted) RC_FAIL("its line does not parse: " + line + " / " + back.error + back.other);
  if (back.c != o.c) RC_FAIL("its line replays as a different case: " + to_json(o.c) + " / " + to_json(back.c));
}

// ---- generators --------------------------------------------------------------------------------------

template <class T>
const T& pick(const std::vector<T>& v) {
  return v.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(v.size()))));
}

int below(int n) {
  return *rc::gen::inRange(0, n);
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

// Number spellings that parsers get wrong: overflow, underflow, signs, fractions, non-finite and
// non-JSON spellings.
const std::vector<std::string> kNastyNumbers = words(
    "0 -0 -0.0 0.0 1 -1 2.5 1.0 0.5 1e30 -1e30 1e400 -1e400 1e-400 4e-320 2.2250738585072014e-308 "
    "1.7976931348623157e308 99999999999999999999 -99999999999999999999 9999999999999999999 "
    "-9999999999999999999 9223372036854775807 9223372036854775808 -9223372036854775808 "
    "-9223372036854775809 18446744073709551615 18446744073709551616 2147483647 2147483648 "
    "-2147483649 4294967296 4294967297 65536 65537 4096 4097 1e6 1000001 NaN nan -nan Infinity "
    "-Infinity inf 0x10 0x1p-3 01 +1 .5 1. 1e - --1 1e+ 00 1_000 \xef\xbc\x91");

// String payloads: control characters, invalid UTF-8, escapes, very long strings.
std::string nasty_string() {
  switch (below(9)) {
    case 0:
      return std::string(static_cast<size_t>(*rc::gen::inRange(1000, 200000)), 'x');
    case 1:
      return "a\x01\x02\x1b[31mred\x7f";
    case 2:
      return "\xff\xfe\xc0\x80\xed\xa0\x80";
    case 3:
      return "\\u0000\\u001b\\n\\r\\t";
    case 4:
      return "\\ud800";
    case 5:
      return "caf\xc3\xa9 \xe2\x80\xae";
    case 6:
      return std::string(static_cast<size_t>(*rc::gen::inRange(1, 3000)), '\n');
    case 7:
      return "cuda:" + std::string(static_cast<size_t>(*rc::gen::inRange(1, 40)), '9');
    default:
      return *rc::gen::string<std::string>();
  }
}

// A JSON value of a wrong or odd type (raw JSON text; may itself be malformed on purpose).
std::string odd_json_value() {
  const std::vector<std::string> fixed = {
      "null",        "true",          "false",         "[]",         "{}",        "[1]",       "[0.1,0.1]",
      "[0,0,0,0,0]", "[0,0,0,\"0\"]", "{\"a\":1}",     "\"\"",       "\"none\"",  "[[[[1]]]]", "[null,null,null,null]",
      "\"1\"",       "\"true\"",      "\"seg999999\"", "\"every0\"", "\"from-1\""};
  switch (below(5)) {
    case 0:
      return pick(fixed);
    case 1:
      return pick(kNastyNumbers);
    case 2:
      return "\"" + nasty_string() + "\"";
    case 3: {  // deep nesting of arrays or objects
      const int n = *rc::gen::inRange(1, 5000);
      if (*rc::gen::arbitrary<bool>())
        return std::string(static_cast<size_t>(n), '[') + "1" + std::string(static_cast<size_t>(n), ']');
      std::string out;
      for (int i = 0; i < n; ++i) out += "{\"a\":";
      return out + "1" + std::string(static_cast<size_t>(n), '}');
    }
    default:
      return "[" + pick(kNastyNumbers) + "," + pick(kNastyNumbers) + "," + pick(kNastyNumbers) + "," +
             pick(kNastyNumbers) + "]";
  }
}

// Candidate values for one field, from the spelling of its allowed values in the field table
// ("1..64", "none|alt|blocks", "[0, 1e+06]", ...) plus values just outside.
std::vector<std::string> values_for(const CaseFieldInfo& f) {
  std::vector<std::string> out;
  const std::string& v = f.values;
  if (const auto dots = v.find(".."); dots != std::string::npos && v[0] != '[' && v[0] != '(') {
    const std::string lo = v.substr(0, dots), hi = v.substr(dots + 2);
    out = {lo, hi, "1", "2", "3"};
    if (f.key == "seed") return {"0", "1", "42", "18446744073709551615", "18446744073709551557"};
    const long long l = std::stoll(lo), h = std::stoll(hi);
    out.push_back(std::to_string(l - 1));
    out.push_back(std::to_string(h + 1));
    out.push_back(std::to_string((l + h) / 2));
    return out;
  }
  if (v[0] == '[' || v[0] == '(') return {"0", "0.05", "0.5", "1", "1e-3", "1e6", "1e+06", "1000000.5", "-0"};
  if (f.key == "drop") return {"0", "0.1", "0.5", "0.999", "0,0.1,0.2,0.3", "0.1,0.2", "1", "-0", "0,0,0,0,0"};
  if (f.key == "impl") return {"builtin", "no-preserve-rng", "x", "a=b", "\"quoted\"", std::string(513, 'i')};
  if (f.key == "fx") return {"none", "counter", "counter,bn", "bn,counter", "counter,log,bn,noise,cache,external", ""};
  std::stringstream ss(v);
  for (std::string part; std::getline(ss, part, '|');) {
    for (char& ch : part)
      if (ch == 'N' || ch == 'K' || ch == 'I') ch = '1';  // cuda:N, everyN, segK, fromI
    out.push_back(part);
  }
  return out;
}

// One key=value word of the line form, mostly with a real key.
std::string line_word(const std::vector<CaseFieldInfo>& infos, bool valid_only) {
  const CaseFieldInfo& f = pick(infos);
  if (valid_only) return f.key + "=" + pick(values_for(f));
  switch (below(10)) {
    case 0:
      return f.key + "=" + pick(kNastyNumbers);
    case 1:
      return f.key + "=" + nasty_string();
    case 2:
      return f.key;  // no '='
    case 3:
      return "=" + pick(values_for(f));
    case 4:
      return *rc::gen::string<std::string>();
    case 5:
      return f.key + "==" + pick(values_for(f));
    default:
      return f.key + "=" + pick(values_for(f));
  }
}

std::string random_line(bool valid_only) {
  static const std::vector<CaseFieldInfo> infos = case_field_infos();
  const std::vector<std::string> seps = {" ", " ", " ", "  ", "\t", "\n", "\v", "\r\n"};
  std::string line;
  const int words = *rc::gen::inRange(0, 14);
  for (int i = 0; i < words; ++i)
    line += (i ? (valid_only ? std::string(" ") : pick(seps)) : "") + line_word(infos, valid_only);
  return line;
}

// A valid Case with random fields: random valid-looking words, each kept only if the line still parses.
Case random_valid_case() {
  std::string line;
  const int words = *rc::gen::inRange(0, 20);
  for (int i = 0; i < words; ++i) {
    const std::string candidate = line + " " + random_line(true);
    try {
      case_from_line(candidate);
      line = candidate;
    } catch (const CaseError&) {
    }
  }
  return case_from_line(line);
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// One mutation of a (usually valid) Case file.
std::string mutate(const std::string& text) {
  std::string s = text;
  const auto pos = [&](size_t extra) { return static_cast<size_t>(*rc::gen::inRange<size_t>(0, s.size() + extra)); };
  std::vector<std::string> lines = split_lines(s);
  // The field lines ("  \"key\": value,") and where their value starts.
  std::vector<size_t> fields;
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].find("\": ") != std::string::npos) fields.push_back(i);
  const auto value_start = [&](size_t i) { return lines[i].find("\": ") + 3; };
  const auto has_comma = [&](size_t i) { return !lines[i].empty() && lines[i].back() == ','; };
  switch (below(fields.empty() ? 5 : 12)) {
    case 0:  // flip a bit
      if (!s.empty()) s[pos(0) % s.size()] ^= static_cast<char>(1 << below(8));
      return s;
    case 1: {  // insert a byte, mostly JSON syntax
      static const char kSyntax[] = "{}[]\",:\\-+.eE0123456789 \n\t\x00\x01\x7f\x80\xc0\xff";
      const std::string syntax(kSyntax, sizeof kSyntax - 1);
      const char ch = *rc::gen::arbitrary<bool>() ? syntax[static_cast<size_t>(below(static_cast<int>(syntax.size())))]
                                                  : *rc::gen::arbitrary<char>();
      s.insert(pos(1), 1, ch);
      return s;
    }
    case 2: {  // delete a range
      if (s.empty()) return s;
      const size_t at = pos(0) % s.size();
      s.erase(at, static_cast<size_t>(*rc::gen::inRange(1, 40)));
      return s;
    }
    case 3:  // truncate
      s.resize(pos(0));
      return s;
    case 4: {  // wrap the whole document in deep nesting
      const size_t n = static_cast<size_t>(*rc::gen::inRange(1, 100000));
      return std::string(n, '[') + s + std::string(n, ']');
    }
    default:
      break;
  }
  // Number mutations go to a field holding a number half of the time.
  std::vector<size_t> numeric;
  for (size_t f : fields)
    if (std::string("-0123456789[").find(lines[f][value_start(f)]) != std::string::npos) numeric.push_back(f);
  const size_t i = pick(numeric.empty() || *rc::gen::arbitrary<bool>() ? fields : numeric);
  const std::string key = lines[i].substr(0, value_start(i));  // "  \"key\": "
  const std::string comma = has_comma(i) ? "," : "";
  switch (below(7)) {
    case 0:  // a nasty number
      lines[i] = key + pick(kNastyNumbers) + comma;
      break;
    case 1:  // a value of another type, a strange string or deep nesting
      lines[i] = key + odd_json_value() + comma;
      break;
    case 2:  // a duplicate key, with an odd value or its own
      lines.insert(lines.begin() + static_cast<long>(i),
                   key + (*rc::gen::arbitrary<bool>() ? odd_json_value() : pick(kNastyNumbers)) + ",");
      break;
    case 3:  // the field removed (a trailing comma may remain: malformed)
      lines.erase(lines.begin() + static_cast<long>(i));
      break;
    case 4: {  // the key misspelt
      const std::vector<std::string> keys = {"\"\": ",
                                             "\"LAYERS\": ",
                                             "\"layers \": ",
                                             "\"d_model\": ",
                                             "\"\xff\": ",
                                             "\"\\u0000\": ",
                                             "\"" + std::string(100000, 'k') + "\": "};
      lines[i] = "  " + pick(keys) + lines[i].substr(value_start(i));
      break;
    }
    case 5:  // the value's digits replaced by a long run
      lines[i] = key + std::string(static_cast<size_t>(*rc::gen::inRange(20, 5000)), '9') + comma;
      break;
    default:  // a number spliced into the existing value
      lines[i].insert(std::min(lines[i].size(), value_start(i) + static_cast<size_t>(below(4))), pick(kNastyNumbers));
      break;
  }
  return join_lines(lines);
}

TEST(CaseFuzz, RandomBytes) {
  fuzz("random-bytes", 1500, [] {
    const std::string s = *rc::gen::oneOf(
        rc::gen::string<std::string>(), rc::gen::container<std::string>(rc::gen::arbitrary<char>()),
        rc::gen::container<std::string>(rc::gen::elementOf(std::string("{}[]\":,0123456789.-+eE \\utrfalsn"))));
    check(outcome([&] { return case_from_json(s); }));
    check(outcome([&] { return case_from_line(s); }));
  });
}

TEST(CaseFuzz, MutatedCaseFiles) {
  fuzz("mutated-case-files", 1500, [] {
    const Case base = random_valid_case();
    std::string text = to_json(base);
    const int mutations = *rc::gen::inRange(1, 5);
    for (int m = 0; m < mutations; ++m) text = mutate(text);
    check(outcome([&] { return case_from_json(text); }));
  });
}

TEST(CaseFuzz, RandomLines) {
  fuzz("random-lines", 2000, [] {
    const std::string line = random_line(false);
    check(outcome([&] { return case_from_line(line); }));
  });
}

// A rejection of a bad value in field `key` must say which field (or that the case is too large).
void check_names_field(const Outcome& o, const std::string& key) {
  check(o, false);
  if (o.accepted) return;
  const std::string& m = o.error;
  const bool named = m.find(key + "=") != std::string::npos || m.find(key + " ") != std::string::npos ||
                     m.find("\"" + key + "\"") != std::string::npos || m.find(key + ".") != std::string::npos ||
                     m.find("GiB") != std::string::npos;
  if (!named) RC_FAIL("rejecting a bad " + key + " does not name the field: " + m);
}

// Exhaustive: every nasty number as every field's value (and as a 4-array of it), in both forms, on the
// default case and on a random one.
TEST(CaseFuzz, EveryNastyNumberInEveryField) {
  fuzz("every-number-every-field", 2, [] {
    const Case base = *rc::gen::arbitrary<bool>() ? Case{} : random_valid_case();
    const std::string text = to_json(base);
    for (const CaseFieldInfo& f : case_field_infos()) {
      const std::string key = "  \"" + f.key + "\": ";
      const size_t at = text.find(key) + key.size(), eol = text.find('\n', at);
      const size_t end = text[eol - 1] == ',' ? eol - 1 : eol;  // the value without its comma
      const auto with = [&](const std::string& v) { return text.substr(0, at) + v + text.substr(end); };
      for (const std::string& n : kNastyNumbers) {
        check_names_field(outcome([&] { return case_from_json(with(n)); }), f.key);
        check_names_field(outcome([&] { return case_from_json(with("[" + n + "," + n + "," + n + "," + n + "]")); }),
                          f.key);
        check_names_field(outcome([&] { return case_from_line(to_line(base) + " " + f.key + "=" + n); }), f.key);
      }
    }
  });
}

TEST(CaseFuzz, ValidCasesRoundTrip) {
  fuzz("valid-cases", 300, [] {
    const Case c = random_valid_case();
    check(outcome([&] { return c; }));
    check(outcome([&] { return case_from_line(to_line(c)); }));
  });
}

}  // namespace
}  // namespace ckv
