// One seed's analysis in progress: the stack run with its stored states, the result being filled,
// and what the probe backward leaves for the modules after it. The forward pass (forward.cpp)
// fills the states; then each family of figures, a module of its own in src/science/, runs in the
// order of the one table in families.cpp. Adding a family is one module and one row there.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "gradflow/analysis.hpp"
#include "stack_run.hpp"

namespace gradflow {

template <typename Scalar>
struct ProbeGradients {
  State<Scalar> gradient;         // dL/dx_l at the lowest state reached, renormalised per probe
  std::vector<double> log_scale;  // per probe: log of the true norm of that gradient
  ParamGradSquares param_grads;   // per probe: norm(dL/dW)^2 of the sublayer last passed
  std::vector<double>
      log_contribution;  // (S, K): log |<dL/d update_l, update_l>| per probe; NaN: not reached
  double loss = 0.0;     // probe 0's L = sum(U * y)
  // --update: probe 0's renormalised dL/dx_l (its T rows) for l = 1..S, and the log of its true
  // norm; kept like the states, for the stepped forward pass (update.cpp).
  std::vector<State<Scalar>> probe0_cotangent;
  std::vector<double> probe0_log_scale;
};

template <typename Scalar>
struct SeedAnalysis {
  // `empty`: the result with every column this configuration reports, NaN until computed.
  SeedAnalysis(const ModelConfig& config, const Architecture& arch, const Constants& constants,
               std::uint64_t seed, const AnalysisHooks& hooks, int threads, SeedResult empty,
               ProgressCallback on_progress = {})
      : run(config, arch, constants, seed, hooks, threads),
        result(std::move(empty)),
        progress(std::move(on_progress)) {}

  StackRun<Scalar> run;
  SeedResult result;
  ProgressCallback progress;
  int last_state = -1;  // the forward pass's last finite state; S when it completed
  ProbeGradients<Scalar> probes;

  bool forward_complete() const { return last_state == run.sublayers(); }
  bool complete() const { return forward_complete() && !result.diverged; }
  // Progress in the units of analysis_work_units.
  void report_progress(long long done) const {
    if (progress) progress(done, analysis_work_units(run.config()));
  }
};

// The forward pass from `input`: states x_0..x_S, rms (also per stream), branch_rms,
// stream_share, skip_gain_theory, divergence. profile: update Admin's profiled skip weights.
template <typename Scalar>
void run_forward(SeedAnalysis<Scalar>& analysis, const Mat<Scalar>& input, bool profile);

// A family of figures: when it applies to this seed, and the module that computes it.
template <typename Scalar>
struct FigureFamily {
  const char* name;
  bool (*applies)(const SeedAnalysis<Scalar>& analysis);
  void (*compute)(SeedAnalysis<Scalar>& analysis);
};
// Every family, in the order they run after the forward pass.
template <typename Scalar>
std::span<const FigureFamily<Scalar>> figure_families();

// contributions.cpp: at sublayer l inside the probe backward (while log_scale still holds state
// l+1's scales and the executor sublayer l's cotangents), the per-probe output contribution,
// log10_param_grad and stream_decomposition.
template <typename Scalar>
void record_contribution(SeedAnalysis<Scalar>& analysis, int l);

}  // namespace gradflow
