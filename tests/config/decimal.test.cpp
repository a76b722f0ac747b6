// read_decimal (decimal.hpp): numbers as a person reads them. Each check names the reading a
// broken parser would give (octal, hex, clamping, inf) so that it fails when that returns.
#include "gradflow/decimal.hpp"

#include <doctest/doctest.h>

using namespace gradflow;

namespace {
std::string canonical(const char* text, NumberKind kind) {
  const DecimalReading reading = read_decimal(text, kind);
  return reading.problem.empty() ? reading.canonical : "refused: " + reading.problem;
}
}  // namespace

TEST_CASE("whole numbers: leading zeros are decimal, other bases and notations are refused") {
  CHECK(canonical("010", NumberKind::whole) == "10");  // strtoll base 0 reads 8
  CHECK(canonical("08", NumberKind::whole) == "8");    // base 0 refuses it
  CHECK(canonical("000", NumberKind::whole) == "0");
  CHECK(canonical("-007", NumberKind::whole) == "-7");
  CHECK(canonical("+5", NumberKind::whole) == "5");
  CHECK(canonical("0x10", NumberKind::whole) ==
        "refused: must be written in decimal digits (no 0x, 0o or 0b prefix)");
  CHECK(canonical("1e3", NumberKind::whole) == "refused: must be written in digits");
  CHECK(canonical("64.0", NumberKind::whole) == "refused: must be written in digits");
  CHECK(canonical("2.5", NumberKind::whole) == "refused: must be a whole number");
  CHECK(canonical(" 8", NumberKind::whole) == "refused: must be a whole number");
  CHECK(canonical("", NumberKind::whole) == "refused: is empty");
}

TEST_CASE("whole numbers: the type's range, never clamped") {
  CHECK(canonical("2147483647", NumberKind::whole) == "2147483647");
  CHECK(canonical("2147483648", NumberKind::whole) ==
        "refused: is larger than 2147483647, the most it takes");
  CHECK(canonical("-2147483648", NumberKind::whole) == "-2147483648");
  CHECK(canonical("-2147483649", NumberKind::whole) ==
        "refused: is smaller than -2147483648, the least it takes");
  CHECK(canonical("00000000000000000000000000012", NumberKind::whole) == "12");
  CHECK(canonical("18446744073709551615", NumberKind::unsigned_whole) == "18446744073709551615");
  CHECK(canonical("18446744073709551616", NumberKind::unsigned_whole) ==
        "refused: is larger than 18446744073709551615, the most it takes");
  CHECK(canonical("-1", NumberKind::unsigned_whole) == "refused: must be >= 0");
  CHECK(canonical("-0", NumberKind::unsigned_whole) == "0");
}

TEST_CASE("real numbers: decimal notation only, finite") {
  CHECK(canonical("0.5", NumberKind::real) == "0.5");
  CHECK(canonical(".25", NumberKind::real) == ".25");
  CHECK(canonical("1e-3", NumberKind::real) == "1e-3");
  CHECK(canonical("-2.", NumberKind::real) == "-2.");
  CHECK(canonical("1e-400", NumberKind::real) == "1e-400");  // underflow: nearly zero, as meant
  CHECK(canonical("0x1p-2", NumberKind::real) == "refused: must be a number");
  CHECK(canonical("1e", NumberKind::real) == "refused: must be a number");
  CHECK(canonical(".", NumberKind::real) == "refused: must be a number");
  CHECK(canonical("1.5.2", NumberKind::real) == "refused: must be a number");
  CHECK(canonical("inf", NumberKind::real) == "refused: must be a number, not inf or nan");
  CHECK(canonical("-Infinity", NumberKind::real) == "refused: must be a number, not inf or nan");
  CHECK(canonical("NaN", NumberKind::real) == "refused: must be a number, not inf or nan");
  CHECK(canonical("1e400", NumberKind::real) == "refused: is too large: it would be read as inf");
}
