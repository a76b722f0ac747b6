// The model update (metrics.md, "The model update"; issue 18): one optimizer step on probe 0's
// loss L = sum(U * y) for every weight matrix, then the forward pass again from the same input.
// DeepNet's argument (Wang et al. 2022, arXiv 2203.00555, Sec. 3 Fig. 3 and Sec. 4) is about the
// size of this move, ||F(x, theta + Delta theta) - F(x, theta)||, not about the gradient at init.
//
// Weights are drawn from the seed, never stored, and so are the stepped ones: the probe backward
// kept probe 0's cotangent of every state (as the forward kept the states), so the stepped forward
// pass recomputes sublayer l from x_l, back-propagates the cotangent of x_{l+1} to sublayer l's
// weight gradient, forms Delta theta_l, and runs sublayer l with theta_l + Delta theta_l on the
// stepped state. The gradient is transient: memory is the states and the cotangents.
#include "update.hpp"

#include "sums.hpp"

namespace gradflow {

namespace {
// One learning rate's pass in progress: the stepped state and its sums.
template <typename Scalar>
struct SteppedPass {
  State<Scalar> state;
  double step_squares[kMatrixKindCount] = {};
  bool finite = true;
};

// update_rms and log10_update_rel of stepped state l; false when it has a non-finite entry.
template <typename Scalar>
bool record_moved_state(SeedResult& result, int i, int l, const State<Scalar>& stepped,
                        const State<Scalar>& original) {
  double moved = 0, norm = 0, count = 0;
  for (std::size_t s = 0; s < stepped.size(); ++s) {
    moved += squared_distance(stepped[s].data(), original[s].data(), stepped[s].size());
    norm += squared_norm(original[s]);
    count += static_cast<double>(stepped[s].size());
  }
  if (!std::isfinite(moved)) return false;
  result.states.at({Figure::update_rms, i + 1})[l] = std::sqrt(moved / count);
  result.states.at({Figure::log10_update_rel, i + 1})[l] = 0.5 * std::log10(moved / norm);
  return true;
}

// The output head on the stepped final state: output_update_rel and the measured Delta L, formed
// as sum(U * (y' - y)) so that no digits cancel in L' - L.
template <typename Scalar>
void record_output(StackRun<Scalar>& run, const State<Scalar>& stepped, UpdateStep& step) {
  const auto head = run.prepare_head();
  run.executor().forward(run.graph(), run.state(run.sublayers()), head);
  const Mat<double> y = run.executor().value(run.graph().outputs().front()).template cast<double>();
  run.executor().forward(run.graph(), stepped, head);
  const Mat<double> moved = run.executor().value(run.graph().outputs().front()).template cast<double>() - y;
  const Mat<double> probe =
      make_probes<Scalar>(run.config(), run.seed()).topRows(run.config().seq).template cast<double>();
  step.output_update_rel = moved.norm() / y.norm();
  step.delta_loss = (moved.array() * probe.array()).sum();
}

// After the last sublayer: the output figures, update_loss_share and the step sizes per kind.
template <typename Scalar>
void finish_update(StackRun<Scalar>& run, const SteppedPass<Scalar>& pass,
                   const std::vector<double>& weight_squares, SeedResult& result, int i) {
  UpdateStep& step = result.updates[i];
  if (!pass.finite) return;
  record_output(run, pass.state, step);
  auto& share = result.sublayers.at({Figure::update_loss_share, i + 1});
  const auto& loss = result.sublayers.at({Figure::update_loss, i + 1});
  for (std::size_t l = 0; l < share.size(); ++l) share[l] = loss[l] / step.delta_loss_first_order;
  for (int m = 0; m < kMatrixKindCount; ++m) {
    if (weight_squares[m] > 0) step.step_rel[m] = std::sqrt(pass.step_squares[m] / weight_squares[m]);
  }
}
}  // namespace

template <typename Scalar>
BranchContext<Scalar> sublayer_weight_gradient(SeedAnalysis<Scalar>& analysis, int l,
                                               SublayerWeights<Scalar>& gradient) {
  StackRun<Scalar>& run = analysis.run;
  const auto branch = run.prepare_sublayer(l, l + 1);
  run.executor().forward(run.graph(), run.state(l), branch);
  State<Scalar> d_input;
  run.executor().backward(run.graph(), analysis.probes.probe0_cotangent[l + 1], true, branch, d_input);
  run.executor().weight_gradients(run.graph(), branch, gradient);
  return branch;
}

template <typename Scalar>
double optimizer_step(UpdateRule rule, double lr, SublayerKind kind, const SublayerWeights<Scalar>& scaled,
                      double log_scale, SublayerWeights<Scalar>& step) {
  const auto from = matrices(scaled);
  const auto to = matrices(step);
  const auto [first, last] = matrix_range(kind);
  double inner = 0;  // <g / exp(log_scale), Delta theta>
  for (int m = first; m < last; ++m) {
    const Mat<Scalar>& g = *from[m];
    Mat<Scalar>& delta = *to[m];
    if (rule == UpdateRule::sgd) {
      // SGD: Delta theta = -eta g.
      delta = static_cast<Scalar>(-lr * std::exp(log_scale)) * g;
    } else {
      // Adam's first step (Kingma & Ba 2014, arXiv 1412.6980, Alg. 1): m = (1 - b1) g and
      // v = (1 - b2) g^2, bias-corrected m^ = g and v^ = g^2, so Delta theta = -eta g / (|g| + eps),
      // eps = 1e-8; with g = exp(log_scale) * scaled, -eta scaled / (|scaled| + eps exp(-log_scale)).
      const auto eps = static_cast<Scalar>(kAdamEpsilon * std::exp(-log_scale));
      delta = (static_cast<Scalar>(-lr) * g.array() / (g.array().abs() + eps)).matrix();
    }
    inner += lane_dot(g.data(), delta.data(), g.size());
  }
  return inner * std::exp(log_scale);  // update_loss = <g, Delta theta>
}

template <typename Scalar>
void compute_update(SeedAnalysis<Scalar>& analysis) {
  StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  SeedResult& result = analysis.result;
  const int count = config.update_count();
  std::vector<SteppedPass<Scalar>> passes(count);
  std::vector<double> weight_squares(kMatrixKindCount, 0.0);
  result.updates.assign(count, {});
  for (int i = 0; i < count; ++i) {
    passes[i].state = run.state(0);
    result.updates[i].learning_rate = config.learning_rates[i];
    result.updates[i].delta_loss_first_order = 0.0;
    record_moved_state(result, i, 0, passes[i].state, run.state(0));
  }
  SublayerWeights<Scalar> gradient, step, stepped;
  for (int l = 0; l < run.sublayers(); ++l) {
    auto branch = sublayer_weight_gradient(analysis, l, gradient);
    const SublayerWeights<Scalar>& weights = *branch.weights;
    const auto [first, last] = matrix_range(config.sublayer_kind(l));
    for (int m = first; m < last; ++m) weight_squares[m] += squared_norm(*matrices(weights)[m]);
    for (int i = 0; i < count; ++i) {
      SteppedPass<Scalar>& pass = passes[i];
      if (!pass.finite) continue;
      const double loss = optimizer_step(config.update, config.learning_rates[i], config.sublayer_kind(l), gradient,
                                         analysis.probes.probe0_log_scale[l + 1], step);
      result.sublayers.at({Figure::update_loss, i + 1})[l] = loss;
      result.updates[i].delta_loss_first_order += loss;
      for (int m = first; m < last; ++m) {
        pass.step_squares[m] += squared_norm(*matrices(step)[m]);
        *matrices(stepped)[m] = *matrices(weights)[m] + *matrices(step)[m];
      }
      branch.weights = &stepped;
      run.executor().forward(run.graph(), pass.state, branch);
      branch.weights = &weights;
      pass.state.resize(run.graph().outputs().size());
      for (std::size_t s = 0; s < pass.state.size(); ++s)
        pass.state[s] = run.executor().value(run.graph().outputs()[s]);
      pass.finite = record_moved_state(result, i, l + 1, pass.state, run.state(l + 1));
      if (!pass.finite) result.updates[i].diverged_state = l + 1;
    }
  }
  for (int i = 0; i < count; ++i) finish_update(run, passes[i], weight_squares, result, i);
}

template void compute_update(SeedAnalysis<float>&);
template void compute_update(SeedAnalysis<double>&);
template BranchContext<float> sublayer_weight_gradient(SeedAnalysis<float>&, int, SublayerWeights<float>&);
template BranchContext<double> sublayer_weight_gradient(SeedAnalysis<double>&, int, SublayerWeights<double>&);
template double optimizer_step(UpdateRule, double, SublayerKind, const SublayerWeights<float>&, double,
                               SublayerWeights<float>&);
template double optimizer_step(UpdateRule, double, SublayerKind, const SublayerWeights<double>&, double,
                               SublayerWeights<double>&);

}  // namespace gradflow
