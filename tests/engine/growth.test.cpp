// Residual growth classes at depth 256 (default width, xavier init) match architectures.md.
#include <doctest/doctest.h>

#include "gradflow/analysis.hpp"

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
