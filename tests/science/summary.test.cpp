// The summary (src/science/summary.cpp): by hand on made-up columns, and the residual growth
// classes at depth 256 (default width, xavier init) against architectures.md.
#include "science/summary.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"

using namespace gradflow;

TEST_CASE("growth_class at depth 256: sqrt for pre-ln, bounded for post-ln, deepnorm and keel") {
  ModelConfig config;
  config.blocks = 256;
  for (const auto& [id, expected] : {std::pair{"pre-ln", "sqrt"}, std::pair{"post-ln", "bounded"},
                                     std::pair{"deepnorm", "bounded"}, std::pair{"keel", "bounded"}}) {
    const Architecture& arch = find_architecture(id);
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    CAPTURE(id);
    CAPTURE(run.growth.exponent);
    CHECK(run.growth.growth_class == expected);
    CHECK(arch.expected_growth == expected);
    if (std::string_view(id) == "pre-ln") CHECK(std::abs(run.growth.exponent - 0.5) < 0.1);
  }
}

TEST_CASE("summarize_figures: relative gradients, the ratio and the finite gains' extrema by hand") {
  SeedResult result;
  result.states.add(Figure::rms, 4) = {1.0, 2.0, 3.0, 4.0};
  result.states.add(Figure::log10_grad, 4) = {3.0, 2.5, 1.0, 0.5};
  result.states.add(Figure::log10_grad_rel, 4);
  result.sublayers.add(Figure::gain, 3) = {0.5, std::nan(""), 2.0};
  summarize_figures(result);
  CHECK(result.states.at(Figure::log10_grad_rel) == std::vector<double>{2.5, 2.0, 0.5, 0.0});
  CHECK(result.log10_grad_ratio == 2.5);
  CHECK(result.gain_min.value == 0.5);
  CHECK(result.gain_min.sublayer == 0);
  CHECK(result.gain_max.value == 2.0);
  CHECK(result.gain_max.sublayer == 2);
  CHECK(result.growth.exponent == fit_growth(result.states.at(Figure::rms)).exponent);
}
