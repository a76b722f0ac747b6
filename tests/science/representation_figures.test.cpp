// The representation module (src/science/representation_figures.cpp) on hand-made states, then
// token_cos, erank and angles end to end: properties, and rank collapse of a plain attention-only stack
// (Dong et al. 2021, arXiv 2103.03404; issue 4, acceptance 3).
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/representation.hpp"
#include "science/seed_analysis.hpp"

using namespace gradflow;

namespace gradflow {
template <typename Scalar>
void compute_representation(SeedAnalysis<Scalar>& analysis);  // registered in families.cpp
}

TEST_CASE("the representation module on one stored state: equal tokens, then orthogonal tokens") {
  ModelConfig config;
  config.blocks = 1;
  config.width = 8;
  config.seq = 4;
  config.precision = Precision::f64;
  const Architecture& arch = find_architecture("pre-ln");
  const Constants constants;
  for (const bool orthogonal : {false, true}) {
    SeedResult empty;
    empty.states = allocate_figures(config, FigureAxis::state, 3);
    empty.sublayers = allocate_figures(config, FigureAxis::sublayer, 2);
    SeedAnalysis<double> analysis(config, arch, constants, 0, {}, 1, std::move(empty));
    Mat<double> x = Mat<double>::Zero(4, 8);
    for (int t = 0; t < 4; ++t) x(t, orthogonal ? t : 0) = 1.0 + t;
    analysis.run.start(x);
    analysis.last_state = 0;  // only x_0 is stored
    compute_representation(analysis);
    const auto& token_cos = analysis.result.states.at(Figure::token_cos);
    const auto& erank = analysis.result.states.at(Figure::erank);
    CHECK(token_cos[0] == doctest::Approx(orthogonal ? 0.0 : 1.0).epsilon(1e-12));
    // singular values 1..4 (orthogonal): p_i = i / 10, erank = exp(-sum p log p)
    double entropy = 0;
    for (int i = 1; i <= 4; ++i) entropy -= i / 10.0 * std::log(i / 10.0);
    // (rank one: the zero singular values come out of the eigenvalues of the Gram matrix as
    // rounding noise, hence the looser bound)
    CHECK(erank[0] ==
          doctest::Approx(orthogonal ? std::exp(entropy) : 1.0).epsilon(orthogonal ? 1e-12 : 1e-6));
    CHECK(std::isnan(token_cos[1]));  // not reached
    CHECK(std::isnan(analysis.result.sublayers.at(Figure::angle)[0]));
  }
}

TEST_CASE(
    "plain attention-only stack: token_cos rises from ~0 to > 0.99 within 8 sublayers (default width)") {
  ModelConfig config;
  config.blocks = 8;
  config.block = BlockKind::attn;
  const Architecture& arch = find_architecture("plain");
  const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
  const auto& token_cos = run.states.at(Figure::token_cos);
  MESSAGE("plain attn token_cos by state: " << token_cos[0] << " " << token_cos[1] << " " << token_cos[2]
                                            << " " << token_cos[4] << " " << token_cos[8]);
  CHECK(std::abs(token_cos[0]) < 0.05);
  CHECK(token_cos[8] > 0.99);
  CHECK(run.states.at(Figure::erank)[8] < run.states.at(Figure::erank)[0]);
}

TEST_CASE("token_cos follows --input-corr at the input, and erank and angles have their ranges") {
  ModelConfig config;
  config.blocks = 4;
  config.seq = 32;
  config.angles_all = true;
  const Architecture& arch = find_architecture("pre-ln");
  for (const double r : {0.0, 0.5}) {
    config.input_corr = r;
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    // E cos = r norm(c)^2 / d for the shared row c: within 3 sd (sqrt(2/d) r) of r at d = 256.
    CHECK(std::abs(run.states.at(Figure::token_cos)[0] - r) <= 0.02 + 3 * std::sqrt(2.0 / config.width) * r);
    for (const double e : run.states.at(Figure::erank)) CHECK((e >= 1.0 && e <= config.seq));
    const auto& matrix = run.angles_matrix;
    REQUIRE(matrix.size() == static_cast<std::size_t>(config.sublayers() + 1));
    for (int l = 0; l < config.sublayers(); ++l) {
      CHECK(matrix[l][l] == 0.0);
      CHECK(matrix[l][l + 1] == doctest::Approx(run.sublayers.at(Figure::angle)[l]));
      CHECK(matrix[l + 1][l] == matrix[l][l + 1]);
      CHECK(run.sublayers.at(Figure::angle)[l] >= 0.0);
      CHECK(run.sublayers.at(Figure::angle)[l] <= 1.0);
    }
  }
}

TEST_CASE(
    "mean_angular_distance: exactly 0 for identical rows, 1/2 orthogonal, 1 opposite, arccos otherwise") {
  Eigen::MatrixXd u = Eigen::MatrixXd::Random(5, 7);
  u = unit_rows(u);
  CHECK(mean_angular_distance(u, u) == 0.0);
  CHECK(mean_angular_distance(u, -u) == doctest::Approx(1.0));
  Eigen::MatrixXd e1 = Eigen::MatrixXd::Zero(1, 3), e2 = Eigen::MatrixXd::Zero(1, 3);
  e1(0, 0) = 1, e2(0, 1) = 1;
  CHECK(mean_angular_distance(e1, e2) == doctest::Approx(0.5));
  const Eigen::MatrixXd v = unit_rows(Eigen::MatrixXd::Random(5, 7));
  double expected = 0;
  for (Eigen::Index t = 0; t < 5; ++t) expected += std::acos(u.row(t).dot(v.row(t)));
  CHECK(mean_angular_distance(u, v) == doctest::Approx(expected / (std::numbers::pi * 5)).epsilon(1e-12));
}

TEST_CASE("span-norm's attention sublayers leave the x stream unchanged: angle exactly 0") {
  ModelConfig config;
  config.blocks = 3;
  config.width = 32;
  config.seq = 8;
  const Architecture& arch = find_architecture("span-norm");
  const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
  for (int l = 0; l < config.sublayers(); l += 2) CHECK(run.sublayers.at(Figure::angle)[l] == 0.0);
}
