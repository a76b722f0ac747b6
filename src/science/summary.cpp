// The per-run summary (metrics.md, "Per run"): log10_grad_rel and log10_grad_ratio, the extrema of
// gain, the growth fits of rms, and for additive placements the input's share of x_S.
#include "summary.hpp"

#include "seed_analysis.hpp"
#include "sums.hpp"

namespace gradflow {

void summarize_figures(SeedResult& result) {
  const auto& log10_grad = result.states.at(Figure::log10_grad);
  auto& relative = result.states.at(Figure::log10_grad_rel);
  const int sublayers = static_cast<int>(log10_grad.size()) - 1;
  for (int l = 0; l <= sublayers; ++l) relative[l] = log10_grad[l] - log10_grad[sublayers];
  result.log10_grad_ratio = relative[0];
  const auto& gain = result.sublayers.at(Figure::gain);
  result.gain_min = {kNaN, -1};
  result.gain_max = {kNaN, -1};
  for (int l = 0; l < sublayers; ++l) {
    if (!std::isfinite(gain[l])) continue;
    if (result.gain_min.sublayer < 0 || gain[l] < result.gain_min.value) result.gain_min = {gain[l], l};
    if (result.gain_max.sublayer < 0 || gain[l] > result.gain_max.value) result.gain_max = {gain[l], l};
  }
  result.growth = fit_growth(result.states.at(Figure::rms));
  for (auto& stream : result.streams) stream.growth = fit_growth(stream.states.at(Figure::rms));
}

template <typename Scalar>
void compute_summary(SeedAnalysis<Scalar>& analysis) {
  const StackRun<Scalar>& run = analysis.run;
  SeedResult& result = analysis.result;
  if (run.arch().additive_stream && !result.diverged) {
    // x_S = x_0 + sum_l update_l: the input's share <x_0, x_S> / norm(x_S)^2 (stream_decomposition)
    const Mat<Scalar>& top = run.state(run.sublayers()).front();
    result.stream_decomposition_input =
        run.state(0).front().template cast<double>().cwiseProduct(top.template cast<double>()).sum() /
        squared_norm(top);
  }
  summarize_figures(result);
}

template void compute_summary(SeedAnalysis<float>&);
template void compute_summary(SeedAnalysis<double>&);

}  // namespace gradflow
