// Sums in double of float or double terms, vectorised and in a fixed order.
#pragma once
#include <Eigen/Core>

namespace gradflow {

// sum_i term(i) in double, in eight interleaved partial sums (one SIMD register) added in a fixed
// order: vectorised (a single running sum would wait on every add), and the same bits wherever
// the data sits in memory.
template <typename Term>
double lane_sum(Eigen::Index count, Term&& term) {
  constexpr int kLanes = 8;
  double lanes[kLanes] = {};
  Eigen::Index i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += term(i + j);
  }
  for (; i < count; ++i) lanes[0] += term(i);
  double sum = 0;
  for (const double lane : lanes) sum += lane;
  return sum;
}

// sum_i a_i b_i in double.
template <typename Scalar>
double lane_dot(const Scalar* a, const Scalar* b, Eigen::Index count) {
  return lane_sum(count,
                  [a, b](Eigen::Index i) { return static_cast<double>(a[i]) * static_cast<double>(b[i]); });
}

// <a, b> in double over two equally shaped row-major blocks (rows may be strided).
template <typename BlockA, typename BlockB>
double row_major_dot(const BlockA& a, const BlockB& b) {
  double sum = 0;
  for (Eigen::Index r = 0; r < a.rows(); ++r) sum += lane_dot(&a.coeffRef(r, 0), &b.coeffRef(r, 0), a.cols());
  return sum;
}

}  // namespace gradflow
