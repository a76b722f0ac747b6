// The one table of figure families: each row names a module of src/science/ and when it applies.
// They run in this order after the forward pass; a new family is one module and one row here
// (its columns are rows of the figure table, src/science/figures.cpp).
#include "seed_analysis.hpp"

namespace gradflow {

template <typename Scalar>
void compute_representation(SeedAnalysis<Scalar>&);
template <typename Scalar>
void compute_angles_matrix(SeedAnalysis<Scalar>&);
template <typename Scalar>
void compute_probe_backward(SeedAnalysis<Scalar>&);
template <typename Scalar>
void compute_exact_jacobian(SeedAnalysis<Scalar>&);
template <typename Scalar>
void compute_spectrum(SeedAnalysis<Scalar>&);
template <typename Scalar>
void compute_output_shares(SeedAnalysis<Scalar>&);
template <typename Scalar>
void compute_summary(SeedAnalysis<Scalar>&);
template <typename Scalar>
void compute_update(SeedAnalysis<Scalar>&);

namespace {
template <typename Scalar>
bool always(const SeedAnalysis<Scalar>&) {
  return true;
}
template <typename Scalar>
bool forward_complete(const SeedAnalysis<Scalar>& a) {
  return a.forward_complete();
}
template <typename Scalar>
bool angles_all(const SeedAnalysis<Scalar>& a) {
  return a.forward_complete() && a.run.config().angles_all;
}
template <typename Scalar>
bool exact_jacobian(const SeedAnalysis<Scalar>& a) {
  return a.complete() && a.run.config().exact_jacobian;
}
template <typename Scalar>
bool spectrum(const SeedAnalysis<Scalar>& a) {
  return a.complete() && a.run.config().spectrum > 0;
}
template <typename Scalar>
bool update(const SeedAnalysis<Scalar>& a) {
  return a.complete() && a.run.config().update != UpdateRule::none;
}
}  // namespace

template <typename Scalar>
std::span<const FigureFamily<Scalar>> figure_families() {
  static const FigureFamily<Scalar> families[] = {
      // token_cos, erank, angle, block_influence: the states the forward pass reached
      {"representation", always<Scalar>, compute_representation<Scalar>},
      {"angles matrix", angles_all<Scalar>, compute_angles_matrix<Scalar>},
      // log10_grad (+ _se, per stream), gain, skip_gain, branch_gain; records the contributions
      {"probe backward", forward_complete<Scalar>, compute_probe_backward<Scalar>},
      {"exact jacobian", exact_jacobian<Scalar>, compute_exact_jacobian<Scalar>},
      {"spectrum", spectrum<Scalar>, compute_spectrum<Scalar>},
      // output_share, output_share_se, effective_depth
      {"output shares", always<Scalar>, compute_output_shares<Scalar>},
      // update_rms, log10_update_rel, update_loss (+ share), the run's UpdateSteps (--update)
      {"update", update<Scalar>, compute_update<Scalar>},
      {"summary", always<Scalar>, compute_summary<Scalar>},
  };
  return families;
}

template std::span<const FigureFamily<float>> figure_families();
template std::span<const FigureFamily<double>> figure_families();

}  // namespace gradflow
