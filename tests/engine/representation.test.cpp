// token_cos, erank and angles: properties, and rank collapse of a plain attention-only stack
// (Dong et al. 2021, arXiv 2103.03404; issue 4, acceptance 3).
#include <doctest/doctest.h>

#include <cmath>

#include "gradflow/analysis.hpp"

using namespace gradflow;

TEST_CASE(
    "plain attention-only stack: token_cos rises from ~0 to > 0.99 within 8 sublayers (default width)") {
  ModelConfig config;
  config.blocks = 8;
  config.block = BlockKind::attn;
  const Architecture& arch = find_architecture("plain");
  const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
  const auto& token_cos = run.states.at("token_cos");
  MESSAGE("plain attn token_cos by state: " << token_cos[0] << " " << token_cos[1] << " " << token_cos[2]
                                            << " " << token_cos[4] << " " << token_cos[8]);
  CHECK(std::abs(token_cos[0]) < 0.05);
  CHECK(token_cos[8] > 0.99);
  CHECK(run.states.at("erank")[8] < run.states.at("erank")[0]);
}

TEST_CASE("token_cos follows --input-corr at the input; erank and angles have their ranges") {
  ModelConfig config;
  config.blocks = 4;
  config.seq = 32;
  config.angles_all = true;
  const Architecture& arch = find_architecture("pre-ln");
  for (const double r : {0.0, 0.5}) {
    config.input_corr = r;
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    // E cos = r norm(c)^2 / d for the shared row c: within 3 sd (sqrt(2/d) r) of r at d = 256.
    CHECK(std::abs(run.states.at("token_cos")[0] - r) <= 0.02 + 3 * std::sqrt(2.0 / config.width) * r);
    for (const double e : run.states.at("erank")) CHECK((e >= 1.0 && e <= config.seq));
    const auto& matrix = run.angles_matrix;
    REQUIRE(matrix.size() == static_cast<std::size_t>(config.sublayers() + 1));
    for (int l = 0; l < config.sublayers(); ++l) {
      CHECK(matrix[l][l] == 0.0);
      CHECK(matrix[l][l + 1] == doctest::Approx(run.sublayers.at("angle")[l]));
      CHECK(matrix[l + 1][l] == matrix[l][l + 1]);
      CHECK(run.sublayers.at("angle")[l] >= 0.0);
      CHECK(run.sublayers.at("angle")[l] <= 1.0);
    }
  }
}
