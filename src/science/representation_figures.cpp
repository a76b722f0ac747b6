// Representation figures, pure functions of the stored states (metrics.md): token_cos and erank
// per state, angle and block_influence per sublayer, and with --angles all the matrix of angles
// between every pair of states.
#include "gradflow/representation.hpp"
#include "seed_analysis.hpp"
#include "sums.hpp"

namespace gradflow {

namespace {
// angle and block influence of sublayer l: angular distance as in Gromov et al. 2024
// (arXiv 2403.17887), block influence as in ShortGPT (Men et al. 2024, arXiv 2403.03853).
void record_angle(SeedResult& result, int l, const Eigen::MatrixXd& before, const Eigen::MatrixXd& after) {
  result.sublayers.at(Figure::angle)[l] = mean_angular_distance(before, after);
  result.sublayers.at(Figure::block_influence)[l] = 1.0 - (before.cwiseProduct(after).rowwise().sum()).mean();
}
// The same over the streams both states have (rare: the stream count changes).
template <typename Scalar>
void record_angle(SeedResult& result, int l, const std::vector<State<Scalar>>& states) {
  const std::size_t streams = std::min(states[l].size(), states[l + 1].size());
  record_angle(result, l, unit_rows(token_rows(states[l], streams)),
               unit_rows(token_rows(states[l + 1], streams)));
}
}  // namespace

// token_cos and erank of states 0..last (the forward's last finite state) and the angles of the
// sublayers between them, a block of kStateBlock consecutive states per piece of the pool. Each
// piece walks up its block so that every state's unit rows are computed once and serve both
// angles that touch it (the state below the block's first is computed again by its piece).
constexpr int kStateBlock = 32;

template <typename Scalar>
void compute_representation(SeedAnalysis<Scalar>& analysis) {
  const auto start = std::chrono::steady_clock::now();
  const auto& states = analysis.run.states();
  SeedResult& result = analysis.result;
  auto& token_cos = result.states.at(Figure::token_cos);
  auto& erank = result.states.at(Figure::erank);
  const int count = analysis.last_state + 1, blocks = (count + kStateBlock - 1) / kStateBlock;
  for_each_piece(analysis.run.pool(), blocks, [&](int block) {
    const int begin = block * kStateBlock, end = std::min(count, begin + kStateBlock);
    Eigen::MatrixXd unit_below;
    if (begin > 0) unit_below = unit_rows(token_rows(states[begin - 1], states[begin - 1].size()));
    for (int l = begin; l < end; ++l) {
      const Eigen::MatrixXd rows = token_rows(states[l], states[l].size());
      Eigen::MatrixXd unit = unit_rows(rows);
      token_cos[l] = mean_token_cosine(unit);
      erank[l] = effective_rank(rows);
      if (l > 0) {
        if (states[l - 1].size() == states[l].size()) {
          record_angle(result, l - 1, unit_below, unit);
        } else {
          record_angle(result, l - 1, states);
        }
      }
      unit_below = std::move(unit);
    }
  });
  result.representation_seconds += seconds_since(start);
}

// --angles all: every pair of states, over the streams both have.
template <typename Scalar>
void compute_angles_matrix(SeedAnalysis<Scalar>& analysis) {
  const auto& states = analysis.run.states();
  const int count = analysis.run.sublayers() + 1;
  std::size_t min_streams = states[0].size(), max_streams = states[0].size();
  for (const auto& state : states) {
    min_streams = std::min(min_streams, state.size());
    max_streams = std::max(max_streams, state.size());
  }
  auto& matrix = analysis.result.angles_matrix;
  matrix.assign(count, std::vector<double>(count, 0.0));
  std::vector<Eigen::MatrixXd> unit(count);
  for (int i = 0; i < count; ++i) unit[i] = unit_rows(token_rows(states[i], min_streams));
  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count; ++j) {
      double value;
      if (min_streams == max_streams) {
        value = mean_angular_distance(unit[i], unit[j]);
      } else {  // rare: the state widths differ; compare the streams both states have
        const std::size_t common = std::min(states[i].size(), states[j].size());
        value = mean_angular_distance(unit_rows(token_rows(states[i], common)),
                                      unit_rows(token_rows(states[j], common)));
      }
      matrix[i][j] = matrix[j][i] = value;
    }
  }
}

template void compute_representation(SeedAnalysis<float>&);
template void compute_representation(SeedAnalysis<double>&);
template void compute_angles_matrix(SeedAnalysis<float>&);
template void compute_angles_matrix(SeedAnalysis<double>&);

}  // namespace gradflow
