#include "train/cli.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "tensor/error.h"
#include "tensor/text.h"

// A wrong command line is a usage error (exit code 2).
#define CAST_USAGE_CHECK(cond, ...)                                  \
  do {                                                               \
    if (!(cond)) throw ::cast::UsageError(fmt::format(__VA_ARGS__)); \
  } while (0)

namespace cast::cli {

Args& Args::option(const std::string& name, const std::string& default_value, const std::string& help) {
  specs_[name] = Spec{default_value, help, Kind::option};
  order_.push_back(name);
  return *this;
}

Args& Args::flag(const std::string& name, const std::string& help) {
  specs_[name] = Spec{"", help, Kind::flag};
  order_.push_back(name);
  return *this;
}

Args& Args::optional_value(const std::string& name, const std::string& value_name, const std::string& help) {
  specs_[name] = Spec{value_name, help, Kind::optional_value};
  order_.push_back(name);
  return *this;
}

// A value is text a message or a file can repeat on one line: no control character (a newline,
// an escape sequence), and UTF-8 (the JSON files that record it hold nothing else).
static void check_value(const std::string& name, const std::string& value) {
  for (size_t i = 0; i < value.size();) {
    const auto c = static_cast<unsigned char>(value[i]);
    CAST_USAGE_CHECK(!text::is_control(c), "--{}: its value holds the control character \\x{:02X}", name, c);
    CAST_USAGE_CHECK(!text::is_c1_control(value, i), "--{}: its value holds the control character \\u{:04X}", name,
                     static_cast<unsigned char>(value[i + 1]));
    const size_t n = text::utf8_length(value, i);
    CAST_USAGE_CHECK(n > 0, "--{}: its value is not UTF-8 text (byte \\x{:02X} at {})", name, c, i);
    i += n;
  }
}

bool Args::parse(const std::vector<std::string>& argv) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    CAST_USAGE_CHECK(a.rfind("--help=", 0) != 0, "--help takes no value (cast {} --help)", command_);
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    CAST_USAGE_CHECK(a.rfind("--", 0) == 0, "unexpected argument '{}' (see cast {} --help)", a, command_);
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = specs_.find(name);
    CAST_USAGE_CHECK(it != specs_.end(), "unknown option --{} (see cast {} --help)", name, command_);
    // a second value would silently replace the first
    CAST_USAGE_CHECK(!values_.count(name), "--{} is given twice: give it once", name);
    if (it->second.kind == Kind::flag) {
      CAST_USAGE_CHECK(eq == std::string::npos, "--{} takes no value", name);
      values_[name] = "1";
      continue;
    }
    if (it->second.kind == Kind::optional_value) {
      const bool given = eq != std::string::npos || (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0);
      if (eq == std::string::npos && given) value = argv[++i];
      // `--trace ''` (an unset shell variable) would mean the console: leave the value out for that
      CAST_USAGE_CHECK(!given || !value.empty(), "--{} is given an empty value (without a value it has its default)",
                       name);
      check_value(name, value);
      values_[name] = value;
      continue;
    }
    if (eq == std::string::npos) {
      CAST_USAGE_CHECK(i + 1 < argv.size(), "--{} needs a value", name);
      value = argv[++i];
      // `--out --seed 3`: the value was forgotten, not a folder named --seed
      // (and `--run --`: "--" alone, which no command takes, is no value either)
      CAST_USAGE_CHECK(!(value.rfind("--", 0) == 0 && (value == "--" || specs_.count(value.substr(2, value.find('=') - 2)))),
                       "--{} needs a value, and {} is an option (for a value that starts with --, write --{}={})", name,
                       value, name, value);
    }
    // `--run ""` (an unset shell variable) would mean the default folder
    CAST_USAGE_CHECK(!value.empty(), "--{} is given an empty value", name);
    check_value(name, value);
    values_[name] = value;
  }
  return true;
}

std::string Args::str(const std::string& name) const {
  auto v = values_.find(name);
  if (v != values_.end()) return v->second;
  auto s = specs_.find(name);
  CAST_USAGE_CHECK(s != specs_.end(), "internal: undeclared option --{}", name);
  return s->second.kind == Kind::optional_value ? "" : s->second.default_value;
}

int64_t Args::integer(const std::string& name) const {
  const std::string v = str(name);
  int64_t r = 0;
  const text::Decimal read = text::read_decimal(v, r);
  if (read == text::Decimal::ok) return r;
  if (read == text::Decimal::out_of_range)  // a whole number a 64-bit integer does not hold
    throw UsageError(fmt::format("--{} is {}: out of range (a 64-bit integer, {} to {})", name, v, INT64_MIN, INT64_MAX));
  throw UsageError(fmt::format("--{} expects an integer, got '{}'", name, v));
}

int64_t Args::integer(const std::string& name, int64_t lo, int64_t hi) const {
  const int64_t v = integer(name);
  CAST_USAGE_CHECK(v >= lo && v <= hi, "--{} is {}: it must be in [{}, {}]", name, v, lo, hi);
  return v;
}

double Args::number(const std::string& name) const {
  const std::string v = str(name);
  double r = 0;
  const text::Decimal read = text::read_decimal(v, r);
  if (read == text::Decimal::ok) return r;
  CAST_USAGE_CHECK(read != text::Decimal::out_of_range,
                   "--{} is {}: beyond the range of a double (too large, or too close to 0)", name, v);
  throw UsageError(fmt::format("--{} expects a number, got '{}'", name, v));
}

bool Args::is_set(const std::string& name) const { return values_.count(name) > 0; }

std::string Args::choice(const std::string& name, const std::vector<std::string>& allowed) const {
  const std::string v = str(name);
  for (const auto& a : allowed)
    if (a == v) return v;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : "|") + a;
  throw UsageError(fmt::format("--{} must be one of {}, got '{}'", name, list, v));
}

Args& Args::usage(const std::string& line) {
  usage_ = line;
  return *this;
}

Args& Args::example(const std::string& command_line) {
  examples_.push_back(command_line);
  return *this;
}

std::string Args::help() const {
  std::string out = fmt::format("usage: {}\n{}\n\noptions:\n",
                                usage_.empty() ? fmt::format("cast {} [options]", command_) : usage_, summary_);
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    std::string left = "--" + name;
    if (s.kind == Kind::option) left += " <" + (s.default_value.empty() ? "value" : s.default_value) + ">";
    if (s.kind == Kind::optional_value) left += " [" + s.default_value + "]";
    out += fmt::format("  {:<30} {}\n", left, s.help);
  }
  if (!examples_.empty()) out += "\nexamples:\n";
  for (const auto& e : examples_) out += "  " + e + "\n";
  return out;
}

std::vector<std::string> comma_list(const std::string& option, const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    CAST_USAGE_CHECK(!items.back().empty(), "--{}: '{}' has an empty item", option, text);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (size_t i = 0; i < items.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      CAST_USAGE_CHECK(items[i] != items[j], "--{}: '{}' is listed twice", option, items[i]);
  return items;
}

std::vector<int64_t> comma_integers(const std::string& option, const std::string& text, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (const std::string& item : comma_list(option, text)) {
    int64_t v = 0;
    CAST_USAGE_CHECK(text::read_decimal(item, v) == text::Decimal::ok, "--{}: '{}' is not a whole number", option,
                     item);
    CAST_USAGE_CHECK(v >= lo && v <= hi, "--{}: {} is outside [{}, {}]", option, v, lo, hi);
    // the same number under two spellings ('4' and '04') is listed twice as well
    CAST_USAGE_CHECK(std::find(out.begin(), out.end(), v) == out.end(), "--{}: {} is listed twice ('{}')", option, v,
                     text);
    out.push_back(v);
  }
  return out;
}

}  // namespace cast::cli
