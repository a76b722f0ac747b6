// Test helpers: seeded random matrices and the central-difference harness shared by the op tests:
// the loop that moves one entry at a time by +h and -h (for_each_central_difference), and the checks
// of backward functions and Jacobian-vector products built on it.
#pragma once
#include <doctest/doctest.h>

#include <functional>
#include <random>
#include <type_traits>

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

// The central-difference loop: for each entry e of data[0, size), data[e] is set to its value + h,
// then - h, evaluate() is called at each (it reads the buffer, e.g. through a weight matrix that
// owns it), data[e] is restored, and use(e, up, down) receives the two values (a double or an Eigen
// matrix), whose slope is (up - down) / (2 h). Every finite-difference check of the op tests goes
// through this loop.
template <typename Evaluate, typename Use>
void for_each_central_difference(double* data, Eigen::Index size, double h, const Evaluate& evaluate,
                                 const Use& use) {
  for (Eigen::Index e = 0; e < size; ++e) {
    const double saved = data[e];
    data[e] = saved + h;
    const auto up = evaluate();
    data[e] = saved - h;
    const auto down = evaluate();
    data[e] = saved;
    use(e, up, down);
  }
}

// The same loop over the entries of a matrix or vector, use(i, j, up, down) naming the entry by its
// row and column.
template <typename Matrix, typename Evaluate, typename Use>
void for_each_central_difference(Eigen::PlainObjectBase<Matrix>& m, double h, const Evaluate& evaluate,
                                 const Use& use) {
  static_assert(std::is_same_v<typename Matrix::Scalar, double>, "central differences in float64 only");
  for_each_central_difference(m.data(), m.size(), h, evaluate,
                              [&](Eigen::Index e, const auto& up, const auto& down) {
                                const Eigen::Index i = Matrix::IsRowMajor ? e / m.cols() : e % m.rows();
                                const Eigen::Index j = Matrix::IsRowMajor ? e % m.cols() : e / m.rows();
                                use(i, j, up, down);
                              });
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
  for_each_central_difference(
      shifted, h, [&] { return forward(shifted); },
      [&](Eigen::Index i, Eigen::Index j, const MatD& up, const MatD& down) {
        for (int k = 0; k < probes; ++k) {
          numeric(k * tokens + i, j) =
              (cotangent.middleRows(k * tokens, tokens).cwiseProduct(up - down)).sum() / (2 * h);
        }
      });
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
