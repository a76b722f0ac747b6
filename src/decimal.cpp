// Decimal-only number reading (decimal.hpp).
#include "gradflow/decimal.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

namespace gradflow {

namespace {
bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (const char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Digits without their leading zeros ("007" -> "7", "000" -> "0").
std::string_view strip_zeros(std::string_view digits) {
  const auto first = digits.find_first_not_of('0');
  return first == std::string_view::npos ? digits.substr(digits.size() - 1) : digits.substr(first);
}

// True when the digits (no sign, no leading zeros) do not exceed `limit` (also digits).
bool at_most(std::string_view digits, std::string_view limit) {
  return digits.size() < limit.size() || (digits.size() == limit.size() && digits <= limit);
}

bool decimal_notation(std::string_view text);

// Why `text`, not a whole number in digits, is refused: a whole number written another way (1e3,
// 64.0), a prefix of another base (0x10), or no whole number at all.
std::string not_whole(std::string_view text, bool is_unsigned) {
  if (decimal_notation(text)) {
    const double number = std::strtod(std::string(text).c_str(), nullptr);
    if (number == std::floor(number) && std::isfinite(number)) return "must be written in digits";
  }
  const std::string_view digits = !text.empty() && (text[0] == '-' || text[0] == '+') ? text.substr(1) : text;
  if (digits.size() > 1 && digits[0] == '0' && std::isalpha(static_cast<unsigned char>(digits[1])))
    return "must be written in decimal digits (no 0x, 0o or 0b prefix)";
  return is_unsigned ? "must be a whole number >= 0" : "must be a whole number";
}

DecimalReading whole(std::string_view text, bool is_unsigned) {
  const bool negative = !text.empty() && text.front() == '-';
  const bool signed_text = !text.empty() && (text.front() == '-' || text.front() == '+');
  const std::string_view digits = signed_text ? text.substr(1) : text;
  if (!all_digits(digits)) return {"", not_whole(text, is_unsigned)};
  const std::string_view value = strip_zeros(digits);
  const bool zero = value == "0";
  if (is_unsigned) {
    if (negative && !zero) return {"", "must be >= 0"};
    if (!at_most(value, "18446744073709551615"))
      return {"", "is larger than 18446744073709551615, the most it takes"};
    return {std::string(value), ""};
  }
  if (negative && !zero) {
    if (!at_most(value, "2147483648")) return {"", "is smaller than -2147483648, the least it takes"};
    std::string canonical = "-";
    canonical.append(value.data(), value.size());
    return {canonical, ""};
  }
  if (!at_most(value, "2147483647")) return {"", "is larger than 2147483647, the most it takes"};
  return {std::string(value), ""};
}

// [+-] digits [. digits] [e [+-] digits], or [+-] . digits [...]: no hex, inf, nan or spaces.
bool decimal_notation(std::string_view text) {
  std::size_t at = 0;
  if (at < text.size() && (text[at] == '+' || text[at] == '-')) ++at;
  std::size_t mantissa_digits = 0;
  while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at, ++mantissa_digits;
  if (at < text.size() && text[at] == '.') {
    ++at;
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return false;
  if (at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
    ++at;
    if (at < text.size() && (text[at] == '+' || text[at] == '-')) ++at;
    std::size_t exponent_digits = 0;
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at, ++exponent_digits;
    if (exponent_digits == 0) return false;
  }
  return at == text.size();
}

bool names_non_finite(std::string_view text) {
  std::string word;
  for (const char c : text) word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!word.empty() && (word[0] == '+' || word[0] == '-')) word.erase(0, 1);
  return word == "inf" || word == "infinity" || word == "nan";
}

DecimalReading real(std::string_view text) {
  if (names_non_finite(text)) return {"", "must be a number, not inf or nan"};
  if (!decimal_notation(text)) return {"", "must be a number"};
  const std::string copy(text);
  errno = 0;
  const double value = std::strtod(copy.c_str(), nullptr);
  if (!std::isfinite(value) || (errno == ERANGE && std::abs(value) > 1.0))
    return {"", "is too large: it would be read as inf"};
  // Underflow to zero or a subnormal is kept: 1e-400 is read as the person meant, nearly zero.
  return {copy, ""};
}
}  // namespace

DecimalReading read_decimal(std::string_view text, NumberKind kind) {
  if (text.empty()) return {"", "is empty"};
  switch (kind) {
    case NumberKind::whole:
      return whole(text, false);
    case NumberKind::unsigned_whole:
      return whole(text, true);
    case NumberKind::real:
      return real(text);
  }
  return {"", "has an unknown kind"};
}

}  // namespace gradflow
