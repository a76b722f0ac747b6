// Estimators of the Jacobian product J_{l->out} against the exact one (--exact-jacobian): the
// K-probe Frobenius estimate and --spectrum's top-k singular values (issue 4, acceptance 1).
#include <doctest/doctest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/errors.hpp"
#include "support/small_model.hpp"

using namespace gradflow;

namespace {
ModelConfig tiny_config() {
  ModelConfig config = testing::small_model(3, 8, 2, 4);
  config.exact_jacobian = true;
  return config;
}
}  // namespace

TEST_CASE("the 64-probe Frobenius estimate is within 3 standard errors of the exact norm at every state") {
  for (const char* id : {"pre-ln", "post-ln", "deepnorm", "keel", "plain"}) {
    ModelConfig config = tiny_config();
    config.probes = 64;
    const Architecture& arch = find_architecture(id);
    const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 0);
    const auto& estimate = run.states.at(Figure::log10_grad);
    const auto& se = run.states.at(Figure::log10_grad_se);
    const auto& exact = run.states.at(Figure::log10_jacobian_fro_exact);
    for (std::size_t l = 0; l < exact.size(); ++l) {
      CAPTURE(id);
      CAPTURE(l);
      CAPTURE(estimate[l]);
      CAPTURE(exact[l]);
      CHECK(se[l] > 0);
      CHECK(std::abs(estimate[l] - exact[l]) <= 3 * se[l]);
    }
  }
}

TEST_CASE("--spectrum 4 matches the exact top-4 singular values to 1e-3 relative (float64)") {
  for (const char* id : {"pre-ln", "post-ln", "deepnorm", "keel", "plain"}) {
    for (const BlockKind block : {BlockKind::attn_ffn, BlockKind::attn}) {
      ModelConfig config = tiny_config();
      config.block = block;
      config.spectrum = 4;
      const Architecture& arch = find_architecture(id);
      const SeedResult run = analyze_seed(config, arch, resolve_constants(arch, config), 1);
      const auto& spectral = run.states.at(Figure::log10_jacobian_spectral_exact);
      for (int i = 1; i <= 4; ++i) {
        const auto& estimate = run.states.at({Figure::log10_singular_value, i});
        const auto& exact = run.states.at({Figure::log10_singular_value_exact, i});
        for (std::size_t l = 0; l < exact.size(); ++l) {
          CAPTURE(id);
          CAPTURE(to_string(block));
          CAPTURE(i);
          CAPTURE(l);
          CHECK(std::abs(std::pow(10.0, estimate[l] - exact[l]) - 1.0) <= 1e-3);
          if (i == 1) CHECK(exact[l] == doctest::Approx(spectral[l]));
        }
      }
    }
  }
}

TEST_CASE("--spectrum's progress reaches its total only when the run is done (issue 21)") {
  ModelConfig config = tiny_config();
  config.exact_jacobian = false;
  config.spectrum = 2;
  const Architecture& arch = find_architecture("keel");
  std::vector<std::pair<long long, long long>> calls;
  analyze_seed(config, arch, resolve_constants(arch, config), 0, {},
               [&](long long done, long long total) { calls.emplace_back(done, total); });
  const long long sublayers = config.sublayers();
  REQUIRE(!calls.empty());
  CHECK(calls.back().first == calls.back().second);  // 100% at the very end
  CHECK(calls.back().second == analysis_work_units(config));
  int spectrum_calls = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (i + 1 < calls.size()) CHECK(calls[i].first < calls[i].second);  // never 100% before the end
    if (i > 0) CHECK(calls[i].first > calls[i - 1].first);
    spectrum_calls += calls[i].first > 2 * sublayers;
  }
  CHECK(spectrum_calls == sublayers + 1);  // one per state of the subspace iteration
}

TEST_CASE("--exact-jacobian refuses configurations above its limit with an InputError") {
  ModelConfig config = tiny_config();
  config.seq = 64;
  config.width = 256;
  CHECK_THROWS_AS(validate(config), InputError);
  config.exact_jacobian = false;
  config.spectrum = kSpectrumMaxColumns + 1;
  CHECK_THROWS_AS(validate(config), InputError);
  config.spectrum = 0;
  config.blocks = kAnglesMaxSublayers;  // 2 sublayers per block
  config.angles_all = true;
  CHECK_THROWS_AS(validate(config), InputError);
}
