// Counter-based random numbers: every value is a pure function of (seed, stream, index), so
// weights can be regenerated instead of stored and results never depend on thread count or order.
#pragma once
#include <cstddef>
#include <cstdint>

namespace gradflow {

// What a random stream feeds; part of the key so that streams never overlap.
enum class RandomUse : std::uint64_t { input = 1, probe = 2, weight = 3, spectrum = 4 };

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
std::uint64_t mix64(std::uint64_t value);

// The key of one stream, e.g. (seed, weight, sublayer, matrix).
std::uint64_t stream_key(std::uint64_t seed, RandomUse use, std::uint64_t major, std::uint64_t minor = 0);

// Fills out[0..count) with stddev * N(0, 1) draws of stream `key`. Element i depends only on
// (key, i): Box-Muller on SplitMix64 counters, computed in float in whole chunks of 1024 (the same
// draws feed float32 and float64 runs, so the two precisions differ only in arithmetic).
void fill_normal(std::uint64_t key, float stddev, float* out, std::size_t count);
void fill_normal(std::uint64_t key, double stddev, double* out, std::size_t count);

// Draws are made in chunks of this many elements; a partial fill must start on a chunk boundary.
inline constexpr std::size_t kNormalChunk = 1024;

// Elements [begin, end) of the same stream into out[0 .. end - begin): fill_normal split into
// pieces that can run on different threads. begin must be a multiple of kNormalChunk.
void fill_normal_range(std::uint64_t key, float stddev, float* out, std::size_t begin, std::size_t end);
void fill_normal_range(std::uint64_t key, double stddev, double* out, std::size_t begin, std::size_t end);

// The Box-Muller radius sqrt(-2 ln u) of u[0..count) into radius[0..count), exactly as Eigen's
// vectorised (-2 * u.log()).sqrt() evaluates it for u in [2^-24, 1] (a faster, bit-identical
// path on AVX-512 when count is a multiple of 16). Exposed for the tests.
void box_muller_radius(const float* u, float* radius, std::size_t count);

// sin(2 pi u) and cos(2 pi u) of u[0..count), as the generator computes them for its angle draws
// (u = k 2^-24, k in [0, 2^24)). Exposed for the tests.
void box_muller_angle(const float* u, float* sine, float* cosine, std::size_t count);

}  // namespace gradflow
