// Line fits, growth classes and across-seed spreads.
#include "gradflow/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gradflow {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  double sx = 0, sy = 0;
  int n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isfinite(x[i]) && std::isfinite(y[i])) sx += x[i], sy += y[i], ++n;
  }
  LineFit fit{kNaN, kNaN, kNaN, n};
  if (n < 2) return fit;
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isfinite(x[i]) && std::isfinite(y[i]))
      sxx += (x[i] - mx) * (x[i] - mx), sxy += (x[i] - mx) * (y[i] - my);
  }
  if (sxx <= 0) return fit;
  fit.slope = sxy / sxx;
  fit.intercept = my - fit.slope * mx;
  if (n >= 3) {
    double residuals = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
      const double r = y[i] - fit.intercept - fit.slope * x[i];
      residuals += r * r;
    }
    fit.slope_standard_error = std::sqrt(residuals / (n - 2) / sxx);
  }
  return fit;
}

std::string_view growth_class(double exponent) {
  if (!std::isfinite(exponent)) return "undetermined";
  if (exponent < -0.35) return "vanishing";
  if (exponent < 0.15) return "bounded";
  if (exponent >= 0.35 && exponent <= 0.65) return "sqrt";
  if (exponent >= 0.85 && exponent <= 1.15) return "linear";
  return "other";
}

GrowthFit fit_growth(const std::vector<double>& rms_by_state) {
  const int top = static_cast<int>(rms_by_state.size()) - 1;
  const int first = std::max(1, static_cast<int>(std::ceil(top / 8.0)));
  std::vector<double> log_l, log_rms;
  for (int l = first; l <= top; ++l) {
    log_l.push_back(std::log(static_cast<double>(l)));
    log_rms.push_back(rms_by_state[l] > 0 ? std::log(rms_by_state[l]) : kNaN);
  }
  const LineFit line = fit_line(log_l, log_rms);
  // A stream that reaches exact zero in the fitted range has collapsed, whatever its fit says.
  const bool collapsed =
      std::any_of(rms_by_state.begin() + first, rms_by_state.end(), [](double r) { return r == 0; });
  return {line.slope, line.slope_standard_error, first, line.points,
          collapsed ? std::string_view("vanishing") : growth_class(line.slope)};
}

double student_t_975(int degrees_of_freedom) {
  static constexpr double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                      2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                      2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (degrees_of_freedom < 1) return kNaN;
  if (degrees_of_freedom <= 30) return kTable[degrees_of_freedom - 1];
  return 1.959964 + 2.4 / degrees_of_freedom;  // within 0.003 of the exact quantile beyond 30
}

Spread spread(const std::vector<double>& samples) {
  const int n = static_cast<int>(samples.size());
  double sum = 0;
  for (double v : samples) sum += v;
  Spread result{n > 0 ? sum / n : kNaN, kNaN, kNaN, kNaN};
  if (n < 2 || !std::isfinite(result.mean)) return result;
  double squares = 0;
  for (double v : samples) squares += (v - result.mean) * (v - result.mean);
  result.std = std::sqrt(squares / (n - 1));
  const double half_width = student_t_975(n - 1) * result.std / std::sqrt(static_cast<double>(n));
  result.ci95_low = result.mean - half_width;
  result.ci95_high = result.mean + half_width;
  return result;
}

}  // namespace gradflow
