// The forward pass: stores x_1..x_S and records what it sees on the way (rms per state and stream,
// branch_rms, stream_share; Admin's profiled skip weights), stopping at the first state that is not
// finite (metrics.md, "Divergence").
#include <fmt/format.h>

#include "seed_analysis.hpp"
#include "sums.hpp"

namespace gradflow {

namespace {
// rms of state l and of each of its streams, from one squared-norm pass per stream; records
// nothing and returns false when the state has a non-finite entry.
template <typename Scalar>
bool record_state_rms(SeedAnalysis<Scalar>& analysis, int l, std::vector<double>& stream_squares) {
  const State<Scalar>& state = analysis.run.state(l);
  stream_squares.resize(state.size());
  double sum = 0, count = 0;
  for (std::size_t s = 0; s < state.size(); ++s) {
    stream_squares[s] = squared_norm(state[s]);
    sum += stream_squares[s], count += static_cast<double>(state[s].size());
  }
  if (!all_finite(state, stream_squares)) return false;
  analysis.result.states.at(Figure::rms)[l] = std::sqrt(sum / count);
  for (std::size_t s = 0; s < state.size(); ++s) {
    analysis.result.streams[s].states.at(Figure::rms)[l] = std::sqrt(stream_squares[s] / state[s].size());
  }
  return true;
}

// Admin: w_{l+1}^2 = Var[w_l x_l] + Var[F_l] = w_l^2 Var[x_l] + Var[F_l], both measured
// (LiyuanLucasLiu/Transformer-Clinic fairseq/fairseq/modules/transformer_layer.py L193-195
// and L258-260: `np.sqrt(np.var(residual * ratio) + np.var(x))`); Var[x_0] of the sampled
// input is not 1, nor exactly is that of a normed state (np.var centres on the mean).
template <typename Scalar>
void profile_skip_weight(StackRun<Scalar>& run, int l) {
  const double w = run.skip_weight(l);
  const double stream_variance = population_variance(run.state(l)[0]);
  const double branch_variance = population_variance(run.executor().value(run.graph().branch_id()));
  run.set_skip_weight(l + 1, std::sqrt(w * w * stream_variance + branch_variance));
}

// A state below the precision's smallest normal has lost its digits (plain stacks collapse to
// exact zeros): reported like an overflow, though the pass goes on with the numbers it has.
template <typename Scalar>
void check_underflow(SeedResult& result, int l, Precision precision) {
  const double rms = result.states.at(Figure::rms)[l + 1];
  if (!result.diverged && rms < static_cast<double>(std::numeric_limits<Scalar>::min())) {
    result.diverged = Divergence{
        l, "underflow",
        fmt::format("state x_{} underflowed (rms {:.3g}, below the smallest normal {} number, {:.3g}); the "
                    "stream has collapsed and figures after sublayer {} describe zeros",
                    l + 1, rms, to_string(precision), std::numeric_limits<Scalar>::min(), l)};
  }
}
}  // namespace

template <typename Scalar>
void run_forward(SeedAnalysis<Scalar>& analysis, const Mat<Scalar>& input, bool profile) {
  const auto start = std::chrono::steady_clock::now();
  StackRun<Scalar>& run = analysis.run;
  const Architecture& arch = run.arch();
  SeedResult& result = analysis.result;
  auto& branch_rms = result.sublayers.at(Figure::branch_rms);
  auto& stream_share = result.sublayers.at(Figure::stream_share);
  auto& skip_gain_theory = result.sublayers.at(Figure::skip_gain_theory);
  for (int l = 0; arch.skip_gain_theory && l < run.sublayers(); ++l)
    skip_gain_theory[l] = arch.skip_gain_theory(run.context(l)).value_or(kNaN);
  std::vector<double> stream_squares;
  run.start(input);
  record_state_rms(analysis, 0, stream_squares);
  analysis.last_state = run.sublayers();
  for (int l = 0; l < run.sublayers(); ++l) {
    run.forward(l);
    if (arch.profiles_skip_weight && arch.skip_gain_theory) {  // w_l is known from here on
      skip_gain_theory[l] = arch.skip_gain_theory(run.context(l)).value_or(kNaN);
    }
    const auto& update = run.executor().value(run.graph().update_id());
    const double update_sq = squared_norm(update);
    branch_rms[l] = std::sqrt(update_sq / update.size());
    stream_share[l] = std::sqrt(update_sq / squared_norm(run.executor().value(run.graph().sum_id())));
    if (profile && arch.profiles_skip_weight) profile_skip_weight(run, l);
    if (!record_state_rms(analysis, l + 1, stream_squares)) {
      result.diverged = Divergence{
          l, "forward",
          fmt::format(
              "state x_{} has non-finite entries (overflow in {}); figures after sublayer {} are null", l + 1,
              to_string(run.config().precision), l)};
      analysis.last_state = l;
      break;
    }
    check_underflow<Scalar>(result, l, run.config().precision);
    analysis.report_progress(l + 1);
  }
  result.forward_seconds += seconds_since(start);
}

template void run_forward(SeedAnalysis<float>&, const Mat<float>&, bool);
template void run_forward(SeedAnalysis<double>&, const Mat<double>&, bool);

}  // namespace gradflow
