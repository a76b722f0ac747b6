// Growth classes of every placement at depth 256 against its expected_growth, and against the
// families listed in architectures.md ("Closed forms"). Width 128 / seq 32 keeps this fast; the
// classes are the same as at the default width 256 / seq 64 (checked when this was written).
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"

using namespace gradflow;

TEST_CASE(
    "growth_class at depth 256 matches expected_growth for every placement, and architectures.md's "
    "families") {
  ModelConfig config;
  config.blocks = 256;
  config.width = 128;
  config.seq = 32;
  // architectures.md: bounded for post-ln, deepnorm, keel, admin, ngpt, hybridnorm; 1/2 for pre-ln,
  // peri-ln, olmo2, the d stream of resi-dual and the Y stream of siamese-norm; exactly 0 for rezero.
  const std::map<std::string, std::string> families = {
      {"post-ln", "bounded"}, {"deepnorm", "bounded"},   {"keel", "bounded"}, {"admin", "bounded"},
      {"ngpt", "bounded"},    {"hybridnorm", "bounded"}, {"pre-ln", "sqrt"},  {"peri-ln", "sqrt"},
      {"olmo2", "sqrt"},      {"rezero", "bounded"}};
  const std::map<std::string, std::pair<std::string, std::string>> stream_families = {
      {"resi-dual", {"d", "sqrt"}}, {"siamese-norm", {"Y", "sqrt"}}};
  for (const Architecture* arch_pointer : architectures()) {
    const Architecture& arch = *arch_pointer;
    const SeedResult result = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    CAPTURE(arch.id);
    CAPTURE(result.growth.exponent);
    if (arch.id == "plain") {  // no skip, no norm: the stream underflows to zeros (reported as such)
      REQUIRE(result.diverged.has_value());
      CHECK(result.diverged->phase == "underflow");
    } else {
      CHECK_FALSE(result.diverged.has_value());
    }
    CHECK(result.growth.growth_class == arch.expected_growth);
    if (const auto family = families.find(std::string(arch.id)); family != families.end()) {
      CHECK(arch.expected_growth == family->second);
    }
    if (const auto family = stream_families.find(std::string(arch.id)); family != stream_families.end()) {
      for (const StreamFigures& stream : result.streams) {
        if (stream.name == family->second.first) CHECK(stream.growth.growth_class == family->second.second);
      }
    }
    if (arch.id == "rezero")
      CHECK(std::abs(result.growth.exponent) < 1e-12);  // constant rms: 0 up to rounding
  }
}
