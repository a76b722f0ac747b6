// Counter-based normal generator: SplitMix64 counters and a vectorised Box-Muller transform.
#include "gradflow/rng.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <numbers>
#include <stdexcept>

namespace gradflow {

namespace {
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / phi, SplitMix64's increment
constexpr std::size_t kChunkPairs = 512;                  // pairs generated per vectorised chunk
constexpr float kTwoToMinus24 = 1.0f / 16777216.0f;

using ChunkArray = Eigen::Array<float, kChunkPairs, 1>;

// sin and cos of 2 pi u for u in [0, 1): the quadrant from 4u, then Taylor polynomials on
// [0, pi/2) whose truncation errors (< 6e-8 and 7e-9) are below float's resolution. Branch-free,
// so the compiler vectorises it; much cheaper than a general sin/cos with range reduction.
struct TurnSinCos {
  float sin, cos;
};
inline TurnSinCos sin_cos_of_turn(float u) {
  const float quarter_turns = 4.0f * u;
  const int quadrant = static_cast<int>(quarter_turns);
  const float x = (quarter_turns - static_cast<float>(quadrant)) * (0.5f * std::numbers::pi_v<float>);
  const float x2 = x * x;
  const float s =
      x * (1.0f +
           x2 * (-1.0f / 6 +
                 x2 * (1.0f / 120 + x2 * (-1.0f / 5040 + x2 * (1.0f / 362880 + x2 * (-1.0f / 39916800))))));
  const float c =
      1.0f +
      x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 +
                                            x2 * (1.0f / 40320 + x2 * (-1.0f / 3628800 + x2 / 479001600)))));
  // Rotate by the quadrant: (sin, cos) -> (cos, -sin) per quarter turn.
  const bool odd = (quadrant & 1) != 0;
  const float sin_abs = odd ? c : s, cos_abs = odd ? s : c;
  const float sin_sign = quadrant >= 2 ? -1.0f : 1.0f;
  const float cos_sign = (quadrant == 1 || quadrant == 2) ? -1.0f : 1.0f;
  return {sin_sign * sin_abs, cos_sign * cos_abs};
}

// One chunk of 2 * kChunkPairs standard normals: Box-Muller on pairs [first_pair, first_pair +
// kChunkPairs); cosines fill out[0, kChunkPairs), sines out[kChunkPairs, 2 kChunkPairs).
void standard_normal_chunk(std::uint64_t key, std::uint64_t first_pair, float* out) {
  ChunkArray u_radius, u_angle;
  for (std::size_t j = 0; j < kChunkPairs; ++j) {
    const std::uint64_t bits = mix64(key + (first_pair + j + 1) * kGolden);
    // 24-bit uniforms: radius draw in (0, 1] (log never sees 0), angle draw in [0, 1).
    u_radius[j] = static_cast<float>((bits >> 40) + 1) * kTwoToMinus24;
    u_angle[j] = static_cast<float>((bits >> 8) & 0xFFFFFFu) * kTwoToMinus24;
  }
  const ChunkArray radius = (-2.0f * u_radius.log()).sqrt();
  for (std::size_t j = 0; j < kChunkPairs; ++j) {
    const TurnSinCos sc = sin_cos_of_turn(u_angle[j]);
    out[j] = radius[j] * sc.cos;
    out[kChunkPairs + j] = radius[j] * sc.sin;
  }
}

// Chunks are always whole (a multiple of every SIMD width), so each draw goes through the same
// vectorised code path whatever `count` is: element i depends on (key, i) only.
template <typename Scalar>
void fill_normal_impl(std::uint64_t key, Scalar stddev, Scalar* out, std::size_t first, std::size_t end) {
  static_assert(kNormalChunk == 2 * kChunkPairs);
  if (first % kNormalChunk != 0) throw std::logic_error("fill_normal_range must start on a chunk boundary");
  alignas(64) float chunk[kNormalChunk];
  for (std::size_t begin = first; begin < end; begin += kNormalChunk) {
    standard_normal_chunk(key, begin / 2, chunk);
    const std::size_t n = std::min(kNormalChunk, end - begin);
    Scalar* destination = out + (begin - first);
    for (std::size_t i = 0; i < n; ++i) destination[i] = stddev * static_cast<Scalar>(chunk[i]);
  }
}
}  // namespace

std::uint64_t mix64(std::uint64_t value) {
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
  return value ^ (value >> 31);
}

std::uint64_t stream_key(std::uint64_t seed, RandomUse use, std::uint64_t major, std::uint64_t minor) {
  std::uint64_t key = mix64(seed + kGolden);
  key = mix64(key ^ (static_cast<std::uint64_t>(use) * kGolden));
  key = mix64(key ^ (major + 1) * 0xD1B54A32D192ED03ull);
  return mix64(key ^ (minor + 1) * 0xAEF17502108EF2D9ull);
}

void fill_normal(std::uint64_t key, float stddev, float* out, std::size_t count) {
  fill_normal_impl(key, stddev, out, 0, count);
}
void fill_normal(std::uint64_t key, double stddev, double* out, std::size_t count) {
  fill_normal_impl(key, stddev, out, 0, count);
}
void fill_normal_range(std::uint64_t key, float stddev, float* out, std::size_t begin, std::size_t end) {
  fill_normal_impl(key, stddev, out, begin, end);
}
void fill_normal_range(std::uint64_t key, double stddev, double* out, std::size_t begin, std::size_t end) {
  fill_normal_impl(key, stddev, out, begin, end);
}

}  // namespace gradflow
