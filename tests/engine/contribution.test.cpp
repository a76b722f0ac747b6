// Who contributes what: output shares, the exact stream decomposition of additive placements,
// and the falling stream_share of pre-ln (issue 4, acceptance 2).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <numeric>

#include "gradflow/analysis.hpp"
#include "gradflow/statistics.hpp"

using namespace gradflow;

TEST_CASE("pre-ln: the exact decomposition shares plus the input's share sum to 1 (float64)") {
  ModelConfig config;
  config.blocks = 16;
  config.width = 32;
  config.seq = 8;
  config.precision = Precision::f64;
  const Architecture& arch = find_architecture("pre-ln");
  REQUIRE(arch.additive_stream);
  for (const std::uint64_t seed : {0u, 1u, 2u}) {
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), seed);
    const auto& shares = run.sublayers.at("stream_decomposition");
    const double total = std::accumulate(shares.begin(), shares.end(), run.stream_decomposition_input);
    CAPTURE(seed);
    CHECK(std::abs(total - 1.0) <= 1e-9);
  }
}

TEST_CASE("every placement flagged additive decomposes its final stream exactly (float64)") {
  ModelConfig config;
  config.blocks = 6;
  config.width = 16;
  config.seq = 4;
  config.precision = Precision::f64;
  config.options["rezero_alpha"] = 0.5;  // a non-trivial rezero stack
  int additive = 0;
  for (const Architecture& arch : architectures()) {
    if (!arch.additive_stream) continue;
    ++additive;
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 1);
    const auto& shares = run.sublayers.at("stream_decomposition");
    const double total = std::accumulate(shares.begin(), shares.end(), run.stream_decomposition_input);
    CAPTURE(arch.id);
    CHECK(std::abs(total - 1.0) <= 1e-9);
  }
  CHECK(additive == 7);  // pre-ln, peri-ln, olmo2, layerscale, depth-mup, lns, rezero
}

TEST_CASE("non-additive placements leave the stream decomposition empty") {
  ModelConfig config;
  config.blocks = 2;
  config.width = 16;
  config.seq = 4;
  for (const char* id : {"post-ln", "deepnorm", "keel", "plain"}) {
    const Architecture& arch = find_architecture(id);
    CHECK_FALSE(arch.additive_stream);
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    CHECK(std::isnan(run.stream_decomposition_input));
    CHECK(std::isnan(run.sublayers.at("stream_decomposition")[0]));
  }
}

TEST_CASE("output_share sums to 1, its jackknife error shrinks with probes, effective_depth lies in [1, S]") {
  ModelConfig config;
  config.blocks = 6;
  config.width = 32;
  config.seq = 8;
  const Architecture& arch = find_architecture("pre-ln");
  double mean_se[2] = {0, 0};
  int index = 0;
  for (const int probes : {8, 128}) {
    config.probes = probes;
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    const auto& share = run.sublayers.at("output_share");
    const auto& se = run.sublayers.at("output_share_se");
    CHECK(std::accumulate(share.begin(), share.end(), 0.0) == doctest::Approx(1.0).epsilon(1e-12));
    for (double s : se) mean_se[index] += s / static_cast<double>(se.size());
    CHECK(run.effective_depth >= 1.0);
    CHECK(run.effective_depth <= config.sublayers());
    ++index;
  }
  CHECK(mean_se[1] < 0.5 * mean_se[0]);  // ~ 1/sqrt(K): a 16x larger K should give ~1/4
}

TEST_CASE("pre-ln stream_share falls like l^(-1/2) at depth 256 (4 seeds, l >= S/8)") {
  const auto start = std::chrono::steady_clock::now();
  ModelConfig config;
  config.blocks = 256;
  const Architecture& arch = find_architecture("pre-ln");
  const int sublayers = config.sublayers();
  double slope_sum = 0;
  for (const std::uint64_t seed : {0u, 1u, 2u, 3u}) {
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), seed);
    const auto& share = run.sublayers.at("stream_share");
    // Sublayer l writes into a sum of l + 1 updates and the input: fit against log(l + 1).
    std::vector<double> log_l, log_share;
    for (int l = sublayers / 8; l < sublayers; ++l) {
      log_l.push_back(std::log(l + 1.0));
      log_share.push_back(std::log(share[l]));
    }
    slope_sum += fit_line(log_l, log_share).slope;
  }
  const double slope = slope_sum / 4;
  MESSAGE("fitted slope of log stream_share vs log l: "
          << slope << " (" << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
          << " s)");
  CHECK(std::abs(slope + 0.5) <= 0.1);
}
