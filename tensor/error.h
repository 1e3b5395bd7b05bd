#pragma once
// One error type for the whole library. Library code throws; only main() decides exit codes.
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace cast {

// A message's control bytes, byte-order marks and bytes that are not UTF-8 shown, not obeyed: a
// NUL byte from a file would end the line printed, a carriage return overwrite it, a BOM hide in
// it, a stray byte of a binary file garble the terminal.
inline std::string visible(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  // the length of the UTF-8 sequence of more than one byte that starts at i, or 0
  const auto sequence = [&](size_t i) -> size_t {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t n = (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return 0;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
    return n;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0xEF && text.compare(i, 3, "\xEF\xBB\xBF") == 0) {
      out += "\\uFEFF";
      i += 2;
    } else if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      out += fmt::format("\\x{:02X}", c);
    } else if (c >= 0x80) {
      const size_t n = sequence(i);
      if (n == 0) {
        out += fmt::format("\\x{:02X}", c);
      } else if (n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) <= 0x9F) {  // a C1 control
        out += fmt::format("\\u{:04X}", static_cast<unsigned char>(text[i + 1]));
        ++i;
      } else {
        out.append(text, i, n);
        i += n - 1;
      }
    } else {
      out += text[i];
    }
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(visible(what)) {}
  explicit Error(const char* what) : Error(std::string(what)) {}
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
