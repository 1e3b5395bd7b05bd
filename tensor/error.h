#pragma once
// One error type for the whole library. Library code throws; only main() decides exit codes.
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace cast {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A command used wrongly (unknown option, a value out of its range, a word not among the
// choices): main exits with 2 for it, 1 for every other Error.
class UsageError : public Error {
 public:
  using Error::Error;
};

// Always-on check (not removed by NDEBUG). The message should name the op or file.
#define CAST_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::cast::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

// The same for a command's arguments: a UsageError (exit code 2).
#define CAST_CHECK_USAGE(cond, ...)                                  \
  do {                                                               \
    if (!(cond)) throw ::cast::UsageError(fmt::format(__VA_ARGS__)); \
  } while (0)

}  // namespace cast
