// mix_fractions: a fixed linear map of a row's width fractions (ops.hpp; Frac-Connections, arXiv
// 2503.14125).
#include <stdexcept>

#include "gradflow/ops.hpp"

namespace gradflow {

namespace {
void check_fractions(int fractions, const std::vector<double>& weights, Eigen::Index columns) {
  if (fractions < 1 || columns % fractions != 0 ||
      weights.size() != static_cast<std::size_t>(fractions) * static_cast<std::size_t>(fractions))
    throw std::logic_error("mix_fractions: the fraction count must divide the width and weigh m x m pairs");
}
}  // namespace

template <typename Scalar>
void mix_fractions_forward(int fractions, const std::vector<double>& weights, const Mat<Scalar>& x,
                           Mat<Scalar>& y) {
  check_fractions(fractions, weights, x.cols());
  const Eigen::Index width = x.cols() / fractions;
  y.setZero(x.rows(), x.cols());
  for (int out = 0; out < fractions; ++out) {
    for (int in = 0; in < fractions; ++in) {
      const double weight = weights[static_cast<std::size_t>(out) * fractions + in];
      if (weight == 0.0) continue;
      y.middleCols(out * width, width) += static_cast<Scalar>(weight) * x.middleCols(in * width, width);
    }
  }
}

template <typename Scalar>
void mix_fractions_backward(int fractions, const std::vector<double>& weights, const Mat<Scalar>& dy,
                            Mat<Scalar>& dx) {
  check_fractions(fractions, weights, dy.cols());
  const Eigen::Index width = dy.cols() / fractions;
  for (int in = 0; in < fractions; ++in) {
    for (int out = 0; out < fractions; ++out) {
      const double weight = weights[static_cast<std::size_t>(out) * fractions + in];
      if (weight == 0.0) continue;
      dx.middleCols(in * width, width) += static_cast<Scalar>(weight) * dy.middleCols(out * width, width);
    }
  }
}

template void mix_fractions_forward<float>(int, const std::vector<double>&, const Mat<float>&, Mat<float>&);
template void mix_fractions_forward<double>(int, const std::vector<double>&, const Mat<double>&,
                                            Mat<double>&);
template void mix_fractions_backward<float>(int, const std::vector<double>&, const Mat<float>&, Mat<float>&);
template void mix_fractions_backward<double>(int, const std::vector<double>&, const Mat<double>&,
                                             Mat<double>&);

}  // namespace gradflow
