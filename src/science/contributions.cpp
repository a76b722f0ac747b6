// Output contributions (metrics.md, output_share): c_{l,k} = <dL_k/d update_l, update_l> recorded
// during the probe backward, then the shares, their jackknife standard errors and the effective
// depth; log10_param_grad and, for additive placements, stream_decomposition on the way.
#include "contributions.hpp"

#include "seed_analysis.hpp"
#include "sums.hpp"

namespace gradflow {

template <typename Scalar>
void record_contribution(SeedAnalysis<Scalar>& analysis, int l) {
  const StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  ProbeGradients<Scalar>& probes = analysis.probes;
  const int tokens = config.seq;
  const auto& update = run.executor().value(run.graph().update_id());
  const auto& d_update = run.executor().cotangent(run.graph().update_id());
  if (probes.log_contribution.empty())
    probes.log_contribution.assign(static_cast<std::size_t>(run.sublayers()) * config.probes, kNaN);
  for (int k = 0; k < config.probes; ++k) {
    // The cotangent is probe k's dL/d update divided by exp(log_scale[k]): keep the log. When the
    // recompute skipped F's output projection, <dL/dF, F> (= <dL/d update, update>, see
    // recompute_can_skip_branch_output) came from the branch's backward.
    const double contribution =
        run.executor().skipped_branch_output()
            ? run.executor().branch_output_dots()[k]
            : lane_dot(d_update.data() + static_cast<Eigen::Index>(k) * tokens * update.cols(), update.data(),
                       update.size());
    probes.log_contribution[static_cast<std::size_t>(l) * config.probes + k] =
        std::log(std::abs(contribution)) + probes.log_scale[k];
  }
  if (config.branch == BranchKind::model) {
    std::vector<double> logs(config.probes);
    for (int k = 0; k < config.probes; ++k)
      logs[k] = probes.log_scale[k] + 0.5 * std::log(probes.param_grads[k]);
    analysis.result.sublayers.at(Figure::log10_param_grad)[l] = log_rms(logs) / kLn10;
  }
  if (run.arch().additive_stream) {
    const Mat<Scalar>& top = run.state(run.sublayers()).front();
    analysis.result.sublayers.at(Figure::stream_decomposition)[l] =
        lane_dot(update.data(), top.data(), top.size()) / squared_norm(top);
  }
}

// output_share from the per-probe contributions c_{l,k} (kept as logs of |c|):
//   output_share_l = R_l / sum_m R_m,  R_l = sqrt(mean_k c_{l,k}^2)  (probe-RMS),
//   output_share_se_l = delete-one-probe jackknife standard error of output_share_l:
//     sqrt((K-1)/K * sum_k (share_l^(-k) - mean_j share_l^(-j))^2), share^(-k) computed without
//     probe k (Efron & Stein 1981); null for K = 1.
// A common reference scale (the largest |c|) cancels in the ratios, so nothing overflows.
void output_shares(const std::vector<double>& log_contribution, int sublayers, int probes,
                   SeedResult& result) {
  if (log_contribution.size() != static_cast<std::size_t>(sublayers) * probes) return;
  double top = -std::numeric_limits<double>::infinity();
  for (const double v : log_contribution) {
    if (std::isnan(v)) return;
    top = std::max(top, v);
  }
  if (!std::isfinite(top)) return;
  // squares[l][k] = (c_{l,k} / reference)^2
  std::vector<double> squares(log_contribution.size()), row_sum(sublayers, 0.0);
  for (std::size_t i = 0; i < squares.size(); ++i) squares[i] = std::exp(2.0 * (log_contribution[i] - top));
  for (int l = 0; l < sublayers; ++l) {
    for (int k = 0; k < probes; ++k) row_sum[l] += squares[static_cast<std::size_t>(l) * probes + k];
  }
  const auto shares = [&](int left_out, std::vector<double>& out) {
    const double count = left_out < 0 ? probes : probes - 1;
    double total = 0;
    out.resize(sublayers);
    for (int l = 0; l < sublayers; ++l) {
      const double sum =
          row_sum[l] - (left_out < 0 ? 0.0 : squares[static_cast<std::size_t>(l) * probes + left_out]);
      out[l] = std::sqrt(std::max(0.0, sum) / count);
      total += out[l];
    }
    for (double& v : out) v /= total;
    return total;
  };
  std::vector<double> share;
  shares(-1, share);
  auto& output_share = result.sublayers.at(Figure::output_share);
  double sum_sq = 0;
  for (int l = 0; l < sublayers; ++l) output_share[l] = share[l], sum_sq += share[l] * share[l];
  result.effective_depth = 1.0 / sum_sq;  // (sum c)^2 / sum c^2 with c normalised to sum 1
  if (probes < 2) return;
  std::vector<double> mean(sublayers, 0.0), mean_sq(sublayers, 0.0), left;
  for (int k = 0; k < probes; ++k) {
    shares(k, left);
    for (int l = 0; l < sublayers; ++l) mean[l] += left[l] / probes, mean_sq[l] += left[l] * left[l] / probes;
  }
  auto& se = result.sublayers.at(Figure::output_share_se);
  for (int l = 0; l < sublayers; ++l)
    se[l] = std::sqrt(std::max(0.0, (probes - 1.0) * (mean_sq[l] - mean[l] * mean[l])));
}

template <typename Scalar>
void compute_output_shares(SeedAnalysis<Scalar>& analysis) {
  output_shares(analysis.probes.log_contribution, analysis.run.sublayers(), analysis.run.config().probes,
                analysis.result);
}

template void record_contribution(SeedAnalysis<float>&, int);
template void record_contribution(SeedAnalysis<double>&, int);
template void compute_output_shares(SeedAnalysis<float>&);
template void compute_output_shares(SeedAnalysis<double>&);

}  // namespace gradflow
