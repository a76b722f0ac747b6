// mix_fractions: central differences and the map's defining properties.
#include <doctest/doctest.h>

#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
// m = 3 weights with zeros, a repeated input fraction and a non-square pattern of sources.
const std::vector<double> kWeights = {0.5, 0.0, -2.0,  //
                                      0.0, 0.0, 1.0,   //
                                      1.5, 3.0, 0.0};
}  // namespace

TEST_CASE("mix_fractions_backward matches central differences") {
  const MatD x = random_matrix(4, 12, 11);
  const auto forward = [&](const MatD& in) {
    MatD y;
    mix_fractions_forward(3, kWeights, in, y);
    return y;
  };
  const auto backward = [&](const MatD&, const MatD& dy) {
    MatD dx = MatD::Zero(dy.rows(), dy.cols());
    mix_fractions_backward(3, kWeights, dy, dx);
    return dx;
  };
  CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
}

TEST_CASE("mix_fractions maps each output fraction to its weighted input fractions, and adds in backward") {
  const MatD x = random_matrix(3, 12, 12);
  MatD y;
  mix_fractions_forward(3, kWeights, x, y);
  const auto fraction = [](const MatD& m, int f) { return MatD(m.middleCols(f * 4, 4)); };
  CHECK((fraction(y, 0) - (0.5 * fraction(x, 0) - 2.0 * fraction(x, 2))).norm() == 0.0);
  CHECK(fraction(y, 1) == fraction(x, 2));  // a gather: exactly the source fraction
  CHECK((fraction(y, 2) - (1.5 * fraction(x, 0) + 3.0 * fraction(x, 1))).norm() == 0.0);
  // One fraction is the identity, bit for bit.
  MatD same;
  mix_fractions_forward(1, {1.0}, x, same);
  CHECK(same == x);
  // The backward adds the transpose into what dx holds already.
  const MatD dy = random_matrix(6, 12, 13), start = random_matrix(6, 12, 14);
  MatD dx = start;
  mix_fractions_backward(3, kWeights, dy, dx);
  MatD transposed = MatD::Zero(6, 12);
  for (int in = 0; in < 3; ++in)
    for (int out = 0; out < 3; ++out)
      transposed.middleCols(in * 4, 4) += kWeights[out * 3 + in] * dy.middleCols(out * 4, 4);
  CHECK((dx - start - transposed).norm() <= 1e-14 * transposed.norm());
}
