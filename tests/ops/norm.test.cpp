// Normalisation ops: central differences and defining properties.
#include <doctest/doctest.h>

#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

TEST_CASE("norm_backward matches central differences for every norm kind and grouping") {
  const MatD x = random_matrix(5, 12, 1, 1.5);
  for (const NormKind kind : {NormKind::rms, NormKind::layer, NormKind::dyt}) {
    for (const int groups : {1, 3}) {
      CAPTURE(to_string(kind));
      CAPTURE(groups);
      const auto forward = [&](const MatD& in) {
        MatD y, stats;
        norm_forward(kind, groups, in, y, stats);
        return y;
      };
      const auto backward = [&](const MatD& in, const MatD& dy) {
        MatD y, stats, dx = MatD::Zero(dy.rows(), dy.cols());
        norm_forward(kind, groups, in, y, stats);
        norm_backward(kind, groups, y, stats, dy, dx);
        return dx;
      };
      CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
    }
  }
}

TEST_CASE("unit_rows_backward matches central differences") {
  const MatD x = random_matrix(4, 8, 2);
  for (const int groups : {1, 2}) {
    const auto forward = [&](const MatD& in) {
      MatD y, stats;
      unit_rows_forward(groups, in, y, stats);
      return y;
    };
    const auto backward = [&](const MatD& in, const MatD& dy) {
      MatD y, stats, dx = MatD::Zero(dy.rows(), dy.cols());
      unit_rows_forward(groups, in, y, stats);
      unit_rows_backward(groups, y, stats, dy, dx);
      return dx;
    };
    CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
  }
}

TEST_CASE("RMSNorm output has unit RMS per token and LayerNorm zero mean, unit variance") {
  const MatD x = random_matrix(6, 32, 3, 4.0);
  MatD y, stats;
  norm_forward(NormKind::rms, 1, x, y, stats);
  for (Eigen::Index t = 0; t < y.rows(); ++t)
    CHECK(std::sqrt(y.row(t).squaredNorm() / 32) == doctest::Approx(1.0).epsilon(1e-6));
  norm_forward(NormKind::layer, 1, x, y, stats);
  for (Eigen::Index t = 0; t < y.rows(); ++t) {
    CHECK(y.row(t).mean() == doctest::Approx(0.0).epsilon(1e-12));
    CHECK(y.row(t).squaredNorm() / 32 == doctest::Approx(1.0).epsilon(1e-6));
  }
}

TEST_CASE("the norm's Jacobian removes the radial direction (scale invariance)") {
  // N(c x) = N(x) for RMSNorm up to eps, so dN/dx . x = 0: the backward is orthogonal to x.
  const MatD x = random_matrix(3, 16, 4);
  MatD y, stats, dx = MatD::Zero(3, 16);
  norm_forward(NormKind::rms, 1, x, y, stats);
  norm_backward(NormKind::rms, 1, y, stats, random_matrix(3, 16, 5), dx);
  for (Eigen::Index t = 0; t < 3; ++t)
    CHECK(std::abs(dx.row(t).dot(x.row(t))) < 1e-5 * dx.row(t).norm() * x.row(t).norm());
}
