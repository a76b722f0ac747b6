// The counter-based generator (rng.hpp): its draws are pinned, so that a faster implementation
// cannot silently change every figure gradflow reports.
#include "gradflow/rng.hpp"

#include <doctest/doctest.h>

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <vector>

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
  // Eigen's bits for each (the draws gradflow made before its AVX-512 path existed).
  constexpr std::uint32_t kBatch = 4096;
  std::vector<float> u(kBatch), fast(kBatch);
  Eigen::ArrayXf eigen_radius(kBatch);
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
  // (a multiply for the first version's division) must give the same bits for each.
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
