// One reading of numbers for every numeric option: decimal digits only, as a person reads them.
// "010" is ten (not octal eight), "0x10" and "1e3" are not whole numbers, "inf", "nan" and hex
// floats are not numbers, and a value outside the type's range is refused, never clamped.
// (CLI11 alone reads integers with strtoll base 0, so --depth 010 ran 8 blocks.)
#pragma once

#include <string>
#include <string_view>

namespace gradflow {

enum class NumberKind {
  whole,           // int: -2147483648 .. 2147483647
  unsigned_whole,  // std::uint64_t: 0 .. 18446744073709551615
  real,            // a finite double in decimal notation: 1, -0.5, 1e-3, .25
};

struct DecimalReading {
  std::string canonical;  // the value rewritten without leading zeros ("010" -> "10"); "" on a problem
  std::string problem;    // "" when the text is a number of `kind`; else why not, e.g. "is empty"
};

// Reads `text` as a number of `kind`. The problem completes a sentence that starts with the value:
// "must be a whole number in decimal digits", "is larger than 2147483647", ...
DecimalReading read_decimal(std::string_view text, NumberKind kind);

}  // namespace gradflow
