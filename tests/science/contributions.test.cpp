// Who contributes what: output shares, the exact stream decomposition of additive placements,
// and the falling stream_share of pre-ln (issue 4, acceptance 2); output_shares by hand.
#include "science/contributions.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <numeric>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
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
    const auto& shares = run.sublayers.at(Figure::stream_decomposition);
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
  for (const Architecture* arch_pointer : architectures()) {
    const Architecture& arch = *arch_pointer;
    if (!arch.additive_stream) continue;
    ++additive;
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 1);
    const auto& shares = run.sublayers.at(Figure::stream_decomposition);
    const double total = std::accumulate(shares.begin(), shares.end(), run.stream_decomposition_input);
    CAPTURE(arch.id);
    CHECK(std::abs(total - 1.0) <= 1e-9);
  }
  // pre-ln, peri-ln, olmo2, layerscale, depth-mup, lns, rezero; the shipped files denseformer and completep
  CHECK(additive == 9);
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
    CHECK(std::isnan(run.sublayers.at(Figure::stream_decomposition)[0]));
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
    const auto& share = run.sublayers.at(Figure::output_share);
    const auto& se = run.sublayers.at(Figure::output_share_se);
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
    const auto& share = run.sublayers.at(Figure::stream_share);
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

// output_shares on hand-made contributions (src/science/contributions.cpp), without a run.
TEST_CASE("output_shares: probe-RMS shares, effective depth and jackknife by hand") {
  SeedResult result;
  result.sublayers.add(Figure::output_share, 2);
  result.sublayers.add(Figure::output_share_se, 2);
  // |c| = [[1, 1], [3, 3]] (S = 2, K = 2): R = [1, 3], shares [1/4, 3/4], each probe alike so se = 0.
  output_shares({0.0, 0.0, std::log(3.0), std::log(3.0)}, 2, 2, result);
  CHECK(result.sublayers.at(Figure::output_share)[0] == doctest::Approx(0.25).epsilon(1e-15));
  CHECK(result.sublayers.at(Figure::output_share)[1] == doctest::Approx(0.75).epsilon(1e-15));
  CHECK(result.effective_depth == doctest::Approx(1.0 / (0.0625 + 0.5625)).epsilon(1e-15));
  CHECK(std::abs(result.sublayers.at(Figure::output_share_se)[0]) < 1e-15);
  // |c| = [[1, 3], [1, 1]]: R = [sqrt(5), 1]; without probe 0 the shares are [3/4, 1/4], without
  // probe 1 [1/2, 1/2]: jackknife se = sqrt((K-1)/K * sum (s - mean)^2) = sqrt(1/2 * 2 * 0.125^2).
  output_shares({0.0, std::log(3.0), 0.0, 0.0}, 2, 2, result);
  CHECK(result.sublayers.at(Figure::output_share)[0] ==
        doctest::Approx(std::sqrt(5.0) / (std::sqrt(5.0) + 1.0)).epsilon(1e-14));
  CHECK(result.sublayers.at(Figure::output_share_se)[0] == doctest::Approx(0.125).epsilon(1e-14));
  CHECK(result.sublayers.at(Figure::output_share_se)[1] == doctest::Approx(0.125).epsilon(1e-14));
}

TEST_CASE("output_shares leaves the shares null when a contribution is missing") {
  SeedResult result;
  result.sublayers.add(Figure::output_share, 2);
  result.sublayers.add(Figure::output_share_se, 2);
  output_shares({0.0, std::nan(""), 0.0, 0.0}, 2, 2, result);
  CHECK(std::isnan(result.sublayers.at(Figure::output_share)[0]));
  CHECK(std::isnan(result.effective_depth));
}
