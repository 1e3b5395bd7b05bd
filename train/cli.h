#pragma once
// A small command-line parser: `--name value` options and `--flag` switches, each declared
// with a help line, so every command gets `--help` and a clear error for an unknown option.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cast::cli {

class Args {
 public:
  Args(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  Args& option(const std::string& name, const std::string& default_value, const std::string& help);
  Args& flag(const std::string& name, const std::string& help);
  // `--name` alone or `--name VALUE` (`--name=VALUE` for a value that starts with --): is_set
  // tells whether it was given, str its value ("" when alone).
  Args& optional_value(const std::string& name, const std::string& value_name, const std::string& help);
  // The usage line after "usage: " (default: "cast <command> [options]") and example commands,
  // both shown by --help.
  Args& usage(const std::string& line);
  Args& example(const std::string& command_line);

  // Parses argv (after the command word). Returns false when --help was asked (help printed).
  bool parse(const std::vector<std::string>& argv);

  std::string str(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  // An integer in [lo, hi], else a usage error naming the option (no value is cut to fit).
  int64_t integer(const std::string& name, int64_t lo, int64_t hi) const;
  double number(const std::string& name) const;
  bool is_set(const std::string& name) const;  // flags, and options given on the command line
  // One of `allowed`, or a clear error naming the option.
  std::string choice(const std::string& name, const std::vector<std::string>& allowed) const;

  std::string help() const;

 private:
  enum class Kind { option, flag, optional_value };
  struct Spec {
    std::string default_value, help;
    Kind kind = Kind::option;
  };
  std::string command_, summary_, usage_;
  std::vector<std::string> examples_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::string> values_;
};

// A comma-separated option value: its items, none empty and none twice, else a usage error
// naming the option.
std::vector<std::string> comma_list(const std::string& option, const std::string& text);
// The same, each a whole number in [lo, hi].
std::vector<int64_t> comma_integers(const std::string& option, const std::string& text, int64_t lo, int64_t hi);

}  // namespace cast::cli
