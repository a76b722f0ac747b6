// The probe backward pass (metrics.md, "The probe"): K probes back-propagated from L = sum(U * y)
// with the gradient renormalised at every state and the log of each step's scale accumulated in
// double. Records log10_grad (also per stream), log10_grad_se and the gains; the output
// contributions are recorded on the way (contributions.cpp). Activations are recomputed per
// sublayer, so memory is the residual states plus one sublayer's working set. A placement that
// reads a history (attend) takes back_through_history instead: no renormalisation, and every
// state's history cotangent kept until its turn.
#include <fmt/format.h>

#include "seed_analysis.hpp"
#include "sums.hpp"

namespace gradflow {

namespace {
// Renormalises each probe's cotangent to unit norm and returns log(norm) per probe, or false
// when a probe's norm is zero or not finite.
template <typename Scalar>
bool renormalise(State<Scalar>& cotangent, int probes, int tokens, std::vector<double>& log_norms,
                 std::vector<double>& stream_norms) {
  const std::size_t streams = cotangent.size();
  log_norms.assign(probes, 0.0);
  stream_norms.assign(probes * streams, 0.0);
  for (int k = 0; k < probes; ++k) {
    double total = 0;
    for (std::size_t s = 0; s < streams; ++s) {
      stream_norms[k * streams + s] = probe_squared_norm(cotangent[s], k, tokens);
      total += stream_norms[k * streams + s];
    }
    if (!(total > 0) || !std::isfinite(total)) return false;
    const double norm = std::sqrt(total);
    log_norms[k] = std::log(norm);
    for (std::size_t s = 0; s < streams; ++s) {
      stream_norms[k * streams + s] = std::sqrt(stream_norms[k * streams + s]) / norm;
      cotangent[s].middleRows(static_cast<Eigen::Index>(k) * tokens, tokens) *=
          static_cast<Scalar>(1.0 / norm);
    }
  }
  return true;
}

// --update: keeps probe 0's rows of the renormalised dL/dx_l and their log scale (update.cpp).
template <typename Scalar>
void keep_probe0_cotangent(SeedAnalysis<Scalar>& analysis, int l) {
  const ModelConfig& config = analysis.run.config();
  if (config.update == UpdateRule::none) return;
  ProbeGradients<Scalar>& probes = analysis.probes;
  probes.probe0_cotangent.resize(analysis.run.sublayers() + 1);
  probes.probe0_log_scale.resize(analysis.run.sublayers() + 1, 0.0);
  State<Scalar>& kept = probes.probe0_cotangent[l];
  kept.resize(probes.gradient.size());
  for (std::size_t s = 0; s < kept.size(); ++s) kept[s] = probes.gradient[s].topRows(config.seq);
  probes.probe0_log_scale[l] = probes.log_scale[0];
}

// Records log10_grad at state l from the accumulated per-probe logs and per-stream shares.
void record_state_gradient(SeedResult& result, int l, std::size_t streams,
                           const std::vector<double>& log_scale, const std::vector<double>& stream_norms) {
  result.states.at(Figure::log10_grad)[l] = log_rms(log_scale) / kLn10;
  // Standard error of log10_grad by the delta method on q_k = norm(g_l,k)^2 (relative scale):
  // se(log10 sqrt(mean q)) = sd(q) / (sqrt(K) * 2 mean(q) ln 10). NaN for one probe.
  const int probes = static_cast<int>(log_scale.size());
  if (probes > 1) {
    const double top = *std::max_element(log_scale.begin(), log_scale.end());
    double sum = 0, sum_sq = 0;
    for (int k = 0; k < probes; ++k) {
      const double q = std::exp(2.0 * (log_scale[k] - top));
      sum += q, sum_sq += q * q;
    }
    const double mean = sum / probes;
    const double variance = std::max(0.0, (sum_sq - probes * mean * mean) / (probes - 1));
    result.states.at(Figure::log10_grad_se)[l] = std::sqrt(variance / probes) / (2.0 * mean * kLn10);
  }
  for (std::size_t s = 0; s < streams; ++s) {
    std::vector<double> logs(probes);
    for (int k = 0; k < probes; ++k) logs[k] = log_scale[k] + std::log(stream_norms[k * streams + s]);
    result.streams[s].states.at(Figure::log10_grad)[l] = log_rms(logs) / kLn10;
  }
}

// The gradient through sublayer l became zero or non-finite: the states below are null. An earlier
// divergence (an underflow in the forward pass) is the cause and is kept.
inline void record_backward_divergence(SeedResult& result, int l) {
  if (result.diverged) return;
  result.diverged = Divergence{
      l, "backward",
      fmt::format("the gradient through sublayer {} became zero or non-finite; states below {} are null", l,
                  l)};
}

struct Gains {
  double gain, skip_gain, branch_gain;
};
// Probe-RMS gains of one sublayer from the cotangents of its input (full and skip path only):
// each probe weighted by its true squared norm at state l+1.
template <typename Scalar>
Gains probe_rms_gains(const State<Scalar>& previous, const State<Scalar>& skip_part,
                      const std::vector<double>& log_scale, int tokens, std::vector<double>& weight) {
  const int probes = static_cast<int>(log_scale.size());
  const double top = *std::max_element(log_scale.begin(), log_scale.end());
  double total = 0, total_skip = 0, total_branch = 0, weights = 0;
  for (int k = 0; k < probes; ++k) {
    weight[k] = std::exp(2.0 * (log_scale[k] - top));
    double full = 0, skip = 0, through_branch = 0;
    for (std::size_t s = 0; s < previous.size(); ++s) {
      full += probe_squared_norm(previous[s], k, tokens);
      skip += probe_squared_norm(skip_part[s], k, tokens);
      const Eigen::Index offset = static_cast<Eigen::Index>(k) * tokens * previous[s].cols();
      through_branch += squared_distance(previous[s].data() + offset, skip_part[s].data() + offset,
                                         static_cast<Eigen::Index>(tokens) * previous[s].cols());
    }
    total += weight[k] * full, total_skip += weight[k] * skip, total_branch += weight[k] * through_branch;
    weights += weight[k];
  }
  return {std::sqrt(total / weights), std::sqrt(total_skip / weights), std::sqrt(total_branch / weights)};
}

// The output head: y from the final state, L = sum(U * y), and the renormalised dL/dx_S.
template <typename Scalar>
bool start_from_output(SeedAnalysis<Scalar>& analysis, std::vector<double>& stream_norms) {
  StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  ProbeGradients<Scalar>& probes = analysis.probes;
  const int top = run.sublayers();
  const auto head = run.recompute(top);
  const State<Scalar> cotangent_out(1, make_probes<Scalar>(config, run.seed()));
  const auto& output = run.executor().value(run.graph().outputs().front());
  probes.loss = (output.template cast<double>().array() *
                 cotangent_out[0].topRows(config.seq).template cast<double>().array())
                    .sum();
  run.executor().backward(run.graph(), cotangent_out, true, head, probes.gradient);
  if (!renormalise(probes.gradient, config.probes, config.seq, probes.log_scale, stream_norms)) {
    if (!analysis.result.diverged)  // an underflow in the forward pass is the cause; keep it
      analysis.result.diverged =
          Divergence{top, "backward", "the output gradient dL/dx_S is zero or not finite"};
    return false;
  }
  record_state_gradient(analysis.result, top, run.state(top).size(), probes.log_scale, stream_norms);
  keep_probe0_cotangent(analysis, top);
  return true;
}

// Sublayers S-1 .. 0: the recompute, the VJP once through the skip path only and once in full,
// the gains from the two, then the renormalised gradient of state l.
template <typename Scalar>
void back_through_sublayers(SeedAnalysis<Scalar>& analysis) {
  StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  ProbeGradients<Scalar>& probes = analysis.probes;
  SeedResult& result = analysis.result;
  std::vector<double> log_norms, stream_norms, weight(config.probes);
  State<Scalar> previous, skip_part;
  auto& gain = result.sublayers.at(Figure::gain);
  auto& skip_gain = result.sublayers.at(Figure::skip_gain);
  auto& branch_gain = result.sublayers.at(Figure::branch_gain);
  for (int l = run.sublayers() - 1; l >= 0; --l) {
    // additive placements: stream_decomposition needs F, so the recompute runs in full
    const auto branch =
        run.recompute_for_backward(l, run.hooks().recompute_in_full || run.arch().additive_stream, l - 1);
    run.executor().backward(run.graph(), probes.gradient, false, branch, skip_part);
    run.executor().backward(run.graph(), probes.gradient, true, branch, previous,
                            config.branch == BranchKind::model ? &probes.param_grads : nullptr);
    record_contribution(analysis, l);
    const Gains gains = probe_rms_gains(previous, skip_part, probes.log_scale, config.seq, weight);
    gain[l] = gains.gain, skip_gain[l] = gains.skip_gain, branch_gain[l] = gains.branch_gain;
    if (!renormalise(previous, config.probes, config.seq, log_norms, stream_norms)) {
      record_backward_divergence(result, l);
      return;
    }
    for (int k = 0; k < config.probes; ++k) probes.log_scale[k] += log_norms[k];
    std::swap(probes.gradient, previous);
    record_state_gradient(result, l, run.state(l).size(), probes.log_scale, stream_norms);
    if (l > 0) keep_probe0_cotangent(analysis, l);
    analysis.report_progress(2LL * run.sublayers() - l);
  }
}

// Placements that read a history (attend): sublayer l's VJP also adds shares to every earlier
// state's history cotangent (StackRun::begin_history_backward), so the cotangents are not
// renormalised between states: that would rescale every earlier state's cotangent at each step.
// They keep the output's scale (unit norm at x_S), each state's norm is measured instead, and the
// skip path has no single-step meaning here: skip_gain and branch_gain stay null. The VJP runs once
// per sublayer, through F, since each run adds to the history's cotangents.
template <typename Scalar>
void back_through_history(SeedAnalysis<Scalar>& analysis) {
  StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  ProbeGradients<Scalar>& probes = analysis.probes;
  SeedResult& result = analysis.result;
  const int tokens = config.seq;
  std::vector<double> above(config.probes, 1.0), below(config.probes), state_logs(config.probes);
  std::vector<double> stream_norms;
  State<Scalar> previous;
  auto& gain = result.sublayers.at(Figure::gain);
  run.begin_history_backward(probes.gradient.front().rows());
  for (int l = run.sublayers() - 1; l >= 0; --l) {
    const auto branch = run.recompute_for_backward(l, true, l - 1);
    run.executor().backward(run.graph(), probes.gradient, true, branch, previous,
                            config.branch == BranchKind::model ? &probes.param_grads : nullptr);
    run.add_history_cotangent(l, previous);
    record_contribution(analysis, l);
    const std::size_t streams = previous.size();
    stream_norms.assign(config.probes * streams, 0.0);
    double top = -std::numeric_limits<double>::infinity();
    for (int k = 0; k < config.probes; ++k) {
      double total = 0;
      for (std::size_t s = 0; s < streams; ++s)
        total += stream_norms[k * streams + s] = probe_squared_norm(previous[s], k, tokens);
      if (!(total > 0) || !std::isfinite(total)) {
        record_backward_divergence(result, l);
        run.end_history_backward();
        return;
      }
      below[k] = total;
      state_logs[k] = probes.log_scale[k] + 0.5 * std::log(total);
      for (std::size_t s = 0; s < streams; ++s)
        stream_norms[k * streams + s] = std::sqrt(stream_norms[k * streams + s] / total);
      top = std::max(top, probes.log_scale[k]);
    }
    // gain^2 = sum_k |dL/dx_l|_k^2 / sum_k |dL/dx_{l+1}|_k^2, true norms (the probe-RMS gain)
    double numerator = 0, denominator = 0;
    for (int k = 0; k < config.probes; ++k) {
      const double weight = std::exp(2.0 * (probes.log_scale[k] - top));
      numerator += weight * below[k], denominator += weight * above[k];
    }
    gain[l] = std::sqrt(numerator / denominator);
    above = below;
    std::swap(probes.gradient, previous);
    record_state_gradient(result, l, streams, state_logs, stream_norms);
    if (l > 0) keep_probe0_cotangent(analysis, l);
    analysis.report_progress(2LL * run.sublayers() - l);
  }
  run.end_history_backward();
}
}  // namespace

template <typename Scalar>
void compute_probe_backward(SeedAnalysis<Scalar>& analysis) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> stream_norms;
  if (start_from_output(analysis, stream_norms)) {
    if (analysis.run.reads_history())
      back_through_history(analysis);
    else
      back_through_sublayers(analysis);
  }
  analysis.result.backward_seconds = seconds_since(start);
}

template void compute_probe_backward(SeedAnalysis<float>&);
template void compute_probe_backward(SeedAnalysis<double>&);

}  // namespace gradflow
