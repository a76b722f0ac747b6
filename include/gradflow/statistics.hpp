// Small statistics used by the figures: line fits, growth classes, spreads across seeds.
#pragma once
#include <string_view>
#include <vector>

namespace gradflow {

struct LineFit {
  double slope = 0.0, slope_standard_error = 0.0, intercept = 0.0;
  int points = 0;
};
// Ordinary least squares of y on x over the pairs where both are finite. slope NaN below 2
// points, its standard error NaN below 3.
LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y);

// docs/metrics.md: vanishing (p < -0.35: a collapsing stream), bounded (-0.35 <= p < 0.15), sqrt
// (0.35-0.65), linear (0.85-1.15), else other; "undetermined" when the exponent could not be fitted.
std::string_view growth_class(double exponent);

struct GrowthFit {
  double exponent = 0.0, standard_error = 0.0;
  int first_state = 0;  // the fit uses states first_state..S
  int points = 0;
  std::string_view growth_class = "undetermined";
};
// Slope of log(rms_l) against log(l) over the states l >= max(1, S/8) (metrics.md).
GrowthFit fit_growth(const std::vector<double>& rms_by_state);

// Two-sided 95% quantile of Student's t with `degrees_of_freedom` (>= 1).
double student_t_975(int degrees_of_freedom);

struct Spread {
  double mean = 0.0, std = 0.0, ci95_low = 0.0, ci95_high = 0.0;
};
// Mean, sample standard deviation and the t-interval of the mean across seeds. NaN where any
// sample is non-finite; std and interval NaN for a single sample.
Spread spread(const std::vector<double>& samples);

}  // namespace gradflow
