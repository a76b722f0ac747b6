// Line fits, growth classes and spreads.
#include "gradflow/statistics.hpp"

#include <doctest/doctest.h>

#include <cmath>

using namespace gradflow;

TEST_CASE("fit_growth classes a stream that reaches exact zero as vanishing") {
  std::vector<double> rms(65, 0.0);
  for (int l = 0; l < 30; ++l) rms[l] = std::pow(0.5, l);
  CHECK(fit_growth(rms).growth_class == "vanishing");
}

TEST_CASE("fit_growth recovers exact power laws over l >= S/8") {
  for (const double p : {0.0, 0.5, 1.0}) {
    std::vector<double> rms(257);
    for (int l = 0; l <= 256; ++l) rms[l] = 3.0 * std::pow(std::max(l, 1), p);
    const GrowthFit fit = fit_growth(rms);
    CHECK(fit.exponent == doctest::Approx(p).epsilon(1e-12));
    CHECK(fit.first_state == 32);
    CHECK(fit.points == 225);
  }
  CHECK(growth_class(0.1) == "bounded");
  CHECK(growth_class(-0.3) == "bounded");    // deepscalelm's slow drift (about -0.23 at B = 256)
  CHECK(growth_class(-0.5) == "vanishing");  // a collapsing stream is not bounded
  CHECK(growth_class(-26.8) == "vanishing");
  CHECK(growth_class(0.5) == "sqrt");
  CHECK(growth_class(1.0) == "linear");
  CHECK(growth_class(0.75) == "other");
}

TEST_CASE("fit_line's standard error matches the textbook formula") {
  const std::vector<double> x = {1, 2, 3, 4}, y = {1.0, 2.1, 2.9, 4.2};
  const LineFit fit = fit_line(x, y);
  CHECK(fit.slope == doctest::Approx(1.04));
  // Residuals 0.01, 0.07, -0.17, 0.09 (sum of squares 0.042), n - 2 = 2, Sxx = 5.
  CHECK(fit.slope_standard_error == doctest::Approx(std::sqrt(0.042 / 2 / 5.0)));
}

TEST_CASE("spread gives mean, sample std and the t-interval") {
  const Spread s = spread({1.0, 2.0, 3.0});
  CHECK(s.mean == doctest::Approx(2.0));
  CHECK(s.std == doctest::Approx(1.0));
  CHECK(s.ci95_high - s.mean == doctest::Approx(4.303 / std::sqrt(3.0)));
  CHECK(std::isnan(spread({1.0}).std));
}
