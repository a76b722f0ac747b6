// The stack run (src/science/stack_run.cpp): its VJP and JVP of sublayer i against each other and
// against central differences of its forward. The backward pass's recompute stops before the branch's output
// projection where nothing needs it (post-norm placements): every figure must match a full recompute bit for
// bit, except the output shares, which come from <dL/dF, F> computed inside the branch instead.
#include "science/stack_run.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/graph.hpp"
#include "support/finite_difference.hpp"
#include "support/small_model.hpp"

using namespace gradflow;

namespace {
// Figures that may differ by rounding: the output shares and what is derived from them.
bool from_output_shares(const std::string& name) {
  return name.rfind("output_share", 0) == 0;
}

double worst_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max({std::abs(a[i]), std::abs(b[i]), 1e-300}));
  }
  return worst;
}
}  // namespace

TEST_CASE("skipping the branch output in the recompute changes no figure but the output shares' rounding") {
  int skipping = 0;
  for (const Architecture* arch_pointer : architectures()) {
    const Architecture& arch = *arch_pointer;
    for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::ffn}) {
      ModelConfig config;
      config.blocks = 4;
      config.width = 16;
      config.heads = 2;
      config.seq = 6;
      config.probes = 3;
      config.block = block;
      config.precision = Precision::f64;
      const Constants constants = resolve_constants(arch, config);
      const SeedResult skipped = analyze_seed(config, arch, constants, 3);
      AnalysisHooks in_full;
      in_full.recompute_in_full = true;
      const SeedResult full = analyze_seed(config, arch, constants, 3, {}, {}, in_full);
      CAPTURE(arch.id);
      CAPTURE(static_cast<int>(block));
      for (const FigureColumns* columns : {&skipped.states, &skipped.sublayers}) {
        const FigureColumns& other = columns == &skipped.states ? full.states : full.sublayers;
        REQUIRE(columns->names == other.names);
        for (std::size_t c = 0; c < columns->names.size(); ++c) {
          const std::string& name = columns->names[c];
          CAPTURE(name);
          if (from_output_shares(name)) {
            CHECK(worst_relative_difference(columns->values[c], other.values[c]) < 1e-9);
          } else {
            CHECK(std::memcmp(columns->values[c].data(), other.values[c].data(),
                              columns->values[c].size() * sizeof(double)) == 0);
          }
        }
      }
      if (!std::isnan(full.effective_depth)) {  // null for rezero: no sublayer contributes
        CHECK(std::abs(skipped.effective_depth - full.effective_depth) <=
              1e-9 * std::abs(full.effective_depth));
      }
      CHECK(std::isnan(skipped.effective_depth) == std::isnan(full.effective_depth));
      if (!arch.additive_stream) {
        SublayerGraph graph;
        graph.reset(static_cast<int>(arch.initial_streams));
        const SublayerContext ctx{config, constants, 2, 1, config.sublayer_kind(2)};
        arch.build_sublayer(graph, ctx);
        skipping += recompute_can_skip_branch_output(graph) ? 1 : 0;
      }
    }
  }
  CHECK(skipping >= 10);  // post-ln, deepnorm, keel, admin, ... do skip
}

TEST_CASE("which sublayer graphs may skip the branch output") {
  const auto build = [](const char* id) {
    ModelConfig config;
    config.blocks = 4;
    const Architecture& arch = find_architecture(id);
    const Constants constants = resolve_constants(arch, config);
    SublayerGraph graph;
    graph.reset(static_cast<int>(arch.initial_streams));
    arch.build_sublayer(graph, SublayerContext{config, constants, 3, 1, SublayerKind::ffn});
    return recompute_can_skip_branch_output(graph);
  };
  CHECK(build("post-ln"));  // x <- N(x + F(x)): the output norm's value and statistics are known
  CHECK(build("keel"));     // x <- N(a x + F(N(x)))
  CHECK(build("deepnorm"));
  CHECK_FALSE(build("peri-ln"));  // x <- x + N(F(N(x))): the inner norm needs F's value
  CHECK_FALSE(build("ngpt"));     // the update is not F or s F
}

namespace {
ModelConfig small_stack() {
  return testing::small_model(2, 8, 2, 4);
}

double dot(const std::vector<Mat<double>>& a, const std::vector<Mat<double>>& b) {
  double sum = 0;
  for (std::size_t s = 0; s < a.size(); ++s) sum += a[s].cwiseProduct(b[s]).sum();
  return sum;
}
}  // namespace

TEST_CASE(
    "StackRun: <u, J_i v> = <J_i^T u, v> at every sublayer and the head, and J_0 v matches differences") {
  using gradflow::testing::random_matrix;
  const ModelConfig config = small_stack();
  for (const char* id : {"pre-ln", "post-ln", "hybridnorm", "ngpt"}) {
    CAPTURE(id);
    const Architecture& arch = find_architecture(id);
    const Constants constants = resolve_constants(arch, config);
    StackRun<double> run(config, arch, constants, 2, {}, 1);
    const Mat<double> input = make_input<double>(config, 2);
    run.start(input);
    for (int l = 0; l < run.sublayers(); ++l) run.forward(l);
    for (int i = 0; i <= run.sublayers(); ++i) {
      CAPTURE(i);
      std::vector<Mat<double>> v, u, jv, ju;
      for (std::size_t s = 0; s < run.state(i).size(); ++s) v.push_back(random_matrix(4, 8, 10 + s));
      run.jvp(i, v, jv);
      for (std::size_t s = 0; s < jv.size(); ++s) u.push_back(random_matrix(4, 8, 20 + s));
      run.vjp(i, u, ju);
      CHECK(dot(u, jv) == doctest::Approx(dot(ju, v)).epsilon(1e-12));
    }
    // J_0 v against (x_1(x_0 + h v) - x_1(x_0 - h v)) / 2h, with v the same in every x_0 stream
    const Mat<double> direction = random_matrix(4, 8, 30);
    const double h = 1e-6;
    std::vector<Mat<double>> tangent(run.state(0).size(), direction), analytic;
    run.jvp(0, tangent, analytic);
    StackRun<double> shifted(config, arch, constants, 2, {}, 1);
    shifted.start(input + h * direction);
    shifted.forward(0);
    const std::vector<Mat<double>> up = shifted.state(1);
    shifted.start(input - h * direction);
    shifted.forward(0);
    double error = 0, norm = 0;
    for (std::size_t s = 0; s < analytic.size(); ++s) {
      error += ((up[s] - shifted.state(1)[s]) / (2 * h) - analytic[s]).squaredNorm();
      norm += analytic[s].squaredNorm();
    }
    CHECK(std::sqrt(error / norm) <= gradflow::testing::kFiniteDifferenceTolerance);
  }
}
