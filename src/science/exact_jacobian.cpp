// --exact-jacobian (metrics.md): the exact Jacobian J_{l->out} = dy/dx_l at every state, from one
// backward sweep of every output coordinate at once, for checking the probe's Hutchinson estimate
// and the spectrum's subspace iteration.
#include "gradflow/singular_values.hpp"
#include "seed_analysis.hpp"
#include "sums.hpp"

namespace gradflow {

namespace {
// J_{l->out}^T for every output coordinate at once (m = T d one-hot cotangents), one backward
// sweep; exact Frobenius and spectral norms per state. A common scale per state, accumulated in
// log, keeps deep products finite. A stack that reads a history (attend) runs the sweep as a history
// backward (StackRun::begin_history_backward), every read adding its share to the earlier states'
// cotangents; those are not rescaled with the current state, so the sweep keeps the output's scale.
template <typename Scalar>
void sweep_exact_jacobian(SeedAnalysis<Scalar>& analysis) {
  StackRun<Scalar>& run = analysis.run;
  const ModelConfig& config = run.config();
  const Eigen::Index outputs = run.entries_per_stream();
  const bool history = run.reads_history();
  State<Scalar> cotangent(1, Mat<Scalar>::Zero(outputs * config.seq, config.width));
  for (Eigen::Index c = 0; c < outputs; ++c)
    cotangent[0](c * config.seq + c / config.width, c % config.width) = 1;
  FigureColumns& states = analysis.result.states;
  auto& fro = states.at(Figure::log10_jacobian_fro_exact);
  auto& spectral = states.at(Figure::log10_jacobian_spectral_exact);
  double log_scale = 0;
  State<Scalar> next;
  for (int l = run.sublayers(); l >= 0; --l) {
    run.vjp(l, cotangent, next);
    const Eigen::MatrixXd transposed = run.flatten(next, outputs);  // (n_l, m): J_{l->out}^T / exp(log_scale)
    const double norm = transposed.norm();
    fro[l] = (log_scale + std::log(norm)) / kLn10;
    Eigen::VectorXd singular;
    if (!singular_values(transposed, singular))
      singular.setConstant(std::max<Eigen::Index>(singular.size(), 1), kNaN);
    spectral[l] = (log_scale + std::log(singular[0])) / kLn10;
    for (int i = 0; i < config.spectrum && i < singular.size(); ++i) {
      states.at({Figure::log10_singular_value_exact, i + 1})[l] = (log_scale + std::log(singular[i])) / kLn10;
    }
    if (!(norm > 0) || !std::isfinite(norm)) return;
    if (!history) {
      for (auto& stream : next) stream *= static_cast<Scalar>(1.0 / norm);
      log_scale += std::log(norm);
    }
    std::swap(cotangent, next);
  }
}
}  // namespace

template <typename Scalar>
void compute_exact_jacobian(SeedAnalysis<Scalar>& analysis) {
  StackRun<Scalar>& run = analysis.run;
  if (!run.reads_history()) return sweep_exact_jacobian(analysis);
  run.begin_history_backward(run.entries_per_stream() * run.config().seq);
  try {
    sweep_exact_jacobian(analysis);
  } catch (...) {
    run.end_history_backward();
    throw;
  }
  run.end_history_backward();
}

template void compute_exact_jacobian(SeedAnalysis<float>&);
template void compute_exact_jacobian(SeedAnalysis<double>&);

}  // namespace gradflow
