// GELU, the FFN and the idealised rotation branch: central differences and properties.
#include <doctest/doctest.h>

#include <cmath>

#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

TEST_CASE("gelu_backward matches central differences, in the erf form and the tanh approximation") {
  const MatD x = random_matrix(4, 6, 11, 2.0);
  for (const bool tanh_form : {false, true}) {
    CAPTURE(tanh_form);
    const auto forward = [&](const MatD& in) {
      MatD y;
      gelu_forward(in, y, tanh_form);
      return y;
    };
    const auto backward = [&](const MatD& in, const MatD& dy) {
      MatD dx = MatD::Zero(dy.rows(), dy.cols());
      gelu_backward(in, dy, dx, tanh_form);
      return dx;
    };
    CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
  }
}

TEST_CASE("gelu's two forms give torch's values: F.gelu(x) and F.gelu(x, approximate='tanh')") {
  MatD x(1, 5);
  x << -3.0, -1.0, 0.5, 1.0, 2.5;
  // torch 1.13, float64: torch.nn.functional.gelu(x) and gelu(x, approximate="tanh")
  MatD erf_form(1, 5), tanh_form(1, 5);
  erf_form << -0.00404969409489031, -0.15865525393145702, 0.34573123063700656, 0.841344746068543,
      2.4844758366855597;
  tanh_form << -0.0036373920817729943, -0.15880800939172324, 0.34571400982514394, 0.8411919906082768,
      2.484915733910001;
  MatD y;
  gelu_forward(x, y, false);
  CHECK((y - erf_form).cwiseAbs().maxCoeff() <= 1e-15);
  gelu_forward(x, y, true);
  CHECK((y - tanh_form).cwiseAbs().maxCoeff() <= 1e-15);
}

TEST_CASE("ffn_backward matches central differences, and its parameter gradient too") {
  const int d = 6;
  // 1: the plain FFN; sqrt(d): nGPT's s_uv on the hidden pre-activation.
  for (const double hidden_scale : {1.0, std::sqrt(static_cast<double>(d))}) {
    CAPTURE(hidden_scale);
    const FfnOptions options{hidden_scale};
    SublayerWeights<double> w;
    w.resize(ffn_weight_count(FfnKind::gelu));
    w.matrices[kWeightUp] = random_matrix(d, 4 * d, 12, 0.4);
    w.matrices[kWeightDown] = random_matrix(4 * d, d, 13, 0.2);
    const MatD x = random_matrix(5, d, 14);
    const auto forward = [&](const MatD& in) {
      FfnCache<double> cache;
      MatD out;
      ffn_forward(in, w, options, cache, out);
      return out;
    };
    const auto backward = [&](const MatD& in, const MatD& dy) {
      FfnCache<double> cache;
      MatD out, dx = MatD::Zero(dy.rows(), dy.cols());
      ffn_forward(in, w, options, cache, out);
      ffn_backward(in, w, options, cache, dy, &dx);
      return dx;
    };
    CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);

    // dL/dW by central differences on one probe; ParamGradSquares holds |dW_1|^2 + |dW_2|^2.
    const MatD dy = random_matrix(5, d, 15);
    FfnCache<double> cache;
    MatD out, dx = MatD::Zero(5, d);
    ffn_forward(x, w, options, cache, out);
    ParamGradSquares squares;
    ffn_backward(x, w, options, cache, dy, &dx, &squares);
    double numeric = 0;
    const double h = 1e-6;
    for (auto* matrix : {&w.matrices[kWeightUp], &w.matrices[kWeightDown]}) {
      for_each_central_difference(
          matrix->data(), matrix->size(), h, [&] { return dy.cwiseProduct(forward(x)).sum(); },
          [&](Eigen::Index, double up, double down) { numeric += std::pow((up - down) / (2 * h), 2); });
    }
    REQUIRE(squares.size() == 1);
    CHECK(std::abs(std::sqrt(squares[0]) - std::sqrt(numeric)) <=
          kFiniteDifferenceTolerance * std::sqrt(numeric));
  }
}

TEST_CASE("ffn hidden scale s: the output is that of W_1 scaled by s, the gradient of W_1 is not") {
  const int d = 4;
  const double hidden_scale = 2.0;  // nGPT's s_uv = sqrt(d)
  SublayerWeights<double> w, scaled;
  w.resize(ffn_weight_count(FfnKind::gelu));
  scaled.resize(ffn_weight_count(FfnKind::gelu));
  w.matrices[kWeightUp] = random_matrix(d, 4 * d, 21, 0.4);
  w.matrices[kWeightDown] = random_matrix(4 * d, d, 22, 0.2);
  scaled.matrices[kWeightUp] = hidden_scale * w.matrices[kWeightUp];
  scaled.matrices[kWeightDown] = w.matrices[kWeightDown];
  const MatD x = random_matrix(3, d, 23), dy = random_matrix(3, d, 24);
  FfnCache<double> cache, scaled_cache;
  MatD out, scaled_out, dx = MatD::Zero(3, d), scaled_dx = MatD::Zero(3, d);
  ffn_forward(x, w, FfnOptions{hidden_scale}, cache, out);
  ffn_forward(x, scaled, FfnOptions{}, scaled_cache, scaled_out);
  CHECK((out - scaled_out).norm() <= 1e-14 * out.norm());
  ParamGradSquares squares, scaled_squares;
  ffn_backward(x, w, FfnOptions{hidden_scale}, cache, dy, &dx, &squares);
  ffn_backward(x, scaled, FfnOptions{}, scaled_cache, dy, &scaled_dx, &scaled_squares);
  CHECK((dx - scaled_dx).norm() <= 1e-14 * dx.norm());
  // dL/dW_1 = s x^T dL/d(s x W_1), s times the scaled weight's gradient x^T dL/d(x sW_1), while
  // dL/dW_2 is the same: the squares differ by (s^2 - 1) |x^T dL/d(x sW_1)|^2.
  const MatD d_hidden = dy * w.matrices[kWeightDown].transpose();
  MatD d_pre = MatD::Zero(3, 4 * d);
  gelu_backward(scaled_cache.hidden_pre, d_hidden, d_pre);
  const double scaled_w1_squares = (x.transpose() * d_pre).squaredNorm();
  CHECK(squares[0] - scaled_squares[0] ==
        doctest::Approx((hidden_scale * hidden_scale - 1) * scaled_w1_squares).epsilon(1e-12));
}

TEST_CASE("rotation branch: as large as its input, orthogonal to it, and its backward is the transpose") {
  const MatD x = random_matrix(3, 8, 16);
  MatD y;
  rotation_forward(x, y);
  for (Eigen::Index t = 0; t < 3; ++t) {
    CHECK(y.row(t).norm() == doctest::Approx(x.row(t).norm()));
    CHECK(std::abs(y.row(t).dot(x.row(t))) < 1e-12);
  }
  const auto forward = [](const MatD& in) {
    MatD out;
    rotation_forward(in, out);
    return out;
  };
  const auto backward = [](const MatD&, const MatD& dy) {
    MatD dx = MatD::Zero(dy.rows(), dy.cols());
    rotation_backward(dy, dx);
    return dx;
  };
  CHECK(backward_relative_error(x, forward, backward) <= kFiniteDifferenceTolerance);
}

TEST_CASE("ffn_jvp matches central differences") {
  const int d = 6;
  for (const double hidden_scale : {1.0, std::sqrt(static_cast<double>(d))}) {
    CAPTURE(hidden_scale);
    const FfnOptions options{hidden_scale};
    SublayerWeights<double> w;
    w.resize(ffn_weight_count(FfnKind::gelu));
    w.matrices[kWeightUp] = random_matrix(d, 4 * d, 52, 0.4);
    w.matrices[kWeightDown] = random_matrix(4 * d, d, 53, 0.2);
    const MatD x = random_matrix(5, d, 54);
    const auto forward = [&](const MatD& in) {
      FfnCache<double> cache;
      MatD out;
      ffn_forward(in, w, options, cache, out);
      return out;
    };
    const auto jvp = [&](const MatD& in, const MatD& dx) {
      FfnCache<double> cache;
      MatD out, dy;
      ffn_forward(in, w, options, cache, out);
      ffn_jvp(in, w, options, cache, dx, dy);
      return dy;
    };
    CHECK(jvp_relative_error(x, forward, jvp) <= kFiniteDifferenceTolerance);
  }
}
