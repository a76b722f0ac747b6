// Counter-based normal generator: SplitMix64 counters and a vectorised Box-Muller transform, on
// AVX-512 packets where the build has them (KernelChoice::normal_packets), in loops elsewhere.
#include "gradflow/rng.hpp"

#include <Eigen/Core>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <type_traits>

#include "gradflow/kernels.hpp"

namespace gradflow {

namespace {
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / phi, SplitMix64's increment
constexpr std::size_t kChunkPairs = 512;                  // pairs generated per vectorised chunk
constexpr float kTwoToMinus24 = 1.0f / 16777216.0f;

// sin and cos of 2 pi u for u in [0, 1): the quadrant from 4u, then Taylor polynomials on
// [0, pi/2) whose truncation errors (< 6e-8 and 7e-9) are below float's resolution. Branch-free,
// so the compiler vectorises it; much cheaper than a general sin/cos with range reduction.
// The last coefficient is multiplied, not divided (x2 / 479001600 cost a vdivps per 16 pairs): the
// results are bit-identical for all 2^24 possible u, which tests/ops/rng.test.cpp checks.
// The Taylor coefficients in x^2, highest power first, for Horner's rule: sin x = x p(x^2) and
// cos x = q(x^2). Each step, s x^2 + c, is one fused multiply-add where the build contracts.
constexpr float kSineTaylor[] = {-1.0f / 39916800, 1.0f / 362880, -1.0f / 5040, 1.0f / 120, -1.0f / 6, 1.0f};
constexpr float kCosineTaylor[] = {1.0f / 479001600, -1.0f / 3628800, 1.0f / 40320, -1.0f / 720,
                                   1.0f / 24,        -0.5f,           1.0f};
struct TurnSinCos {
  float sin, cos;
};
inline TurnSinCos sin_cos_of_turn(float u) {
  const float quarter_turns = 4.0f * u;
  const int quadrant = static_cast<int>(quarter_turns);
  const float x = (quarter_turns - static_cast<float>(quadrant)) * (0.5f * std::numbers::pi_v<float>);
  const float x2 = x * x;
  float p = kSineTaylor[0], c = kCosineTaylor[0];
  for (std::size_t i = 1; i < std::size(kSineTaylor); ++i) p = p * x2 + kSineTaylor[i];
  for (std::size_t i = 1; i < std::size(kCosineTaylor); ++i) c = c * x2 + kCosineTaylor[i];
  const float s = x * p;
  // Rotate by the quadrant: (sin, cos) -> (cos, -sin) per quarter turn.
  const bool odd = (quadrant & 1) != 0;
  const float sin_abs = odd ? c : s, cos_abs = odd ? s : c;
  const float sin_sign = quadrant >= 2 ? -1.0f : 1.0f;
  const float cos_sign = (quadrant == 1 || quadrant == 2) ? -1.0f : 1.0f;
  return {sin_sign * sin_abs, cos_sign * cos_abs};
}

// sqrt(-2 ln u) for u in (0, 1], as Eigen evaluates (-2 * u.log()).sqrt() on whole packets.
#if defined(__AVX512F__)
// Eigen 3.4's AVX-512 plog_float and fast-math psqrt<Packet16f> (GenericPacketMathFunctions.h,
// AVX512/MathFunctions.h), step for step with the same fused multiply-adds, less their handling of
// zero, negative, denormal and infinite arguments, which the Box-Muller radius never sees: u is
// k 2^-24 with k in [1, 2^24]. So the result is bit-identical to Eigen's for every such u (the
// tests check all 2^24) at about half the cost, and the draws did not change.
inline __m512 radius_packet(__m512 u) {
  // frexp: u = m 2^e with m in [0.5, 1), then m shifted to [sqrt(1/2), sqrt(2)) - 1 (Cephes logf).
  const __m512i bits = _mm512_castps_si512(u);
  __m512 e = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bits, 23)), _mm512_set1_ps(126.0f));
  const __m512 m = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x807fffff)), _mm512_set1_epi32(0x3f000000)));
  const __mmask16 below = _mm512_cmp_ps_mask(m, _mm512_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  __m512 x = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  e = _mm512_mask_sub_ps(e, below, e, _mm512_set1_ps(1.0f));
  x = _mm512_mask_add_ps(x, below, x, m);
  // ln(1 + x) by Cephes' degree-8 polynomial, in Eigen's three interleaved parts.
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 x3 = _mm512_mul_ps(x2, x);
  __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(7.0376836292E-2f), x, _mm512_set1_ps(-1.1514610310E-1f));
  __m512 y1 = _mm512_fmadd_ps(_mm512_set1_ps(-1.2420140846E-1f), x, _mm512_set1_ps(+1.4249322787E-1f));
  __m512 y2 = _mm512_fmadd_ps(_mm512_set1_ps(+2.0000714765E-1f), x, _mm512_set1_ps(-2.4999993993E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.1676998740E-1f));
  y1 = _mm512_fmadd_ps(y1, x, _mm512_set1_ps(-1.6668057665E-1f));
  y2 = _mm512_fmadd_ps(y2, x, _mm512_set1_ps(+3.3333331174E-1f));
  y = _mm512_fmadd_ps(y, x3, y1);
  y = _mm512_fmadd_ps(y, x3, y2);
  y = _mm512_mul_ps(y, x3);
  y = _mm512_fmadd_ps(_mm512_set1_ps(-0.5f), x2, y);
  x = _mm512_add_ps(x, y);
  x = _mm512_fmadd_ps(e, _mm512_set1_ps(static_cast<float>(EIGEN_LN2)), x);
  const __m512 v = _mm512_mul_ps(_mm512_set1_ps(-2.0f), x);
  // sqrt(v): one Newton step on rsqrt14, and 0 for v = -0 (u = 1), as Eigen's fast-math psqrt.
  const __m512 neg_half = _mm512_mul_ps(v, _mm512_set1_ps(-0.5f));
  const __mmask16 tiny =
      _mm512_kand(_mm512_cmp_ps_mask(v, _mm512_set1_ps(std::numeric_limits<float>::min()), _CMP_LT_OQ),
                  _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ));
  __m512 r = _mm512_rsqrt14_ps(v);
  r = _mm512_mul_ps(r, _mm512_fmadd_ps(neg_half, _mm512_mul_ps(r, r), _mm512_set1_ps(1.5f)));
  return _mm512_mask_blend_ps(tiny, _mm512_mul_ps(v, r), _mm512_setzero_ps());
}
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// mix64 (below) on 8 counters at once.
inline __m512i mix64_packet(__m512i value) {
  value = _mm512_mullo_epi64(_mm512_xor_si512(value, _mm512_srli_epi64(value, 30)),
                             _mm512_set1_epi64(static_cast<long long>(0xBF58476D1CE4E5B9ull)));
  value = _mm512_mullo_epi64(_mm512_xor_si512(value, _mm512_srli_epi64(value, 27)),
                             _mm512_set1_epi64(static_cast<long long>(0x94D049BB133111EBull)));
  return _mm512_xor_si512(value, _mm512_srli_epi64(value, 31));
}

// The low 32 bits of each 64-bit lane of lo (lanes 0-7) and hi (lanes 8-15), shifted right by `shift`.
template <int Shift>
inline __m512i low_words(__m512i lo, __m512i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_srli_epi64(lo, Shift))),
                            _mm512_cvtepi64_epi32(_mm512_srli_epi64(hi, Shift)), 1);
}

// sin_cos_of_turn on 16 lanes, operation for operation as GCC compiles the scalar version
// (-ffp-contract=fast: each Horner step one fused multiply-add), so the bits are the same.
inline void sin_cos_of_turn_packet(__m512 u, __m512& sine, __m512& cosine) {
  const __m512 quarter_turns = _mm512_mul_ps(_mm512_set1_ps(4.0f), u);
  const __m512i quadrant = _mm512_cvttps_epi32(quarter_turns);
  const __m512 x = _mm512_mul_ps(_mm512_sub_ps(quarter_turns, _mm512_cvtepi32_ps(quadrant)),
                                 _mm512_set1_ps(0.5f * std::numbers::pi_v<float>));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(kSineTaylor[0]), c = _mm512_set1_ps(kCosineTaylor[0]);
  for (std::size_t i = 1; i < std::size(kSineTaylor); ++i)
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(kSineTaylor[i]));
  for (std::size_t i = 1; i < std::size(kCosineTaylor); ++i)
    c = _mm512_fmadd_ps(c, x2, _mm512_set1_ps(kCosineTaylor[i]));
  const __m512 s = _mm512_mul_ps(x, p);
  // Rotate by the quadrant: odd quadrants swap sine and cosine; the signs are flipped exactly.
  const __m512i q1 = _mm512_set1_epi32(1), q2 = _mm512_set1_epi32(2);
  const __mmask16 odd = _mm512_test_epi32_mask(quadrant, q1);
  const __mmask16 sine_negative = _mm512_cmpge_epi32_mask(quadrant, q2);
  const __mmask16 cosine_negative =
      _mm512_kor(_mm512_cmpeq_epi32_mask(quadrant, q1), _mm512_cmpeq_epi32_mask(quadrant, q2));
  const __m512 sine_abs = _mm512_mask_blend_ps(odd, s, c), cosine_abs = _mm512_mask_blend_ps(odd, c, s);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  sine = _mm512_mask_xor_ps(sine_abs, sine_negative, sine_abs, sign);
  cosine = _mm512_mask_xor_ps(cosine_abs, cosine_negative, cosine_abs, sign);
}

// standard_normal_chunk with everything in registers, 16 pairs at a time: the counters, mix64,
// the 24-bit uniforms, radius_packet and the angle. The same bits as the loops below (the pinned
// hash in tests/ops/rng.test.cpp), in about half the time (bench/kernels.py, piece "normals").
void standard_normal_chunk_packet(std::uint64_t key, std::uint64_t first_pair, float scale, float* out) {
  const std::uint64_t base = key + first_pair * kGolden;
  // Pair j's counter is base + (j + 1) kGolden (mod 2^64), j = 0..7 in lo and 8..15 in hi, then
  // 16 pairs further on each step.
  const auto counter = [&](std::uint64_t j) { return static_cast<long long>(base + (j + 1) * kGolden); };
  __m512i lo = _mm512_setr_epi64(counter(0), counter(1), counter(2), counter(3), counter(4), counter(5),
                                 counter(6), counter(7));
  __m512i hi = _mm512_add_epi64(lo, _mm512_set1_epi64(static_cast<long long>(8 * kGolden)));
  const __m512i step = _mm512_set1_epi64(static_cast<long long>(16 * kGolden));
  const __m512 unit = _mm512_set1_ps(kTwoToMinus24), scaled = _mm512_set1_ps(scale);
  for (std::size_t j = 0; j < kChunkPairs; j += 16) {
    const __m512i bits_lo = mix64_packet(lo), bits_hi = mix64_packet(hi);
    lo = _mm512_add_epi64(lo, step);
    hi = _mm512_add_epi64(hi, step);
    const __m512 u_radius = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_add_epi32(low_words<40>(bits_lo, bits_hi), _mm512_set1_epi32(1))), unit);
    const __m512 u_angle = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_and_si512(low_words<8>(bits_lo, bits_hi), _mm512_set1_epi32(0xFFFFFF))),
        unit);
    const __m512 radius = radius_packet(u_radius);
    __m512 sine, cosine;
    sin_cos_of_turn_packet(u_angle, sine, cosine);
    _mm512_storeu_ps(out + j, _mm512_mul_ps(scaled, _mm512_mul_ps(radius, cosine)));
    _mm512_storeu_ps(out + kChunkPairs + j, _mm512_mul_ps(scaled, _mm512_mul_ps(radius, sine)));
  }
}
#endif

// One chunk of 2 * kChunkPairs standard normals, times `scale`: Box-Muller on pairs [first_pair,
// first_pair + kChunkPairs); cosines fill out[0, kChunkPairs), sines out[kChunkPairs, 2 kChunkPairs).
void standard_normal_chunk(std::uint64_t key, std::uint64_t first_pair, float scale, float* out) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  if (kernel_choice().normal_packets) return standard_normal_chunk_packet(key, first_pair, scale, out);
#endif
  alignas(64) float u_radius[kChunkPairs], u_angle[kChunkPairs], radius[kChunkPairs];
  std::uint64_t counter = key + first_pair * kGolden;  // SplitMix64's state before pair first_pair
  for (std::size_t j = 0; j < kChunkPairs; ++j) {
    counter += kGolden;  // key + (first_pair + j + 1) kGolden, mod 2^64, without a multiply
    const std::uint64_t bits = mix64(counter);
    // 24-bit uniforms: radius draw in (0, 1] (log never sees 0), angle draw in [0, 1). Both are
    // exact in 32 bits, which converts to float in one instruction per 16 lanes.
    u_radius[j] = static_cast<float>(static_cast<std::uint32_t>(bits >> 40) + 1u) * kTwoToMinus24;
    u_angle[j] = static_cast<float>(static_cast<std::uint32_t>(bits >> 8) & 0xFFFFFFu) * kTwoToMinus24;
  }
  box_muller_radius(u_radius, radius, kChunkPairs);
  for (std::size_t j = 0; j < kChunkPairs; ++j) {
    const TurnSinCos sc = sin_cos_of_turn(u_angle[j]);
    out[j] = scale * (radius[j] * sc.cos);
    out[kChunkPairs + j] = scale * (radius[j] * sc.sin);
  }
}

// Chunks are always whole (a multiple of every SIMD width), so each draw goes through the same
// vectorised code path whatever `count` is: element i depends on (key, i) only. A float chunk
// that is whole is drawn straight into `out`, scaled on the way (the same product, stddev times
// the draw, rounded once).
template <typename Scalar>
void fill_normal_impl(std::uint64_t key, Scalar stddev, Scalar* out, std::size_t first, std::size_t end) {
  static_assert(kNormalChunk == 2 * kChunkPairs);
  if (first % kNormalChunk != 0) throw std::logic_error("fill_normal_range must start on a chunk boundary");
  alignas(64) float chunk[kNormalChunk];
  for (std::size_t begin = first; begin < end; begin += kNormalChunk) {
    const std::size_t n = std::min(kNormalChunk, end - begin);
    Scalar* destination = out + (begin - first);
    if constexpr (std::is_same_v<Scalar, float>) {
      if (n == kNormalChunk) {
        standard_normal_chunk(key, begin / 2, stddev, destination);
        continue;
      }
    }
    standard_normal_chunk(key, begin / 2, 1.0f, chunk);
    for (std::size_t i = 0; i < n; ++i) destination[i] = stddev * static_cast<Scalar>(chunk[i]);
  }
}
}  // namespace

void box_muller_angle(const float* u, float* sine, float* cosine, std::size_t count) {
  for (std::size_t j = 0; j < count; ++j) {
    const TurnSinCos sc = sin_cos_of_turn(u[j]);
    sine[j] = sc.sin;
    cosine[j] = sc.cos;
  }
}

void box_muller_radius(const float* u, float* radius, std::size_t count) {
#if defined(__AVX512F__)
  if (count % 16 == 0 && kernel_choice().normal_packets) {
    for (std::size_t j = 0; j < count; j += 16)
      _mm512_storeu_ps(radius + j, radius_packet(_mm512_loadu_ps(u + j)));
    return;
  }
#endif
  Eigen::Map<Eigen::ArrayXf>(radius, static_cast<Eigen::Index>(count)) =
      (-2.0f * Eigen::Map<const Eigen::ArrayXf>(u, static_cast<Eigen::Index>(count)).log()).sqrt();
}

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
