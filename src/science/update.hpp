// One optimizer step on probe 0's loss (--update; metrics.md, "The model update"): the pieces the
// update family (update.cpp) is built from, shared with its tests.
#pragma once
#include <utility>

#include "seed_analysis.hpp"

namespace gradflow {

// Adam's epsilon, PyTorch's default (Kingma & Ba 2014, arXiv 1412.6980, Alg. 1: eps = 1e-8).
inline constexpr double kAdamEpsilon = 1e-8;

// Sublayer l's probe-0 weight gradient dL/dtheta_l, divided by exp(probe0_log_scale[l + 1]):
// sublayer l recomputed from the stored x_l and back-propagated from the kept cotangent of
// x_{l+1}. Returns the branch context, whose weights are theta_l. The executor then holds the
// backward pass's recompute (StackRun::recompute_for_backward): a post-norm placement's branch
// output and the adds after it are not computed (the JVP does not read them).
// With `gain_gradient`, the norms' gain gradients dL/dgamma as well, scaled alike (per value id,
// GraphExecutor::norm_gain_gradients).
template <typename Scalar>
BranchContext<Scalar> sublayer_weight_gradient(SeedAnalysis<Scalar>& analysis, int l,
                                               SublayerWeights<Scalar>& gradient,
                                               std::vector<Mat<Scalar>>* gain_gradient = nullptr);

// The step Delta theta_l of `rule` at learning rate lr from the gradient g = exp(log_scale) * scaled,
// into `step`; returns <g, Delta theta_l> (update_loss) in double. theta_l is every weight matrix
// and, with --bias, every bias. Each matrix (with its bias) is a piece of the pool, the per-piece
// sums added in matrix order: the bits do not depend on threads.
template <typename Scalar>
double optimizer_step(UpdateRule rule, double lr, const SublayerWeights<Scalar>& scaled, double log_scale,
                      SublayerWeights<Scalar>& step, WorkPool* pool = nullptr);

// The same rule on the norms' gains (--update-params all): Delta gamma per value id from the
// gradient exp(log_scale) * scaled; returns <dL/dgamma, Delta gamma>.
template <typename Scalar>
double gain_step(UpdateRule rule, double lr, const std::vector<Mat<Scalar>>& scaled, double log_scale,
                 std::vector<Mat<Scalar>>& step);

// Runs work(m) for each of the `count` weights of a sublayer, a weight per piece of the pool (when given).
template <typename Work>
void for_each_weight(std::size_t count, WorkPool* pool, Work&& work) {
  for_each_piece(pool, static_cast<int>(count), std::forward<Work>(work));
}

}  // namespace gradflow
