// The counter-based generator (rng.hpp): its draws are pinned, so that a faster implementation
// cannot silently change every figure gradflow reports; and, independently of its own code, the
// radius and the angle are checked against long double references, and the draws against the
// normal distribution (moments, quantiles, Kolmogorov-Smirnov), so that a wrong implementation fails
// even where the pinned comparisons would only compare it with itself.
#include "gradflow/rng.hpp"

#include <doctest/doctest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <vector>

#include "gradflow/kernels.hpp"

using namespace gradflow;

namespace {
// FNV-1a over the bytes of a buffer.
std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash = 1469598103934665603ull) {
  const auto* byte = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= byte[i];
    hash *= 1099511628211ull;
  }
  return hash;
}
}  // namespace

TEST_CASE("the Box-Muller radius equals Eigen's vectorised (-2 log u)^(1/2) for every 24-bit uniform") {
  // The generator's radius draws are u = k 2^-24, k = 1 .. 2^24; box_muller_radius must give
  // Eigen's bits for each (the draws gradflow made before its AVX-512 path existed). The buffers
  // are Eigen's (64-byte aligned on AVX-512), as the generator's are (alignas(64), rng.cpp): on a
  // destination that is not, Eigen computes the elements before the first aligned packet with the
  // scalar logf, whose bits differ, and the library path (GRADFLOW_KERNELS=normals) would fail here
  // for the buffer's address, not for the draws.
  constexpr std::uint32_t kBatch = 4096;
  Eigen::ArrayXf u(kBatch), fast(kBatch), eigen_radius(kBatch);
  std::size_t mismatches = 0;
  for (std::uint32_t first = 1; first <= (1u << 24); first += kBatch) {
    for (std::uint32_t i = 0; i < kBatch; ++i)
      u[i] = static_cast<float>(std::min(first + i, 1u << 24)) * (1.0f / 16777216.0f);
    box_muller_radius(u.data(), fast.data(), kBatch);
    eigen_radius = (-2.0f * Eigen::Map<const Eigen::ArrayXf>(u.data(), kBatch).log()).sqrt();
    mismatches +=
        static_cast<std::size_t>(std::memcmp(fast.data(), eigen_radius.data(), kBatch * sizeof(float)) != 0);
  }
  CHECK(mismatches == 0);
#if defined(__AVX512F__)
  const bool packet = kernel_choice().normal_packets;
#else
  const bool packet = false;
#endif
  if (!packet) {
    MESSAGE(
        "this build runs no AVX-512 radius packet (no AVX-512, or GRADFLOW_KERNELS names normals): "
        "box_muller_radius evaluates the very expression it is compared with, so the comparison above "
        "checks little here; the radius's independent check is the long double test below");
  }
}

namespace {
// The largest error of `got` against `want` in units of the spacing of floats at |want| (one ulp of
// the correctly rounded result). want must not be 0.
double ulps(float got, long double want) {
  const float rounded = static_cast<float>(want);
  const long double ulp = std::ldexp(1.0L, std::ilogb(std::abs(rounded)) - 23);
  return static_cast<double>(std::abs(static_cast<long double>(got) - want) / ulp);
}
}  // namespace

TEST_CASE("the Box-Muller radius is within 5 ulp of sqrt(-2 ln u) in long double for every 24-bit uniform") {
  // An independent reference: glibc's logl and sqrtl in x87 extended precision (64-bit mantissa),
  // whose own error (~1e-19 relative) is far below a float ulp (2^-24 relative at best). The float
  // radius goes through ln u (Cephes' logf polynomial, whose last step adds e ln 2 to ln m and loses
  // digits to cancellation for u just below 1/sqrt 2), -2x (exact) and sqrt (halving the log's
  // relative error, adding its own rounding, or on AVX-512 one Newton step on rsqrt14). Over all
  // 2^24 draws the worst errors measured on 2026-12-03 were 3.13 ulp (the AVX-512 packet) and
  // 3.85 ulp (the portable build, Eigen's SSE log with glibc's logf); the bound leaves 1 ulp for
  // another machine's glibc. A wrong coefficient that matters in float, a wrong exponent or branch,
  // or a missing factor costs orders of magnitude more. Batches of 4096 take the AVX-512 packet
  // where the build has it, so whichever path the generator uses is the one measured.
  constexpr std::uint32_t kBatch = 4096;
  std::vector<float> u(kBatch), radius(kBatch);
  double worst = 0;
  std::uint32_t worst_k = 0;
  bool one_gives_zero = false;
  for (std::uint32_t first = 1; first <= (1u << 24); first += kBatch) {
    for (std::uint32_t i = 0; i < kBatch; ++i)
      u[i] = static_cast<float>(std::min(first + i, 1u << 24)) * (1.0f / 16777216.0f);
    box_muller_radius(u.data(), radius.data(), kBatch);
    for (std::uint32_t i = 0; i < kBatch && first + i <= (1u << 24); ++i) {
      if (u[i] == 1.0f) {  // ln 1 = 0: the radius is exactly 0
        one_gives_zero = radius[i] == 0.0f;
        continue;
      }
      const long double want = std::sqrt(-2.0L * std::log(static_cast<long double>(u[i])));
      const double error = ulps(radius[i], want);
      if (!(error <= worst)) {  // NaN counts as the worst
        worst = std::isnan(error) ? HUGE_VAL : error;
        worst_k = first + i;
      }
    }
  }
  MESSAGE("Box-Muller radius: worst error ", worst, " ulp, at u = ", worst_k, " 2^-24");
  CHECK(one_gives_zero);
  CHECK(worst <= 5.0);
}

TEST_CASE(
    "the Box-Muller angle's sine and cosine are within 4.5 2^-24 of sin and cos of 2 pi u in long double") {
  // An independent reference for every angle draw u = k 2^-24, k = 0 .. 2^24 - 1: std::sin and
  // std::cos of 2 pi u in long double (relative error ~1e-19). The error budget of the float
  // transform, in units of 2^-24 (absolute; the results are at most 1, and the slope of sin and
  // cos is at most 1): x = frac(4u) (pi/2) carries pi/2's rounding to float (0.73) and the product's
  // (0.5 ulp of x < pi/2: 1.0); the Taylor series' truncation (< 6e-8: 1.01); the Horner evaluation's
  // last two roundings (0.5, and 0.5 of the inner sum times x: 0.79), about 4 in all; measured on
  // 2026-12-03, 3.15 (native build, contracted to FMA) and 3.49 (portable). Dropping the last term
  // of either series costs 7.9 (cos) or 60 (sin), a wrong quadrant or sign about 2^24. The bound is
  // absolute: near the zeros a cosine is 1 - x^2/2 + ... evaluated close to 0, where a relative bound
  // cannot hold. The quarter turns are checked exactly.
  constexpr std::uint32_t kBatch = 4096;
  std::vector<float> u(kBatch), sine(kBatch), cosine(kBatch);
  const long double two_pi = 2.0L * std::numbers::pi_v<long double>;
  long double worst_sine = 0, worst_cosine = 0;
  const auto track = [](long double& worst, long double error) {  // a NaN counts as the worst
    if (!(error <= worst)) worst = std::isnan(error) ? HUGE_VALL : error;
  };
  for (std::uint32_t first = 0; first < (1u << 24); first += kBatch) {
    for (std::uint32_t i = 0; i < kBatch; ++i) u[i] = static_cast<float>(first + i) * (1.0f / 16777216.0f);
    box_muller_angle(u.data(), sine.data(), cosine.data(), kBatch);
    for (std::uint32_t i = 0; i < kBatch; ++i) {
      const long double angle = two_pi * static_cast<long double>(u[i]);
      track(worst_sine, std::abs(static_cast<long double>(sine[i]) - std::sin(angle)));
      track(worst_cosine, std::abs(static_cast<long double>(cosine[i]) - std::cos(angle)));
    }
  }
  const long double unit = std::ldexp(1.0L, -24);
  MESSAGE("Box-Muller angle: worst |sin error| ", static_cast<double>(worst_sine / unit),
          " 2^-24, |cos error| ", static_cast<double>(worst_cosine / unit), " 2^-24");
  CHECK(worst_sine <= 4.5L * unit);
  CHECK(worst_cosine <= 4.5L * unit);
  // The quarter turns, exactly: (sin, cos) of 0, pi/2, pi and 3 pi/2.
  const float quarters[] = {0.0f, 0.25f, 0.5f, 0.75f};
  float quarter_sine[4], quarter_cosine[4];
  box_muller_angle(quarters, quarter_sine, quarter_cosine, 4);
  CHECK(quarter_sine[0] == 0.0f);
  CHECK(quarter_cosine[0] == 1.0f);
  CHECK(quarter_sine[1] == 1.0f);
  CHECK(quarter_cosine[1] == 0.0f);
  CHECK(quarter_sine[2] == 0.0f);
  CHECK(quarter_cosine[2] == -1.0f);
  CHECK(quarter_sine[3] == -1.0f);
  CHECK(quarter_cosine[3] == 0.0f);
}

namespace {
// The angle transform as first written (src/rng.cpp at f16d8ee), with its last coefficient divided.
void reference_sin_cos_of_turn(const float* u, float* sine, float* cosine, std::size_t count) {
  for (std::size_t j = 0; j < count; ++j) {
    const float quarter_turns = 4.0f * u[j];
    const int quadrant = static_cast<int>(quarter_turns);
    const float x = (quarter_turns - static_cast<float>(quadrant)) * (0.5f * std::numbers::pi_v<float>);
    const float x2 = x * x;
    const float s =
        x * (1.0f +
             x2 * (-1.0f / 6 +
                   x2 * (1.0f / 120 + x2 * (-1.0f / 5040 + x2 * (1.0f / 362880 + x2 * (-1.0f / 39916800))))));
    const float c =
        1.0f +
        x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 +
                                                                  x2 * (-1.0f / 3628800 + x2 / 479001600)))));
    const bool odd = (quadrant & 1) != 0;
    const float sin_abs = odd ? c : s, cos_abs = odd ? s : c;
    sine[j] = (quadrant >= 2 ? -1.0f : 1.0f) * sin_abs;
    cosine[j] = ((quadrant == 1 || quadrant == 2) ? -1.0f : 1.0f) * cos_abs;
  }
}
}  // namespace

TEST_CASE("the Box-Muller angle's sine and cosine are unchanged for every 24-bit uniform") {
  // The generator's angle draws are u = k 2^-24, k = 0 .. 2^24 - 1; the faster polynomial
  // (a multiply for the first version's division) must give the same bits for each. This pins the
  // bits against the first version, a copy of the same algorithm, so it cannot tell whether that
  // algorithm is right: the long double test above does.
  constexpr std::uint32_t kBatch = 4096;
  std::vector<float> u(kBatch), sine(kBatch), cosine(kBatch), reference_sine(kBatch),
      reference_cosine(kBatch);
  std::size_t mismatches = 0;
  for (std::uint32_t first = 0; first < (1u << 24); first += kBatch) {
    for (std::uint32_t i = 0; i < kBatch; ++i) u[i] = static_cast<float>(first + i) * (1.0f / 16777216.0f);
    box_muller_angle(u.data(), sine.data(), cosine.data(), kBatch);
    reference_sin_cos_of_turn(u.data(), reference_sine.data(), reference_cosine.data(), kBatch);
    mismatches += static_cast<std::size_t>(
                      std::memcmp(sine.data(), reference_sine.data(), kBatch * sizeof(float)) != 0) +
                  static_cast<std::size_t>(
                      std::memcmp(cosine.data(), reference_cosine.data(), kBatch * sizeof(float)) != 0);
  }
  CHECK(mismatches == 0);
}

namespace {
// Phi(z), the standard normal distribution function, in long double.
long double normal_cdf(long double z) {
  return 0.5L * std::erfc(-z / std::numbers::sqrt2_v<long double>);
}
}  // namespace

TEST_CASE("fill_normal's draws have the standard normal's moments, quantiles and distribution function") {
  // 2^22 draws of one stream, unscaled, against N(0, 1). Every bound is 5 standard errors of its
  // statistic under N(0, 1) (a two-sided normal tail of 5.7e-7), or, for the Kolmogorov-Smirnov
  // statistic, its 1e-6 tail: a correct generator fails one of the 16 checks for at most about 1e-5
  // of keys, and this key is fixed, so the test is deterministic. A generator that is wrong by more
  // than these bounds (a biased or clipped radius, a wrong angle, pairs that are not independent) fails.
  constexpr std::size_t kDraws = std::size_t{1} << 22;
  const double n = static_cast<double>(kDraws);
  std::vector<float> draws(kDraws);
  fill_normal(stream_key(2026, RandomUse::probe, 5, 1), 1.0f, draws.data(), kDraws);
  double sum = 0, squares = 0, fourth = 0;
  for (const float x : draws) {
    const double x2 = static_cast<double>(x) * x;
    sum += x;
    squares += x2;
    fourth += x2 * x2;
  }
  const double mean = sum / n, variance = squares / n - mean * mean;
  CAPTURE(mean);
  CAPTURE(variance);
  CAPTURE(fourth / n);
  CHECK(std::abs(mean) <= 5 * std::sqrt(1 / n));             // Var x = 1
  CHECK(std::abs(variance - 1) <= 5 * std::sqrt(2 / n));     // Var x^2 = E x^4 - 1 = 2
  CHECK(std::abs(fourth / n - 3) <= 5 * std::sqrt(96 / n));  // Var x^4 = E x^8 - 9 = 105 - 9
  // The fraction of draws below z, for quantiles from the far left tail to the far right one.
  std::vector<float> sorted = draws;
  std::sort(sorted.begin(), sorted.end());
  for (const double z : {-4.0, -3.0, -2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0}) {
    CAPTURE(z);
    const double p = static_cast<double>(normal_cdf(z));
    const double below =
        static_cast<double>(std::lower_bound(sorted.begin(), sorted.end(), static_cast<float>(z)) -
                            sorted.begin()) /
        n;
    CAPTURE(below);
    CHECK(std::abs(below - p) <= 5 * std::sqrt(p * (1 - p) / n));
  }
  // Kolmogorov-Smirnov: D = sup |F_n - Phi|; P(sqrt(n) D > 2.69) ~ 2 exp(-2 2.69^2) = 1e-6.
  long double d = 0;
  for (std::size_t i = 0; i < kDraws; ++i) {
    const long double phi = normal_cdf(sorted[i]);
    d = std::max({d, static_cast<long double>(i + 1) / n - phi, phi - static_cast<long double>(i) / n});
  }
  CAPTURE(static_cast<double>(d * std::sqrt(n)));
  CHECK(d * std::sqrt(n) <= 2.69L);
  // The two draws of each Box-Muller pair (a chunk's cosine half and sine half, rng.cpp) are independent
  // normals: E[xy] = 0 (Var xy = 1) and E[x^2 y^2] = 1 (Var = E x^4 E y^4 - 1 = 8).
  double products = 0, squared_products = 0;
  std::size_t pairs = 0;
  for (std::size_t chunk = 0; chunk < kDraws; chunk += kNormalChunk) {
    for (std::size_t j = 0; j < kNormalChunk / 2; ++j, ++pairs) {
      const double x = draws[chunk + j], y = draws[chunk + kNormalChunk / 2 + j];
      products += x * y;
      squared_products += x * x * y * y;
    }
  }
  const double m = static_cast<double>(pairs);
  CAPTURE(products / m);
  CAPTURE(squared_products / m);
  CHECK(std::abs(products / m) <= 5 * std::sqrt(1 / m));
  CHECK(std::abs(squared_products / m - 1) <= 5 * std::sqrt(8 / m));
  // The double overload draws the same values, scaled in double: stddev 0.5 halves them exactly.
  std::vector<double> twice(3 * kNormalChunk + 5);
  fill_normal(stream_key(2026, RandomUse::probe, 5, 1), 0.5, twice.data(), twice.size());
  bool halves = true;
  for (std::size_t i = 0; i < twice.size(); ++i)
    halves = halves && twice[i] == 0.5 * static_cast<double>(draws[i]);
  CHECK(halves);
}

TEST_CASE("the generator draws the same bits with subnormals flushed to zero") {
  // A WorkPool thread draws the next sublayer's weights while it waits, in whatever floating-point
  // mode it is in: the backward pass runs with subnormals flushed (SubnormalsFlushed, kernels.hpp),
  // so the draws must not depend on the mode. No intermediate of the radius or the angle comes near
  // float's smallest normal (the smallest nonzero uniform is 2^-24). This build's path (packets or
  // loops, kernel_choice()) is the one compared.
  const auto draw = [](std::vector<float>& single, std::vector<double>& twice) {
    fill_normal(stream_key(1, RandomUse::weight, 2, 3), 0.5f, single.data(), single.size());
    fill_normal(stream_key(7, RandomUse::input, 0), 1.0, twice.data(), twice.size());
  };
  std::vector<float> gradual(200003), flushed(gradual.size());
  std::vector<double> gradual_double(4099), flushed_double(gradual_double.size());
  draw(gradual, gradual_double);
  {
    const SubnormalsFlushed flush;
    draw(flushed, flushed_double);
  }
  CHECK(std::memcmp(gradual.data(), flushed.data(), gradual.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(gradual_double.data(), flushed_double.data(), gradual_double.size() * sizeof(double)) ==
        0);
}

TEST_CASE("the generator's draws are pinned for this instruction set") {
  // Hashes of 1,000,003 float draws and 4,099 double draws, recorded with the implementation
  // that produced data/baselines. Eigen's vectorised log and sqrt differ in the last bit
  // between instruction sets, so each of the three x86-64 levels that builds use has its own
  // (README, "Reproducibility": bits are promised per instruction set). The AVX-512 hash is the
  // native build's; the other two were recorded on 2026-12-01 by compiling src/rng.cpp and this
  // file at -O3 with no -march (CI's portable build, scripts/ci-portable) and with
  // -march=x86-64-v3, and are the same with rng.cpp as of b1a600c~1, the implementation before
  // the hashes were first pinned (the hashes pinned then for those two levels matched no build).
  std::vector<float> single(1000003);
  std::vector<double> twice(4099);
  fill_normal(stream_key(1, RandomUse::weight, 2, 3), 0.5f, single.data(), single.size());
  fill_normal(stream_key(7, RandomUse::input, 0), 1.0, twice.data(), twice.size());
  const std::uint64_t hash =
      fnv1a(twice.data(), twice.size() * sizeof(double), fnv1a(single.data(), single.size() * sizeof(float)));
  CHECK(single[0] == 0.111869313f);
  CHECK(twice[4098] == -0.44447386264801025);
#if !defined(__OPTIMIZE__)
  // Unoptimised builds (Debug, the debug-sanitize preset) round differently: GCC contracts
  // a * b + c into one fused multiply-add only when optimising (-ffp-contract=fast acts in the
  // optimiser), so their draws, and every figure, differ in the last bits from Release's. README,
  // "Reproducibility": bit-identical figures are promised between optimised builds for the same
  // instruction set only. Here the draws must still be deterministic: a second pass gives the same hash.
  std::vector<float> again(single.size());
  fill_normal(stream_key(1, RandomUse::weight, 2, 3), 0.5f, again.data(), again.size());
  CHECK(std::memcmp(again.data(), single.data(), single.size() * sizeof(float)) == 0);
  MESSAGE("unoptimised build: the pinned hash (Release builds only) is not checked; this build's is "
          << hash);
#elif defined(__AVX512F__)
  CHECK(hash == 0x5bc2c79efd526ed7ull);
#elif defined(__AVX2__) && defined(__FMA__)
  CHECK(hash == 0x753f8bbef84e7c1cull);
#elif defined(__x86_64__) && !defined(__AVX__)
  // Two values seen for the same sources and compiler (Debian GCC 12.2, -O3, no -march): 0xccf1...
  // where it was pinned (2026-12-01), 0xb74c... on an AMD EPYC (family 0x19) machine of this kind
  // (2026-12-02, reproduced by compiling src/rng.cpp alone). The build is identical, so the
  // difference comes from the machine at run time (the portable path calls glibc's logf for the
  // tail of each Eigen log); not yet explained. Either value still pins the generator: any change to
  // it moves the hash off both.
  const bool pinned = hash == 0xccf1ae8c7ba46565ull || hash == 0xb74c7b418f307215ull;
  if (!pinned) MESSAGE("portable build's hash: " << hash);
  CHECK(pinned);
#else
  MESSAGE("no pinned hash for this instruction set: " << hash);
#endif
}
