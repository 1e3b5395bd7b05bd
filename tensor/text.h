#pragma once
// Text as the engine reads it from users and writes it into files: the option parser, the
// settings reader and the SVG writer share these checks.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace cast::text {

// A number written in decimal as a user would: an optional sign, digits, and for a real number a
// point and an exponent; no space around it, no hexadecimal ("0x10", "0x1p-3"), no "inf" or "nan"
// (which the C library's readers all take).
inline bool plain_decimal(const std::string& s, bool integer) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool digit = c >= '0' && c <= '9';
    const bool sign = (c == '+' || c == '-') && (i == 0 || (!integer && (s[i - 1] == 'e' || s[i - 1] == 'E')));
    const bool real = !integer && (c == '.' || c == 'e' || c == 'E');
    if (!digit && !sign && !real) return false;
  }
  return true;
}

// Reads all of s as a plain decimal (above) into value: an int64_t or a double.
enum class Decimal { ok, not_a_number, out_of_range };
template <class T>
Decimal read_decimal(const std::string& s, T& value) {
  constexpr bool integer = std::is_integral_v<T>;
  if (!plain_decimal(s, integer)) return Decimal::not_a_number;
  try {
    size_t used = 0;
    if constexpr (integer) value = std::stoll(s, &used);
    else value = std::stod(s, &used);
    return used == s.size() ? Decimal::ok : Decimal::not_a_number;
  } catch (const std::out_of_range&) {
    return Decimal::out_of_range;
  } catch (const std::invalid_argument&) {
    return Decimal::not_a_number;
  }
}

// The length of the UTF-8 sequence that starts at s[i], or 0 where the bytes there are not one.
inline size_t utf8_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// A control character (a newline, an escape, DEL): it would break a one-line message that
// repeats the value, or a file that records it.
inline bool is_control(unsigned char c) { return c < 0x20 || c == 0x7F; }

// A run id as a run draws it (train/checkpoint.h): 16 lowercase hexadecimal digits.
inline bool is_run_id(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}
// A C1 control character (U+0080 to U+009F, the UTF-8 bytes C2 80 to C2 9F) at s[i]: U+009B starts
// a terminal's escape sequence as ESC [ does.
inline bool is_c1_control(const std::string& s, size_t i) {
  return i + 1 < s.size() && static_cast<unsigned char>(s[i]) == 0xC2 && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
         static_cast<unsigned char>(s[i + 1]) <= 0x9F;
}

// A word as a shell reads it back: as it is when it holds only characters no shell treats
// specially, else in single quotes (a quote inside as '\''). Advice a user pastes names paths so.
inline std::string shell_word(const std::string& word) {
  const bool safe = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789-_./=,:+@%") == std::string::npos;
  if (safe) return word;
  std::string quoted = "'";
  for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

}  // namespace cast::text
