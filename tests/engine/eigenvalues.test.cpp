// symmetric_eigenvalues (LAPACK's dsterf behind erank) against Eigen's SelfAdjointEigenSolver.
#include <doctest/doctest.h>

#include <Eigen/Eigenvalues>
#include <cmath>
#include <limits>
#include <random>

#include "gradflow/symmetric_eigenvalues.hpp"

using Eigen::Index;
using Eigen::MatrixXd;
using Eigen::VectorXd;

namespace {
MatrixXd gaussian(Index rows, Index cols, std::mt19937_64& engine) {
  std::normal_distribution<double> normal;
  MatrixXd m(rows, cols);
  for (Index j = 0; j < cols; ++j)
    for (Index i = 0; i < rows; ++i) m(i, j) = normal(engine);
  return m;
}

// Largest eigenvalue error relative to the largest eigenvalue magnitude; the upper triangle is
// poisoned with NaN to show that it is never read.
double relative_error(const MatrixXd& a) {
  const VectorXd expected = Eigen::SelfAdjointEigenSolver<MatrixXd>(a, Eigen::EigenvaluesOnly).eigenvalues();
  MatrixXd work = a;
  for (Index j = 1; j < work.cols(); ++j)
    work.col(j).head(j).setConstant(std::numeric_limits<double>::quiet_NaN());
  VectorXd got;
  REQUIRE(gradflow::symmetric_eigenvalues(work, got));
  REQUIRE(got.size() == expected.size());
  for (Index i = 1; i < got.size(); ++i) CHECK(got[i - 1] <= got[i]);  // ascending
  if (expected.size() == 0) return 0;
  return (got - expected).cwiseAbs().maxCoeff() /
         std::max(expected.cwiseAbs().maxCoeff(), std::numeric_limits<double>::min());
}
}  // namespace

TEST_CASE("symmetric_eigenvalues agrees with Eigen's solver on Gram matrices and edge cases") {
  std::mt19937_64 engine(20240611);
  for (const double scale : {1.0, 1e-150, 1e150}) {
    for (const Index rank : {256, 32, 1}) {  // full rank, rank-deficient, rank one
      const MatrixXd rows = gaussian(64, rank, engine) * scale;
      CAPTURE(scale);
      CAPTURE(rank);
      CHECK(relative_error(rows * rows.transpose()) <= 1e-13);
    }
  }
  const MatrixXd same_rows = MatrixXd::Ones(64, 1) * gaussian(1, 256, engine);
  CHECK(relative_error(same_rows * same_rows.transpose()) <= 1e-13);
  CHECK(relative_error(MatrixXd::Zero(64, 64)) == 0.0);
  CHECK(relative_error(MatrixXd::Identity(64, 64)) == 0.0);
  VectorXd spread(64);
  for (Index i = 0; i < 64; ++i) spread[i] = std::pow(10.0, -300.0 + 300.0 * static_cast<double>(i) / 63);
  CHECK(relative_error(spread.asDiagonal().toDenseMatrix()) == 0.0);
  // Clustered eigenvalues 1 + 1e-10 k in a random basis.
  const MatrixXd basis = Eigen::HouseholderQR<MatrixXd>(gaussian(64, 64, engine)).householderQ();
  VectorXd clustered(64);
  for (Index i = 0; i < 64; ++i) clustered[i] = 1.0 + 1e-10 * static_cast<double>(i);
  CHECK(relative_error(basis * clustered.asDiagonal() * basis.transpose()) <= 1e-13);
  for (const Index n : {1, 2, 3, 65, 200}) {
    const MatrixXd rows = gaussian(n, n + 7, engine);
    CAPTURE(n);
    CHECK(relative_error(rows * rows.transpose()) <= 1e-13);
  }
}

TEST_CASE("symmetric_eigenvalues reports a matrix it cannot reduce") {
  MatrixXd nan_matrix = MatrixXd::Identity(8, 8);
  nan_matrix(5, 2) = std::numeric_limits<double>::quiet_NaN();
  VectorXd eigenvalues;
  CHECK_FALSE(gradflow::symmetric_eigenvalues(nan_matrix, eigenvalues));
}
