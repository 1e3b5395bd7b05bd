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

// Always-on check (not removed by NDEBUG). The message should name the op or file.
#define CAST_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::cast::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

}  // namespace cast
