// Sums and logs the figure modules share: squared norms in double (lane_sum's fixed order), the
// log of a probe-RMS, the divergence test.
#pragma once
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "gradflow/lane_sum.hpp"
#include "gradflow/ops.hpp"

namespace gradflow {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kLn10 = 2.302585092994046;

template <typename Scalar>
double squared_norm(const Scalar* data, Eigen::Index count) {
  return lane_sum(
      count, [data](Eigen::Index i) { return static_cast<double>(data[i]) * static_cast<double>(data[i]); });
}
// sum_i (a_i - b_i)^2 in double (the difference in Scalar).
template <typename Scalar>
double squared_distance(const Scalar* a, const Scalar* b, Eigen::Index count) {
  return lane_sum(count, [a, b](Eigen::Index i) {
    const auto difference = static_cast<double>(a[i] - b[i]);
    return difference * difference;
  });
}
template <typename Scalar>
double squared_norm(const Mat<Scalar>& m) {
  return squared_norm(m.data(), m.size());
}
// Population variance (ddof 0) over every entry of m, in double: numpy's np.var of the flattened
// tensor, as Admin's profiling takes it.
template <typename Scalar>
double population_variance(const Mat<Scalar>& m) {
  const double mean = m.template cast<double>().mean();
  return squared_norm(m) / static_cast<double>(m.size()) - mean * mean;
}
// Whether every entry of the state is finite, given each stream's sum of squares in double.
template <typename Scalar>
bool all_finite(const std::vector<Mat<Scalar>>& state, const std::vector<double>& stream_squares) {
  if constexpr (std::is_same_v<Scalar, float>) {
    // A float's square cannot overflow a double (< 2^256), so the sum of squares is finite exactly
    // when every entry is: no second pass (Eigen's allFinite costs about 1 ns an entry).
    return std::all_of(stream_squares.begin(), stream_squares.end(),
                       [](double v) { return std::isfinite(v); });
  } else {  // a double's square can overflow: look at the entries
    return std::all_of(state.begin(), state.end(), [](const Mat<Scalar>& m) { return m.allFinite(); });
  }
}
// Squared norm of probe k's rows (k*T .. k*T+T) of one cotangent.
template <typename Scalar>
double probe_squared_norm(const Mat<Scalar>& cotangent, int probe, int tokens) {
  return squared_norm(cotangent.data() + static_cast<Eigen::Index>(probe) * tokens * cotangent.cols(),
                      static_cast<Eigen::Index>(tokens) * cotangent.cols());
}

// log(sqrt(mean_k exp(2 a_k))): the log of a probe-RMS from per-probe logs, without overflow.
inline double log_rms(const std::vector<double>& log_values) {
  double top = -std::numeric_limits<double>::infinity();
  for (double v : log_values) top = std::max(top, v);
  if (!std::isfinite(top)) return top;
  double sum = 0;
  for (double v : log_values) sum += std::exp(2.0 * (v - top));
  return top + 0.5 * std::log(sum / static_cast<double>(log_values.size()));
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace gradflow
