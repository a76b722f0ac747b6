// Test helpers: seeded random matrices and central-difference checks of backward functions.
#pragma once
#include <doctest/doctest.h>

#include <functional>
#include <random>

#include "gradflow/ops.hpp"

namespace gradflow::testing {

using MatD = Mat<double>;

inline MatD random_matrix(Eigen::Index rows, Eigen::Index cols, unsigned seed, double scale = 1.0) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal(0.0, scale);
  MatD m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(engine);
  return m;
}

// Relative error ||fd - analytic|| / ||analytic|| of a backward, probed with `probes` random
// cotangents stacked as in the engine. forward: x (T, n) -> y (T, m); backward: (x, dy (K*T, m))
// -> dx (K*T, n). Central differences of <dy_k, forward(x)> with step h.
inline double backward_relative_error(const MatD& x, const std::function<MatD(const MatD&)>& forward,
                                      const std::function<MatD(const MatD&, const MatD&)>& backward,
                                      int probes = 2, double h = 1e-6, unsigned seed = 7) {
  const MatD y = forward(x);
  const Eigen::Index tokens = x.rows();
  const MatD cotangent = random_matrix(probes * tokens, y.cols(), seed);
  const MatD analytic = backward(x, cotangent);
  MatD numeric = MatD::Zero(analytic.rows(), analytic.cols());
  MatD shifted = x;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      shifted(i, j) = x(i, j) + h;
      const MatD up = forward(shifted);
      shifted(i, j) = x(i, j) - h;
      const MatD down = forward(shifted);
      shifted(i, j) = x(i, j);
      for (int k = 0; k < probes; ++k) {
        numeric(k * tokens + i, j) =
            (cotangent.middleRows(k * tokens, tokens).cwiseProduct(up - down)).sum() / (2 * h);
      }
    }
  }
  const double error = (numeric - analytic).norm() / analytic.norm();
  MESSAGE("op backward vs central differences, relative error ", error);
  return error;
}

// Relative error of a Jacobian-vector product against central differences along `tangents`
// random directions stacked as in the engine: jvp (x, dx (P*T, n)) -> dy (P*T, m).
inline double jvp_relative_error(const MatD& x, const std::function<MatD(const MatD&)>& forward,
                                 const std::function<MatD(const MatD&, const MatD&)>& jvp, int tangents = 2,
                                 double h = 1e-6, unsigned seed = 9) {
  const Eigen::Index tokens = x.rows();
  const MatD directions = random_matrix(tangents * tokens, x.cols(), seed);
  const MatD analytic = jvp(x, directions);
  MatD numeric(analytic.rows(), analytic.cols());
  for (int k = 0; k < tangents; ++k) {
    const MatD v = directions.middleRows(k * tokens, tokens);
    numeric.middleRows(k * tokens, tokens) = (forward(x + h * v) - forward(x - h * v)) / (2 * h);
  }
  return (numeric - analytic).norm() / analytic.norm();
}

// The acceptance bound of issue 2: float64 backward against central differences.
inline constexpr double kFiniteDifferenceTolerance = 1e-6;

}  // namespace gradflow::testing
