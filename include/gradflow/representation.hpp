// Representation figures of a residual state: token similarity (rank collapse), effective rank and
// the angular distance between states. Pure functions of the stored states (metrics.md).
#pragma once
#include <Eigen/Core>
#include <cstddef>
#include <vector>

#include "gradflow/ops.hpp"

namespace gradflow {

// The tokens of a state as rows, streams concatenated per token: (T, streams * d), in double.
template <typename Scalar>
inline Eigen::MatrixXd token_rows(const std::vector<Mat<Scalar>>& state, std::size_t streams) {
  const Eigen::Index tokens = state.front().rows(), width = state.front().cols();
  Eigen::MatrixXd rows(tokens, static_cast<Eigen::Index>(streams) * width);
  for (std::size_t s = 0; s < streams; ++s)
    rows.middleCols(s * width, width) = state[s].template cast<double>();
  return rows;
}

// Rows scaled to unit norm (zero rows stay zero).
Eigen::MatrixXd unit_rows(Eigen::MatrixXd rows);
// Mean over tokens of arccos(cos(a[t], b[t])) / pi, from unit rows (metrics.md `angle`).
double mean_angular_distance(const Eigen::MatrixXd& unit_a, const Eigen::MatrixXd& unit_b);
// Mean pairwise cosine between distinct token rows; NaN for a single token (metrics.md `token_cos`).
double mean_token_cosine(const Eigen::MatrixXd& unit);
// Effective rank exp(H(p)), p_i = s_i / sum s over the singular values of the rows (metrics.md `erank`).
double effective_rank(const Eigen::MatrixXd& rows);

}  // namespace gradflow
