// --spectrum k (metrics.md, log10_singular_value_i): the top-k singular values of J_{l->out} at
// every state by subspace iteration, built on the stack's JVP and VJP of each sublayer.
#include <Eigen/QR>
#include <Eigen/SVD>

#include "gradflow/rng.hpp"
#include "seed_analysis.hpp"
#include "sums.hpp"

namespace gradflow {

namespace {
// --spectrum's subspace iteration stops when the top-k log singular values move less than this
// between iterations (float32 arithmetic cannot resolve 1e-11), or after kSpectrumMaxIterations.
constexpr double kSpectrumToleranceF64 = 1e-11;
constexpr double kSpectrumToleranceF32 = 1e-5;
constexpr int kSpectrumMaxIterations = 200;

Eigen::MatrixXd orthonormal_columns(const Eigen::MatrixXd& m) {
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(m);
  return qr.householderQ() * Eigen::MatrixXd::Identity(m.rows(), m.cols());
}

// J_{l->out} V for orthonormal V (n_l, P): forward-mode sweep with QR at every state,
// J V = Q R_total. R_total is kept at unit Frobenius norm, its scale accumulated in log.
struct ForwardSweep {
  Eigen::MatrixXd q;        // (m, P)
  Eigen::MatrixXd r_total;  // (P, P) upper triangular
  double log_scale = 0;
};
//
// A stack that reads a history (attend) carries every earlier state's tangent to the later reads
// (StackRun::begin_history_forward): re-orthonormalising at state i would have to transform all of
// them, so its sweep takes one QR, of J V at the output, and keeps the states' own scale.
template <typename Scalar>
ForwardSweep forward_sweep_through_history(StackRun<Scalar>& run, int l, const Eigen::MatrixXd& v) {
  const Eigen::Index columns = v.cols();
  ForwardSweep sweep{{}, Eigen::MatrixXd::Identity(columns, columns), 0.0};
  State<Scalar> tangent, next;
  run.unflatten(v, run.state(l).size(), tangent);
  run.begin_history_forward(l);
  for (int i = l; i <= run.sublayers(); ++i) {
    run.jvp(i, tangent, next);
    std::swap(tangent, next);
  }
  run.end_history_forward();
  const Eigen::MatrixXd m = run.flatten(tangent, columns);
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(m);
  sweep.q = qr.householderQ() * Eigen::MatrixXd::Identity(m.rows(), columns);
  sweep.r_total = qr.matrixQR().topRows(columns).template triangularView<Eigen::Upper>();
  const double scale = sweep.r_total.norm();
  if (scale > 0 && std::isfinite(scale)) {
    sweep.r_total /= scale;
    sweep.log_scale = std::log(scale);
  }
  return sweep;
}

template <typename Scalar>
ForwardSweep forward_sweep(StackRun<Scalar>& run, int l, const Eigen::MatrixXd& v) {
  if (run.reads_history()) return forward_sweep_through_history(run, l, v);
  const Eigen::Index columns = v.cols();
  ForwardSweep sweep{{}, Eigen::MatrixXd::Identity(columns, columns), 0.0};
  State<Scalar> tangent, next;
  run.unflatten(v, run.state(l).size(), tangent);
  for (int i = l; i <= run.sublayers(); ++i) {
    run.jvp(i, tangent, next);
    const Eigen::MatrixXd m = run.flatten(next, columns);
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(m);
    sweep.q = qr.householderQ() * Eigen::MatrixXd::Identity(m.rows(), columns);
    const Eigen::MatrixXd r = qr.matrixQR().topRows(columns).template triangularView<Eigen::Upper>();
    sweep.r_total = r * sweep.r_total;
    const double scale = sweep.r_total.norm();
    if (!(scale > 0) || !std::isfinite(scale)) break;
    sweep.r_total /= scale;
    sweep.log_scale += std::log(scale);
    run.unflatten(sweep.q, next.size(), tangent);
  }
  return sweep;
}

// orth(J_{l->out}^T U) for U (m, P): backward sweep with QR at every state (only the span matters).
// A stack that reads a history runs it as a history backward (StackRun::begin_history_backward),
// with one QR at state l, since the earlier states' pending shares share each state's basis.
template <typename Scalar>
Eigen::MatrixXd backward_sweep(StackRun<Scalar>& run, int l, const Eigen::MatrixXd& u) {
  State<Scalar> cotangent, next;
  run.unflatten(u, 1, cotangent);
  if (run.reads_history()) {
    run.begin_history_backward(u.cols() * run.config().seq);
    for (int i = run.sublayers(); i >= l; --i) {
      run.vjp(i, cotangent, next);
      std::swap(cotangent, next);
    }
    run.end_history_backward();
    return orthonormal_columns(run.flatten(cotangent, u.cols()));
  }
  Eigen::MatrixXd q;
  for (int i = run.sublayers(); i >= l; --i) {
    run.vjp(i, cotangent, next);
    q = orthonormal_columns(run.flatten(next, u.cols()));
    run.unflatten(q, next.size(), cotangent);
  }
  return q;
}

// The subspace iteration at state l from the start U (m, P): the top log singular values, U left
// at the final top output directions.
template <typename Scalar>
Eigen::VectorXd iterate(StackRun<Scalar>& run, int l, Eigen::MatrixXd& u) {
  const int wanted = run.config().spectrum;
  const double tolerance =
      run.config().precision == Precision::f64 ? kSpectrumToleranceF64 : kSpectrumToleranceF32;
  Eigen::VectorXd log_singular;
  Eigen::MatrixXd v = backward_sweep(run, l, u);
  for (int iteration = 0; iteration < kSpectrumMaxIterations; ++iteration) {
    const ForwardSweep sweep = forward_sweep(run, l, v);
    const Eigen::JacobiSVD<Eigen::MatrixXd> svd(sweep.r_total, Eigen::ComputeFullU);
    const Eigen::VectorXd estimate = svd.singularValues().array().log() + sweep.log_scale;
    u = sweep.q * svd.matrixU();
    bool converged = log_singular.size() == estimate.size();
    for (Eigen::Index i = 0; converged && i < std::min<Eigen::Index>(wanted, estimate.size()); ++i) {
      const double change = estimate[i] == log_singular[i] ? 0.0 : std::abs(estimate[i] - log_singular[i]);
      converged = change < tolerance;
    }
    log_singular = estimate;
    if (converged) break;
    v = backward_sweep(run, l, u);
  }
  return log_singular;
}
}  // namespace

// Top-k singular values of J_{l->out} at every state by subspace iteration on J^T J (orthogonal
// iteration with Rayleigh-Ritz; Golub & Van Loan, Matrix Computations, Sec. 8.2). Each iteration
// is one forward sweep J V (QR at every state, logs of R accumulated) and one backward sweep
// orth(J^T U); the Ritz values are the singular values of R_total. A single backward sweep from a
// random start would give only lower bounds. With P = 2k columns the error falls like
// (s_{P+1} / s_i)^(2 * iterations); states are processed from the top down, each warm-started
// from the previous state's top-k output directions plus fresh random columns.
// Cost: O(S^2 * iterations * P) sublayer evaluations, against O(S) for the probes.
template <typename Scalar>
void compute_spectrum(SeedAnalysis<Scalar>& analysis) {
  StackRun<Scalar>& run = analysis.run;
  const int wanted = run.config().spectrum, sublayers = run.sublayers();
  const Eigen::Index outputs = run.entries_per_stream();
  Eigen::Index columns = std::min<Eigen::Index>(2 * wanted, outputs);
  for (const auto& state : run.states()) {
    columns = std::min<Eigen::Index>(columns, static_cast<Eigen::Index>(state.size()) * outputs);
  }
  const Eigen::Index kept = std::min<Eigen::Index>(wanted, columns);
  Eigen::MatrixXd u = Eigen::MatrixXd::Zero(outputs, columns);
  long long spectrum_done = 0;  // progress units (analysis_work_units)
  for (int l = sublayers; l >= 0; --l) {
    // Start: the previous state's top-k output directions plus fresh random columns. The random
    // part matters: a warm start alone can have exact zeros along a direction (e.g. the final
    // norm's block-diagonal Jacobian), which no number of iterations would then recover.
    Eigen::MatrixXd fresh(outputs, columns - (l == sublayers ? 0 : kept));
    fill_normal(stream_key(run.seed(), RandomUse::spectrum, static_cast<std::uint64_t>(l)), 1.0, fresh.data(),
                static_cast<std::size_t>(fresh.size()));
    u.rightCols(fresh.cols()) = fresh;
    u = orthonormal_columns(u);
    const Eigen::VectorXd log_singular = iterate(run, l, u);
    for (int i = 0; i < wanted && i < log_singular.size(); ++i) {
      analysis.result.states.at({Figure::log10_singular_value, i + 1})[l] = log_singular[i] / kLn10;
    }
    spectrum_done += sublayers - l + 1;
    analysis.report_progress(2LL * sublayers + spectrum_done);
  }
}

template void compute_spectrum(SeedAnalysis<float>&);
template void compute_spectrum(SeedAnalysis<double>&);

}  // namespace gradflow
