// Representation figures: token similarity, effective rank, angular distance.
#include "gradflow/representation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "gradflow/gemm.hpp"
#include "gradflow/symmetric_eigenvalues.hpp"

namespace gradflow {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

// Rows scaled to unit norm (zero rows stay zero). The rows of a column-major matrix are strided,
// so the norms come from one vectorised pass down the columns rather than row by row.
Eigen::MatrixXd unit_rows(Eigen::MatrixXd rows) {
  const Eigen::ArrayXd norms = rows.rowwise().norm().array();
  rows.array().colwise() /= (norms > 0).select(norms, 1.0);
  return rows;
}

// Mean over tokens of arccos(cos(a[t], b[t])) / pi, from unit rows (metrics.md `angle`).
double mean_angular_distance(const Eigen::MatrixXd& unit_a, const Eigen::MatrixXd& unit_b) {
  // 2 atan2(|u - v|, |u + v|) equals arccos(u . v) for unit u, v, but stays accurate near 0 and pi
  // (Kahan, "How futile are mindless assessments of roundoff", 2006): identical rows give exactly
  // 0 instead of arccos's amplified rounding noise (~1e-10).
  const Eigen::VectorXd difference = (unit_a - unit_b).rowwise().norm();
  const Eigen::VectorXd sum_norm = (unit_a + unit_b).rowwise().norm();
  double sum = 0;
  for (Eigen::Index t = 0; t < unit_a.rows(); ++t) sum += 2.0 * std::atan2(difference[t], sum_norm[t]);
  return sum / (std::numbers::pi * static_cast<double>(unit_a.rows()));
}

// Mean pairwise cosine between distinct token rows: (norm(sum_t u_t)^2 - T) / (T (T - 1)) for
// unit rows u_t; NaN for a single token.
double mean_token_cosine(const Eigen::MatrixXd& unit) {
  const double tokens = static_cast<double>(unit.rows());
  if (tokens < 2) return kNaN;
  return (unit.colwise().sum().squaredNorm() - tokens) / (tokens * (tokens - 1));
}

// Effective rank exp(H(p)), p_i = s_i / sum s over the singular values s of x (Roy & Vetterli
// 2007, "The effective rank: a measure of effective dimensionality"); the s_i come from the
// eigenvalues of the smaller Gram matrix.
double effective_rank(const Eigen::MatrixXd& rows) {
  // The lower triangle only (half the products); the eigensolver reads no more.
  Eigen::MatrixXd gram;
  if (rows.rows() <= rows.cols() && kernel_choice().tiled_double_gram) {  // each entry one in-order sum
    gram.resize(rows.rows(), rows.rows());
    gram_lower_f64(rows.data(), rows.outerStride(), gram.data(), gram.outerStride(), rows.rows(),
                   rows.cols());
  } else if (rows.rows() <= rows.cols()) {
    gram.setZero(rows.rows(), rows.rows());
    gram.selfadjointView<Eigen::Lower>().rankUpdate(rows);
  } else {
    gram.setZero(rows.cols(), rows.cols());
    gram.selfadjointView<Eigen::Lower>().rankUpdate(rows.transpose());
  }
  Eigen::VectorXd eigenvalues;
  if (!gram.allFinite() || !symmetric_eigenvalues(gram, eigenvalues)) return kNaN;
  const Eigen::ArrayXd singular = eigenvalues.array().max(0.0).sqrt();
  const double total = singular.sum();
  if (!(total > 0)) return kNaN;
  double entropy = 0;
  for (const double s : singular) {
    if (s > 0) entropy -= (s / total) * std::log(s / total);
  }
  return std::exp(entropy);
}

}  // namespace gradflow
