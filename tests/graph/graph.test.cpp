// SublayerGraph and GraphExecutor (src/graph.cpp) on tiny hand-built recipes: forward against
// hand-computed values, the VJP and the JVP against central differences, the skip-path cut, and
// the recompute that skips the branch output against the full forward.
#include "gradflow/graph.hpp"

#include <doctest/doctest.h>

#include "gradflow/app/placements.hpp"
#include "gradflow/architecture.hpp"
#include "gradflow/initialization.hpp"
#include "support/finite_difference.hpp"
#include "support/small_model.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
ModelConfig tiny_config() {
  return small_model(1, 8, 2, 5);
}

// The recipes under test, one input stream and one output: pre-norm y = x + 0.5 F(N(x)),
// post-norm y = N(x + F(x)), and a branch-free y = unit(2 x + x).
enum class Recipe { pre_norm, post_norm, no_branch };

// qkv_norm: the attention branch's q/k/v normalisation (QkvNorm), none by default.
void build(SublayerGraph& graph, Recipe recipe, QkvNorm qkv_norm = QkvNorm::none) {
  graph.reset(1);
  const Value x = graph.input(0);
  if (recipe == Recipe::pre_norm) {
    const Value update = graph.scale(graph.branch(graph.norm(x), qkv_norm), 0.5);
    const Value sum = graph.add(x, update);
    graph.mark_update(update, sum);
    graph.set_outputs({sum});
  } else if (recipe == Recipe::post_norm) {
    const Value update = graph.branch(x, qkv_norm);
    const Value sum = graph.add(x, update);
    graph.mark_update(update, sum);
    graph.set_outputs({graph.norm(sum)});
  } else {
    const Value sum = graph.add(graph.scale(x, 2.0), x);
    graph.mark_update(sum, sum);
    graph.set_outputs({graph.unit(sum)});
  }
}

struct Fixture {
  ModelConfig config = tiny_config();
  Constants constants;
  SublayerWeights<double> weights;
  BranchContext<double> context;
  explicit Fixture(SublayerKind kind) {
    const Architecture& arch = find_architecture("pre-ln");
    const SublayerContext ctx{config, constants, 0, 0, kind, 1.0};
    generate_weights(config, arch, ctx, 3, weights);
    context = BranchContext<double>{kind, BranchKind::model, NormKind::rms, config.heads, &weights, nullptr};
  }
};

MatD forward(const Fixture& f, Recipe recipe, const MatD& x) {
  SublayerGraph graph;
  build(graph, recipe);
  GraphExecutor<double> executor;
  executor.forward(graph, {x}, f.context);
  return executor.value(graph.outputs().front());
}
}  // namespace

TEST_CASE("a branch-free recipe's forward is unit(3 x) per token") {
  const Fixture f(SublayerKind::ffn);
  const MatD x = random_matrix(5, 8, 1);
  const MatD y = forward(f, Recipe::no_branch, x);
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const Eigen::RowVectorXd expected = x.row(t) / x.row(t).norm();
    CHECK((y.row(t) - expected).norm() < 1e-14);
  }
}

TEST_CASE("GraphExecutor's VJP and JVP match central differences for pre- and post-norm recipes") {
  for (const SublayerKind kind : {SublayerKind::ffn, SublayerKind::attn}) {
    const Fixture f(kind);
    for (const Recipe recipe : {Recipe::pre_norm, Recipe::post_norm, Recipe::no_branch}) {
      CAPTURE(static_cast<int>(kind));
      CAPTURE(static_cast<int>(recipe));
      const MatD x = random_matrix(5, 8, 2);
      const auto run = [&](const MatD& in) { return forward(f, recipe, in); };
      const auto vjp = [&](const MatD& in, const MatD& dy) {
        SublayerGraph graph;
        build(graph, recipe);
        GraphExecutor<double> executor;
        executor.forward(graph, {in}, f.context);
        std::vector<MatD> dx;
        executor.backward(graph, {dy}, true, f.context, dx);
        return dx.front();
      };
      const auto jvp = [&](const MatD& in, const MatD& dx) {
        SublayerGraph graph;
        build(graph, recipe);
        GraphExecutor<double> executor;
        executor.forward(graph, {in}, f.context);
        std::vector<MatD> dy;
        executor.jvp(graph, {dx}, f.context, dy);
        return dy.front();
      };
      CHECK(backward_relative_error(x, run, vjp) <= kFiniteDifferenceTolerance);
      CHECK(jvp_relative_error(x, run, jvp) <= kFiniteDifferenceTolerance);
    }
  }
}

TEST_CASE("cutting the branch leaves the skip path: the pre-norm recipe's VJP is then the identity") {
  const Fixture f(SublayerKind::ffn);
  SublayerGraph graph;
  build(graph, Recipe::pre_norm);
  GraphExecutor<double> executor;
  executor.forward(graph, {random_matrix(5, 8, 4)}, f.context);
  const MatD dy = random_matrix(10, 8, 5);  // two probes
  std::vector<MatD> skip, full;
  executor.backward(graph, {dy}, false, f.context, skip);
  CHECK(skip.front() == dy);
  executor.backward(graph, {dy}, true, f.context, full);
  CHECK((full.front() - dy).norm() > 1e-3);  // the branch does contribute
}

TEST_CASE("the post-norm recompute skips the branch output and gives the forward's gradient") {
  const Fixture f(SublayerKind::ffn);
  SublayerGraph graph;
  build(graph, Recipe::post_norm);
  CHECK(recompute_can_skip_branch_output(graph));
  SublayerGraph normed_update;  // N(F(x)): a norm after the branch that is not an output
  normed_update.reset(1);
  const Value update = normed_update.norm(normed_update.branch(normed_update.input(0)));
  const Value sum = normed_update.add(normed_update.input(0), update);
  normed_update.mark_update(update, sum);
  normed_update.set_outputs({sum});
  CHECK_FALSE(recompute_can_skip_branch_output(normed_update));

  const MatD x = random_matrix(5, 8, 6), dy = random_matrix(5, 8, 7);
  GraphExecutor<double> full, skipping;
  full.forward(graph, {x}, f.context);
  std::vector<MatD> outputs{full.value(graph.outputs().front())}, stats;
  full.output_norm_stats(graph, stats);
  skipping.recompute(graph, {x}, f.context, KnownOutputs<double>{&outputs, &stats});
  CHECK(skipping.skipped_branch_output());
  std::vector<MatD> d_full, d_skipping;
  full.backward(graph, {dy}, true, f.context, d_full);
  skipping.backward(graph, {dy}, true, f.context, d_skipping);
  CHECK((d_full.front() - d_skipping.front()).norm() <= 1e-12 * d_full.front().norm());
  // <dL/dF, F> from the branch's backward equals the full forward's inner product.
  const double dot = full.cotangent(graph.update_id()).cwiseProduct(full.value(graph.update_id())).sum();
  CHECK(skipping.branch_output_dots().front() == doctest::Approx(dot).epsilon(1e-12));
}

TEST_CASE("the backward to the branch's weights gives the full backward's weight gradients, bit for bit") {
  const std::vector<std::pair<SublayerKind, QkvNorm>> branches{
      {SublayerKind::attn, QkvNorm::none},
      {SublayerKind::attn, QkvNorm::per_head_qkv},
      {SublayerKind::attn, QkvNorm::full_qk},
      {SublayerKind::attn, QkvNorm::per_head_qk_unit},
      {SublayerKind::ffn, QkvNorm::none}};
  for (const auto& [kind, qkv_norm] : branches) {
    for (const Recipe recipe : {Recipe::pre_norm, Recipe::post_norm}) {
      CAPTURE(static_cast<int>(kind));
      CAPTURE(static_cast<int>(qkv_norm));
      CAPTURE(static_cast<int>(recipe));
      const Fixture f(kind);
      SublayerGraph graph;
      build(graph, recipe, qkv_norm);
      const MatD x = random_matrix(5, 8, 8), dy = random_matrix(5, 8, 9);
      GraphExecutor<double> full, partial;
      full.forward(graph, {x}, f.context);
      partial.forward(graph, {x}, f.context);
      std::vector<MatD> d_inputs;
      full.backward(graph, {dy}, true, f.context, d_inputs);
      partial.backward_to_branch_weights(graph, {dy}, f.context);
      SublayerWeights<double> from_full, from_partial;
      full.weight_gradients(graph, f.context, from_full);
      partial.weight_gradients(graph, f.context, from_partial);
      REQUIRE(from_full.matrices.size() == (kind == SublayerKind::attn ? 4u : 2u));
      REQUIRE(from_partial.matrices.size() == from_full.matrices.size());
      for (std::size_t m = 0; m < from_full.matrices.size(); ++m) {
        const MatD &expected = from_full.matrices[m], &got = from_partial.matrices[m];
        CHECK(expected.norm() > 0);
        REQUIRE(got.rows() == expected.rows());  // Eigen's == needs equal shapes
        REQUIRE(got.cols() == expected.cols());
        CHECK(got == expected);
      }
    }
  }
}

namespace {
// A learned affine y = gamma * N(x) + beta on every norm node of `graph` (per value id).
struct Affine {
  std::vector<MatD> gains, biases;
  Affine(const SublayerGraph& graph, int d, unsigned seed) {
    gains.resize(graph.value_count());
    biases.resize(graph.value_count());
    for (int id = graph.input_count(); id < graph.value_count(); ++id) {
      if (graph.nodes()[id - graph.input_count()].op != NodeOp::norm) continue;
      gains[id] = MatD::Ones(1, d) + random_matrix(1, d, seed + static_cast<unsigned>(id), 0.5);
      biases[id] = random_matrix(1, d, seed + 100 + static_cast<unsigned>(id), 0.3);
    }
  }
};
}  // namespace

TEST_CASE("learned norm gains and biases: forward gamma N(x) + beta, VJP, JVP and dL/dgamma by differences") {
  for (const NormKind norm : {NormKind::rms, NormKind::layer}) {
    for (const Recipe recipe : {Recipe::pre_norm, Recipe::post_norm}) {
      CAPTURE(static_cast<int>(norm));
      CAPTURE(static_cast<int>(recipe));
      Fixture f(SublayerKind::attn);
      f.context.norm = norm;
      SublayerGraph graph;
      build(graph, recipe);
      Affine affine(graph, 8, 7);
      BranchContext<double> context = f.context;
      context.norm_gains = &affine.gains;
      context.norm_biases = &affine.biases;
      const MatD x = random_matrix(5, 8, 2);
      const auto run = [&](const MatD& in) {
        GraphExecutor<double> executor;
        executor.forward(graph, {in}, context);
        return MatD(executor.value(graph.outputs().front()));
      };
      // The affine is applied: the post-norm output is gamma * N(x + F(x)) + beta, not N(.).
      if (recipe == Recipe::post_norm) {
        GraphExecutor<double> plain;
        plain.forward(graph, {x}, f.context);
        const int id = graph.outputs().front();
        const MatD expected = (plain.value(id).array().rowwise() * affine.gains[id].array().row(0)).matrix() +
                              affine.biases[id].replicate(5, 1);
        CHECK((run(x) - expected).cwiseAbs().maxCoeff() < 1e-14);
      }
      const auto vjp = [&](const MatD& in, const MatD& dy) {
        GraphExecutor<double> executor;
        executor.forward(graph, {in}, context);
        std::vector<MatD> dx;
        executor.backward(graph, {dy}, true, context, dx);
        return dx.front();
      };
      const auto jvp = [&](const MatD& in, const MatD& dx) {
        GraphExecutor<double> executor;
        executor.forward(graph, {in}, context);
        std::vector<MatD> dy;
        executor.jvp(graph, {dx}, context, dy);
        return dy.front();
      };
      CHECK(backward_relative_error(x, run, vjp) <= kFiniteDifferenceTolerance);
      CHECK(jvp_relative_error(x, run, jvp) <= kFiniteDifferenceTolerance);

      // dL/dgamma of L = <U, y> against central differences in each gain entry.
      const MatD probe = random_matrix(5, 8, 9);
      GraphExecutor<double> executor;
      executor.forward(graph, {x}, context);
      std::vector<MatD> dx, gradient;
      executor.backward(graph, {probe}, true, context, dx);
      executor.norm_gain_gradients(graph, gradient);
      const double h = 1e-6;
      double worst = 0;
      for (int id = graph.input_count(); id < graph.value_count(); ++id) {
        if (affine.gains[id].size() == 0) continue;
        for (Eigen::Index j = 0; j < 8; ++j) {
          const double saved = affine.gains[id](0, j);
          affine.gains[id](0, j) = saved + h;
          const double up = (probe.array() * run(x).array()).sum();
          affine.gains[id](0, j) = saved - h;
          const double down = (probe.array() * run(x).array()).sum();
          affine.gains[id](0, j) = saved;
          worst = std::max(worst, std::abs((up - down) / (2 * h) - gradient[id](0, j)) /
                                      std::max(1.0, std::abs(gradient[id](0, j))));
        }
      }
      CHECK(worst <= 1e-7);
    }
  }
}

TEST_CASE("a post-norm recompute with a learned affine runs in full and gives the forward's gradient") {
  Fixture f(SublayerKind::ffn);
  SublayerGraph graph;
  build(graph, Recipe::post_norm);
  Affine affine(graph, 8, 21);
  BranchContext<double> context = f.context;
  context.norm_gains = &affine.gains;
  context.norm_biases = &affine.biases;
  const MatD x = random_matrix(5, 8, 22), dy = random_matrix(5, 8, 23);
  GraphExecutor<double> executor;
  executor.forward(graph, {x}, context);
  const std::vector<MatD> next = {executor.value(graph.outputs().front())};
  std::vector<MatD> stats, expected, recomputed;
  executor.output_norm_stats(graph, stats);
  executor.backward(graph, {dy}, true, context, expected);
  GraphExecutor<double> again;
  again.recompute(graph, {x}, context, KnownOutputs<double>{&next, &stats});
  CHECK_FALSE(again.skipped_branch_output());
  again.backward(graph, {dy}, true, context, recomputed);
  CHECK(recomputed.front() == expected.front());
}
